package metrics

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// histogramQueryName names the latency histogram query in Batch.Queries and in the source's
// own metrics.
const histogramQueryName = "latencyHistogram"

// podHistograms is the latency histogram query's result split by pod, indexed by the cycle's
// pod slots like podValues. Bounds arrive in milliseconds (Istio's le) and are kept in seconds.
type podHistograms struct {
	index   *podIndex
	buckets [][]LatencyBucket
	// faults holds why a pod's histogram is unusable: two series for one bound (the query is
	// not aggregated by pod and le), a bound that is not a number, a non-finite count.
	faults map[int32]error
	// unlabelled counts series without the namespace or pod label.
	unlabelled int
}

func newPodHistograms(index *podIndex) podHistograms {
	return podHistograms{index: index, buckets: make([][]LatencyBucket, index.size())}
}

// add records one bucket series of a pod.
func (h *podHistograms) add(ns, pod, le string, count float64) {
	if ns == "" || pod == "" {
		h.unlabelled++
		return
	}
	slot, ok := h.index.slot(ns, pod)
	if !ok {
		return
	}
	if int(slot) >= len(h.buckets) { // an open index grew
		h.buckets = append(h.buckets, make([][]LatencyBucket, max(int(slot)+1, 2*len(h.buckets))-len(h.buckets))...)
	}
	if _, bad := h.faults[slot]; bad {
		return
	}
	fault := func(err error) {
		if h.faults == nil {
			h.faults = map[int32]error{}
		}
		h.faults[slot] = err
		h.buckets[slot] = nil
	}
	boundMillis, err := strconv.ParseFloat(le, 64)
	switch {
	case le == "" || err != nil && !math.IsInf(boundMillis, 1):
		fault(fmt.Errorf("%w: pod %s/%s: latency histogram series with le=%q, want a number of milliseconds; aggregate by (namespace, pod, le)", ErrMalformedResponse, ns, pod, le))
		return
	case math.IsNaN(count) || math.IsInf(count, 0):
		fault(&NonFiniteValueError{Namespace: ns, Pod: pod, Value: count})
		return
	}
	bound := boundMillis / 1000
	for _, b := range h.buckets[slot] {
		if b.UpperBoundSeconds == bound {
			fault(&DuplicateSeriesError{Namespace: ns, Pod: pod, Series: []string{fmt.Sprintf("le=%q (twice)", le)}})
			return
		}
	}
	h.buckets[slot] = append(h.buckets[slot], LatencyBucket{UpperBoundSeconds: bound, Count: count})
}

// at returns the pod's buckets sorted by bound, or why there are none.
func (h *podHistograms) at(slot int32, key podKey) ([]LatencyBucket, error) {
	if err, bad := h.faults[slot]; bad {
		return nil, err
	}
	if int(slot) >= len(h.buckets) || len(h.buckets[slot]) == 0 {
		return nil, &NoDataError{Namespace: key.namespace, Pod: key.name}
	}
	b := h.buckets[slot]
	slices.SortFunc(b, func(x, y LatencyBucket) int { return cmpFloat(x.UpperBoundSeconds, y.UpperBoundSeconds) })
	return b, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
