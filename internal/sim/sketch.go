package sim

import "math"

// latencySketch counts latencies (ms) in buckets 1/128 of a power of two wide, read straight
// from the bits of the float32: a percentile read from it is within 0.4% of the exact one (half
// a bucket), and recording a latency costs a shift instead of a share of a sort. The mean is
// kept exactly.
type latencySketch struct {
	counts   []uint32
	n        uint64
	sum      float64
	min, max float32
}

const (
	sketchSubBits = 7   // mantissa bits kept: 128 buckets per octave
	sketchMinExp  = -10 // 2^-10 ms, about 1 µs: everything below shares the first bucket
	sketchMaxExp  = 24  // 2^25 ms, about 9 h: everything above shares the last bucket
	sketchBuckets = (sketchMaxExp - sketchMinExp + 1) << sketchSubBits
)

// sketchIndex is the bucket of ms: the float32's exponent and its top sketchSubBits mantissa
// bits, offset to start at sketchMinExp.
func sketchIndex(ms float32) int {
	bits := math.Float32bits(ms)
	exp := int(bits>>23) - 127
	switch {
	case ms <= 0 || exp < sketchMinExp:
		return 0
	case exp > sketchMaxExp:
		return sketchBuckets - 1
	}
	return (exp-sketchMinExp)<<sketchSubBits | int(bits>>(23-sketchSubBits))&(1<<sketchSubBits-1)
}

// sketchMid is the middle of bucket i.
func sketchMid(i int) float64 {
	exp := i>>sketchSubBits + sketchMinExp
	frac := float64(i&(1<<sketchSubBits-1)) + 0.5
	return math.Ldexp(1+frac/(1<<sketchSubBits), exp)
}

func (h *latencySketch) add(ms float32) { h.addAt(sketchIndex(ms), ms) }

// addAt records ms, whose bucket i = sketchIndex(ms) the caller has already worked out (one
// response is recorded in up to three sketches).
func (h *latencySketch) addAt(i int, ms float32) {
	if h.counts == nil {
		h.counts = make([]uint32, sketchBuckets)
	}
	if h.n == 0 || ms < h.min {
		h.min = ms
	}
	if h.n == 0 || ms > h.max {
		h.max = ms
	}
	h.counts[i]++
	h.n++
	h.sum += float64(ms)
}

// mergeSketches returns the sketch that recording every latency of the sketches in one would
// give, with sum as its sum (a sum of sums in another order could differ in its last bits).
func mergeSketches(sketches []latencySketch, sum float64) latencySketch {
	merged := latencySketch{counts: make([]uint32, sketchBuckets), sum: sum}
	for i := range sketches {
		h := &sketches[i]
		if h.n == 0 {
			continue
		}
		if merged.n == 0 || h.min < merged.min {
			merged.min = h.min
		}
		if merged.n == 0 || h.max > merged.max {
			merged.max = h.max
		}
		merged.n += h.n
		for b, c := range h.counts {
			merged.counts[b] += c
		}
	}
	return merged
}

func (h *latencySketch) reset() {
	clear(h.counts)
	h.n, h.sum, h.min, h.max = 0, 0, 0, 0
}

// quantile returns the nearest-rank q-quantile (what load generators report): the middle of the
// bucket holding it, kept within the exact minimum and maximum.
func (h *latencySketch) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var below uint64
	for i, c := range h.counts {
		below += uint64(c)
		if below >= rank {
			return math.Min(math.Max(sketchMid(i), float64(h.min)), float64(h.max))
		}
	}
	return float64(h.max)
}

func (h *latencySketch) percentiles() Percentiles {
	if h.n == 0 {
		return Percentiles{}
	}
	return Percentiles{P50: h.quantile(0.5), P90: h.quantile(0.9), P95: h.quantile(0.95), P99: h.quantile(0.99), P999: h.quantile(0.999), Mean: h.sum / float64(h.n)}
}
