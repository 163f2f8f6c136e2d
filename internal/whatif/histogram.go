package whatif

import (
	"math"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// quantile returns the q-quantile of a cumulative histogram in milliseconds, interpolating
// linearly inside the bucket as PromQL's histogram_quantile does (the first bucket starts at 0;
// a rank in the +Inf bucket gives the highest finite bound). NaN when the histogram is empty.
// Measured and simulated latencies both go through it, so the model check compares like with
// like, bucket for bucket.
func quantile(h sim.Histogram, q float64) float64 {
	total := h.Count()
	if total <= 0 || len(h.BoundsMS) < 2 {
		return math.NaN()
	}
	return rankValue(h, q*total)
}

// rankValue is the latency at a (fractional) rank of the cumulative histogram.
func rankValue(h sim.Histogram, rank float64) float64 {
	n := len(h.BoundsMS)
	for i, c := range h.Cumulative {
		if c < rank {
			continue
		}
		if math.IsInf(h.BoundsMS[i], 1) {
			return h.BoundsMS[n-2]
		}
		lower, below := 0.0, 0.0
		if i > 0 {
			lower, below = h.BoundsMS[i-1], h.Cumulative[i-1]
		}
		if c == below {
			return h.BoundsMS[i]
		}
		return lower + (h.BoundsMS[i]-lower)*(rank-below)/(c-below)
	}
	return h.BoundsMS[n-2]
}

// quantileBand returns the q-quantile's plausible range given the sample size: the latencies at
// the ranks two standard deviations either side of q·n (the rank of a sample quantile has a
// binomial spread of √(n·q·(1−q))). Two runs of the same system differ by about this much.
func quantileBand(h sim.Histogram, q float64) (lo, hi float64) {
	n := h.Count()
	if n <= 0 {
		return math.NaN(), math.NaN()
	}
	sd := math.Sqrt(n * q * (1 - q))
	return rankValue(h, math.Max(1, q*n-2*sd)), rankValue(h, math.Min(n, q*n+2*sd))
}

// mean is the histogram's mean in milliseconds, NaN without observations or without a sum.
func mean(h sim.Histogram) float64 {
	if h.Count() <= 0 || h.SumMS <= 0 {
		return math.NaN()
	}
	return h.SumMS / h.Count()
}

// bucketCounts turns a cumulative histogram into per-bucket counts.
func bucketCounts(h sim.Histogram) []float64 {
	out := make([]float64, len(h.Cumulative))
	prev := 0.0
	for i, c := range h.Cumulative {
		out[i] = math.Max(0, c-prev)
		prev = c
	}
	return out
}
