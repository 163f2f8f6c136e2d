package sim

import (
	"math"
	"slices"
	"testing"
)

func TestLatencyHistogram_QuantileInterpolatesLikeHistogramQuantile(t *testing.T) {
	var before, h latencyHistogram
	h.observe(3) // an observation from before the window
	before = h
	for range 90 {
		h.observe(7) // (5, 10] bucket
	}
	for range 10 {
		h.observe(40) // (25, 50] bucket
	}
	// rank 99 of 100: the 9th of 10 observations in (25, 50] → 25 + 25 × 9/10 = 47.5 ms.
	if got := h.quantileSince(&before, 0.99); math.Abs(got-0.0475) > 1e-9 {
		t.Errorf("p99 = %v s, want 0.0475", got)
	}
	// rank 50: the 50th of 90 in (5, 10] → 5 + 5 × 50/90.
	if got, want := h.quantileSince(&before, 0.5), (5+5*50.0/90)/1000; math.Abs(got-want) > 1e-9 {
		t.Errorf("p50 = %v s, want %v", got, want)
	}
	if got := before.quantileSince(&before, 0.99); got != 0 {
		t.Errorf("an empty window gave %v, want 0", got)
	}
	var huge latencyHistogram
	huge.observe(1e9) // beyond the last bound: +Inf bucket
	if got := huge.quantileSince(&latencyHistogram{}, 0.99); got != 3600 {
		t.Errorf("+Inf bucket gave %v s, want the highest finite bound 3600", got)
	}
}

// TestIstioBucket_MatchesBinarySearch checks the table lookup against the plain search at and
// around every whole millisecond it covers, every bound, and beyond the table.
func TestIstioBucket_MatchesBinarySearch(t *testing.T) {
	var probes []float64
	for k := 0; k <= istioTableMS+2; k++ {
		f := float64(k)
		probes = append(probes, f, math.Nextafter(f, 0), math.Nextafter(f, math.Inf(1)), f+0.5)
	}
	for _, b := range istioBucketsMS {
		probes = append(probes, b, math.Nextafter(b, 0), math.Nextafter(b, math.Inf(1)))
	}
	probes = append(probes, -1, 0.25, 1e-9, 4e6, math.Inf(1))
	for _, ms := range probes {
		want, _ := slices.BinarySearch(istioBucketsMS[:], ms)
		if got := istioBucket(ms); got != want {
			t.Errorf("istioBucket(%v) = %d, want %d (first bound >= ms)", ms, got, want)
		}
	}
}
