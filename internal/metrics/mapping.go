package metrics

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/common/model"
)

// podKey identifies a pod across query results.
type podKey struct{ namespace, name string }

// podIndex numbers a cycle's pods once, so that each query's result is a dense array indexed by
// slot rather than a map keyed by two strings: at 200,000 pods and six queries, the per-series
// cost is one lookup of the decoded labels and the per-pod mapping is plain indexing.
type podIndex struct {
	slots map[string]map[string]int32 // namespace → pod name → slot
	keys  []podKey                    // slot → pod
	// open is discover mode: a series of an unknown pod gets a new slot. The queries of a cycle
	// decode concurrently, so an open index is guarded by mu; a closed one is read-only.
	open bool
	mu   sync.Mutex
}

// newPodIndex indexes the requested pods; a pod listed twice gets one slot. It returns each
// request entry's slot.
func newPodIndex(pods []Pod) (*podIndex, []int32) {
	x := &podIndex{slots: map[string]map[string]int32{}, keys: make([]podKey, 0, len(pods))}
	slotOf := make([]int32, len(pods))
	for i, p := range pods {
		names := x.slots[p.Namespace]
		if names == nil {
			names = map[string]int32{}
			x.slots[p.Namespace] = names
		}
		slot, ok := names[p.Name]
		if !ok {
			slot = int32(len(x.keys))
			names[p.Name] = slot
			x.keys = append(x.keys, podKey{p.Namespace, p.Name})
		}
		slotOf[i] = slot
	}
	return x, slotOf
}

// newOpenPodIndex starts an empty index that admits every pod it is asked about.
func newOpenPodIndex() *podIndex {
	return &podIndex{slots: map[string]map[string]int32{}, open: true}
}

// slot returns the pod's slot, adding the pod when the index is open. ok is false for a pod
// outside a closed index.
func (x *podIndex) slot(ns, pod string) (int32, bool) {
	if x.open {
		x.mu.Lock()
		defer x.mu.Unlock()
	}
	names := x.slots[ns]
	if slot, ok := names[pod]; ok {
		return slot, true
	}
	if !x.open {
		return -1, false
	}
	if names == nil {
		names = map[string]int32{}
		x.slots[ns] = names
	}
	slot := int32(len(x.keys))
	names[pod] = slot
	x.keys = append(x.keys, podKey{ns, pod})
	return slot, true
}

// size is the number of slots.
func (x *podIndex) size() int {
	if x.open {
		x.mu.Lock()
		defer x.mu.Unlock()
	}
	return len(x.keys)
}

// slotState says what one query returned for one pod.
type slotState uint8

const (
	slotEmpty     slotState = iota // no series
	slotValue                      // exactly one series
	slotDuplicate                  // several series: the pod has no usable value
)

// podValues is one query result split by pod, indexed by the cycle's pod slots.
type podValues struct {
	index  *podIndex
	labels Labels
	values []float64
	state  []slotState
	// others holds, for a pod with one series, the series' labels besides namespace and pod, when
	// it has any (an aggregated query has none). It only serves to name duplicates.
	others     map[int32]model.Metric
	duplicates map[int32]*DuplicateSeriesError
	// unlabelled counts series without the namespace or pod label; they cannot be attributed.
	unlabelled int
}

func newPodValues(index *podIndex, labels Labels) podValues {
	n := index.size()
	return podValues{index: index, labels: labels, values: make([]float64, n), state: make([]slotState, n)}
}

// add records one series. A pod with several series is marked duplicate and never summed: two
// scrapes of one pod would otherwise double its rate.
func (p *podValues) add(ns, pod string, value float64, others model.Metric) {
	if ns == "" || pod == "" {
		p.unlabelled++
		return
	}
	slot, ok := p.index.slot(ns, pod)
	if !ok {
		return // a pod the cycle did not ask about (another pod of the same namespaces)
	}
	if int(slot) >= len(p.state) { // an open index grew
		n := max(int(slot)+1, 2*len(p.state))
		p.values = append(p.values, make([]float64, n-len(p.values))...)
		p.state = append(p.state, make([]slotState, n-len(p.state))...)
	}
	key := podKey{ns, pod}
	switch p.state[slot] {
	case slotEmpty:
		p.values[slot], p.state[slot] = value, slotValue
		if others != nil {
			if p.others == nil {
				p.others = map[int32]model.Metric{}
			}
			p.others[slot] = others
		}
	case slotValue:
		if p.duplicates == nil {
			p.duplicates = map[int32]*DuplicateSeriesError{}
		}
		p.duplicates[slot] = &DuplicateSeriesError{Namespace: ns, Pod: pod, Series: []string{p.labelSet(key, p.others[slot]), p.labelSet(key, others)}}
		p.state[slot] = slotDuplicate
		delete(p.others, slot)
	case slotDuplicate:
		dup := p.duplicates[slot]
		dup.Series = append(dup.Series, p.labelSet(key, others))
	}
}

// labelSet renders a series' full label set, as PromQL would print it.
func (p *podValues) labelSet(key podKey, others model.Metric) string {
	m := make(model.Metric, len(others)+2)
	for k, v := range others {
		m[k] = v
	}
	m[model.LabelName(p.labels.Namespace)] = model.LabelValue(key.namespace)
	m[model.LabelName(p.labels.Pod)] = model.LabelValue(key.name)
	return m.String()
}

// pods counts the pods with exactly one series or with duplicates.
func (p *podValues) pods() int {
	n := 0
	for _, s := range p.state {
		if s != slotEmpty {
			n++
		}
	}
	return n
}

// has reports whether the query returned any series for the slot.
func (p *podValues) has(slot int32) bool {
	return int(slot) < len(p.state) && p.state[slot] != slotEmpty
}

// valueAt returns the slot's single value; ok is false for no series or duplicates.
func (p *podValues) valueAt(slot int32) (float64, bool) {
	if int(slot) >= len(p.state) || p.state[slot] != slotValue {
		return 0, false
	}
	return p.values[slot], true
}

// valueSample turns a pod's entry of a value query into a Sample (without freshness yet).
func (p *podValues) valueSample(slot int32, key podKey) Sample {
	if int(slot) < len(p.state) && p.state[slot] == slotDuplicate {
		return Sample{Err: p.duplicates[slot]}
	}
	v, ok := p.valueAt(slot)
	if !ok {
		return Sample{Err: &NoDataError{Namespace: key.namespace, Pod: key.name}}
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return Sample{Value: v, Err: &NonFiniteValueError{Namespace: key.namespace, Pod: key.name, Value: v}}
	}
	return Sample{Value: v, Present: true}
}

// applyFreshness sets Timestamp and Fresh on a present sample from the freshness probe's result
// (values are Unix seconds). probe is nil when the signal has no probe: the value is then taken as
// fresh at now. probeErr is the probe query's failure, if any.
func applyFreshness(s Sample, slot int32, key podKey, probe *podValues, probeErr error, now time.Time, interval time.Duration) Sample {
	if !s.Present {
		return s
	}
	threshold := 2 * interval
	switch {
	case probeErr != nil:
		s.Err = fmt.Errorf("freshness unknown: %w", probeErr)
		return s
	case probe == nil:
		s.Timestamp, s.Fresh = now, true
		return s
	}
	ts, ok := probe.valueAt(slot)
	if !ok || math.IsNaN(ts) || math.IsInf(ts, 0) {
		s.Err = &StaleError{Namespace: key.namespace, Pod: key.name, Threshold: threshold, Unknown: true}
		return s
	}
	s.Timestamp = unixSeconds(ts)
	if age := now.Sub(s.Timestamp); age > threshold {
		s.Err = &StaleError{Namespace: key.namespace, Pod: key.name, Age: age, Threshold: threshold}
		return s
	}
	s.Fresh = true
	return s
}

func unixSeconds(f float64) time.Time {
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(math.Round(frac*1e3))*int64(time.Millisecond)).UTC()
}
