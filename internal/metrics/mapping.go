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
	value float64
	// others holds the series' labels besides namespace and pod, nil when it has none (the usual
	// case of a query aggregated by namespace and pod). It only serves to name duplicates.
	others model.Metric
}

// podValues is one query result split by pod.
type podValues struct {
	values map[podKey]podValue
	// duplicates holds pods with more than one series; they have no entry in values.
	duplicates map[podKey]*DuplicateSeriesError
	// unlabelled counts series without the namespace or pod label; they cannot be attributed.
	unlabelled int
	labels     Labels
}

// add records one series. A pod with several series is moved to duplicates and never summed:
// two scrapes of one pod would otherwise double its rate.
func (p *podValues) add(ns, pod string, value float64, others model.Metric) {
	if ns == "" || pod == "" {
		p.unlabelled++
		return
	}
	key := podKey{ns, pod}
	if dup, ok := p.duplicates[key]; ok {
		dup.Series = append(dup.Series, p.labelSet(key, others))
		return
	}
	if first, ok := p.values[key]; ok {
		if p.duplicates == nil {
			p.duplicates = map[podKey]*DuplicateSeriesError{}
		}
		p.duplicates[key] = &DuplicateSeriesError{Namespace: ns, Pod: pod, Series: []string{p.labelSet(key, first.others), p.labelSet(key, others)}}
		delete(p.values, key)
		return
	}
	p.values[key] = podValue{value: value, others: others}
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
