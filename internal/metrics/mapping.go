package metrics

import (
	"fmt"
	"math"
	"time"

	"github.com/prometheus/common/model"
)

// podKey identifies a pod across query results.
type podKey struct{ namespace, name string }

type podValue struct {
	value  float64
	metric model.Metric
}

// podValues is one query result split by pod.
type podValues struct {
	values map[podKey]podValue
	// duplicates holds pods with more than one series; they have no entry in values.
	duplicates map[podKey]*DuplicateSeriesError
	// unlabelled counts series without the namespace or pod label; they cannot be attributed.
	unlabelled int
}

// splitByPod indexes a vector by the pod labels. A pod with several series is moved to duplicates
// and never summed: two scrapes of one pod would otherwise double its rate.
func splitByPod(vec model.Vector, labels Labels) podValues {
	nsLabel, podLabel := model.LabelName(labels.Namespace), model.LabelName(labels.Pod)
	out := podValues{values: make(map[podKey]podValue, len(vec))}
	for _, s := range vec {
		ns, pod := string(s.Metric[nsLabel]), string(s.Metric[podLabel])
		if ns == "" || pod == "" {
			out.unlabelled++
			continue
		}
		key := podKey{ns, pod}
		if dup, ok := out.duplicates[key]; ok {
			dup.Series = append(dup.Series, s.Metric.String())
			continue
		}
		if first, ok := out.values[key]; ok {
			if out.duplicates == nil {
				out.duplicates = map[podKey]*DuplicateSeriesError{}
			}
			out.duplicates[key] = &DuplicateSeriesError{Namespace: ns, Pod: pod, Series: []string{first.metric.String(), s.Metric.String()}}
			delete(out.values, key)
			continue
		}
		out.values[key] = podValue{value: float64(s.Value), metric: s.Metric}
	}
	return out
}

// valueSample turns a pod's entry of a value query into a Sample (without freshness yet).
func (p podValues) valueSample(key podKey) Sample {
	if dup, ok := p.duplicates[key]; ok {
		return Sample{Err: dup}
	}
	v, ok := p.values[key]
	if !ok {
		return Sample{Err: &NoDataError{Namespace: key.namespace, Pod: key.name}}
	}
	if math.IsNaN(v.value) || math.IsInf(v.value, 0) {
		return Sample{Value: v.value, Err: &NonFiniteValueError{Namespace: key.namespace, Pod: key.name, Value: v.value}}
	}
	return Sample{Value: v.value, Present: true}
}

// applyFreshness sets Timestamp and Fresh on a present sample from the freshness probe's result
// (values are Unix seconds). probe is nil when the signal has no probe: the value is then taken as
// fresh at now. probeErr is the probe query's failure, if any.
func applyFreshness(s Sample, key podKey, probe *podValues, probeErr error, now time.Time, interval time.Duration) Sample {
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
	ts, ok := probe.values[key]
	if !ok || math.IsNaN(ts.value) || math.IsInf(ts.value, 0) {
		s.Err = &StaleError{Namespace: key.namespace, Pod: key.name, Threshold: threshold, Unknown: true}
		return s
	}
	s.Timestamp = unixSeconds(ts.value)
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
