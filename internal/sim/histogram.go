package sim

import (
	"math"
	"slices"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// istioBucketsMS are the upper bounds of Istio's istio_request_duration_milliseconds histogram
// (its default buckets). The controller sees a pod's p99 the way the operator does: through
// histogram_quantile over these buckets, not from exact latencies.
var istioBucketsMS = [...]float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

// latencyHistogram holds cumulative counts per bucket; the last entry is the +Inf bucket.
type latencyHistogram [len(istioBucketsMS) + 1]uint64

func (h *latencyHistogram) observe(ms float64) { h[istioBucket(ms)]++ }

// istioBucket is the index of the first bound >= ms (Prometheus's le). Every bound above 1 ms
// is a whole number, so from 1 ms to the table's end the bucket of ms is that of ⌈ms⌉, read
// from a table instead of searched; a latency is observed for every request.
func istioBucket(ms float64) int {
	switch {
	case ms <= 0.5:
		return 0
	case ms <= 1:
		return 1
	case ms <= istioTableMS:
		k := int(ms) // ms > 1, so this truncation is its floor
		if float64(k) < ms {
			k++
		}
		return int(istioBucketTable[k])
	}
	i, _ := slices.BinarySearch(istioBucketsMS[:], ms)
	return i
}

// istioTableMS is the last whole millisecond istioBucketTable covers.
const istioTableMS = 1000

// istioBucketTable holds, for each whole millisecond k up to istioTableMS, the first bound >= k.
var istioBucketTable = func() (t [istioTableMS + 1]uint8) {
	for k := range t {
		i, _ := slices.BinarySearch(istioBucketsMS[:], float64(k))
		t[k] = uint8(i)
	}
	return t
}()

// quantileSince returns the q-quantile in seconds of the observations made between an earlier
// snapshot and h, interpolating linearly inside the bucket as histogram_quantile does. It returns
// 0 when nothing was observed, and the highest finite bound for the +Inf bucket.
func (h *latencyHistogram) quantileSince(earlier *latencyHistogram, q float64) float64 {
	var counts latencyHistogram
	var total uint64
	for i := range h {
		counts[i] = h[i] - earlier[i]
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var below uint64
	for i, c := range counts {
		if float64(below+c) >= rank && c > 0 {
			if i == len(istioBucketsMS) {
				return istioBucketsMS[len(istioBucketsMS)-1] / 1000
			}
			lower := 0.0
			if i > 0 {
				lower = istioBucketsMS[i-1]
			}
			upper := istioBucketsMS[i]
			return (lower + (upper-lower)*(rank-float64(below))/float64(c)) / 1000
		}
		below += c
	}
	return istioBucketsMS[len(istioBucketsMS)-1] / 1000
}

// bucketsSince returns the observations made between an earlier snapshot and h as cumulative
// buckets in seconds, ending with +Inf: what increase() over the bucket series gives the operator.
func (h *latencyHistogram) bucketsSince(earlier *latencyHistogram) []weights.LatencyBucket {
	out := make([]weights.LatencyBucket, len(h))
	var cum uint64
	for i := range h {
		cum += h[i] - earlier[i]
		bound := math.Inf(1)
		if i < len(istioBucketsMS) {
			bound = istioBucketsMS[i] / 1000
		}
		out[i] = weights.LatencyBucket{UpperBoundSeconds: bound, Count: float64(cum)}
	}
	return out
}
