package sim

import (
	"math"
	"math/rand"
	"testing"
)

func TestLatencySketch_PercentilesWithinHalfAPercentOfExactSorting(t *testing.T) {
	cases := map[string]func(r *rand.Rand) float32{
		"lognormal latencies around 20 ms with a heavy tail": func(r *rand.Rand) float32 {
			return float32(math.Exp(3 + 1.2*r.NormFloat64()))
		},
		"exponential latencies of mean 3 ms": func(r *rand.Rand) float32 { return float32(3 * r.ExpFloat64()) },
		"a few distinct values, many ties":   func(r *rand.Rand) float32 { return float32(1 + r.Intn(5)) },
		"sub-millisecond to minutes":         func(r *rand.Rand) float32 { return float32(math.Pow(10, -1+6*r.Float64())) },
	}
	for name, draw := range cases {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewSource(7))
			for _, n := range []int{1, 2, 7, 100, 12345, 200000} {
				xs := make([]float32, n)
				var h latencySketch
				for i := range xs {
					xs[i] = draw(r)
					h.add(xs[i])
				}
				exact, got := percentiles(xs), h.percentiles()
				for _, q := range []struct {
					name      string
					got, want float64
				}{{"p50", got.P50, exact.P50}, {"p90", got.P90, exact.P90}, {"p95", got.P95, exact.P95}, {"p99", got.P99, exact.P99}, {"p99.9", got.P999, exact.P999}} {
					if rel := math.Abs(q.got-q.want) / q.want; rel > 0.005 {
						t.Errorf("n=%d %s = %v, exact %v: relative error %.3f%% > 0.5%%", n, q.name, q.got, q.want, 100*rel)
					}
				}
				if rel := math.Abs(got.Mean-exact.Mean) / exact.Mean; rel > 1e-9 {
					t.Errorf("n=%d mean = %v, exact %v", n, got.Mean, exact.Mean)
				}
			}
		})
	}
}

func TestLatencySketch_EmptyAndResetGiveZero(t *testing.T) {
	var h latencySketch
	if got := h.percentiles(); got != (Percentiles{}) {
		t.Fatalf("empty sketch gave %+v", got)
	}
	h.add(12)
	h.reset()
	if got := h.percentiles(); got != (Percentiles{}) || h.n != 0 {
		t.Fatalf("reset sketch gave %+v, n=%d", got, h.n)
	}
	h.add(5)
	if got := h.quantile(0.99); got != 5 {
		t.Fatalf("one sample of 5 ms gave p99 %v", got)
	}
}

func TestSketchIndex_BucketsAreOrderedAndMidpointsInside(t *testing.T) {
	prev := -1
	for v := float32(0.001); v < 1e7; v *= 1.0013 {
		i := sketchIndex(v)
		if i < prev {
			t.Fatalf("bucket of %v is %d, below the %d of a smaller value", v, i, prev)
		}
		prev = i
		if mid := sketchMid(i); math.Abs(mid-float64(v))/float64(v) > 1.0/256 {
			t.Fatalf("%v lands in bucket %d whose middle %v is more than half a bucket away", v, i, mid)
		}
	}
}

// TestMergeSketches_EqualsOneSketchOfEveryLatency fills per-pod sketches, some left empty, and
// checks that their merge is exactly the sketch that recording every latency in one gives.
func TestMergeSketches_EqualsOneSketchOfEveryLatency(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	pods := make([]latencySketch, 6)
	var whole latencySketch
	for range 50000 {
		pod := r.Intn(len(pods))
		if pod == 2 || pod == 4 {
			continue // pods that served nothing after warm-up
		}
		ms := float32(math.Exp(2 + float64(pod)/2 + r.NormFloat64()))
		pods[pod].add(ms)
		whole.add(ms)
	}
	merged := mergeSketches(pods, whole.sum)
	if merged.n != whole.n || merged.min != whole.min || merged.max != whole.max || merged.sum != whole.sum {
		t.Fatalf("merged n=%d min=%v max=%v sum=%v, want n=%d min=%v max=%v sum=%v",
			merged.n, merged.min, merged.max, merged.sum, whole.n, whole.min, whole.max, whole.sum)
	}
	for i := range whole.counts {
		if merged.counts[i] != whole.counts[i] {
			t.Fatalf("bucket %d: merged count %d, want %d", i, merged.counts[i], whole.counts[i])
		}
	}
	if got, want := merged.percentiles(), whole.percentiles(); got != want {
		t.Fatalf("merged percentiles %+v, want %+v", got, want)
	}
	if empty := mergeSketches(make([]latencySketch, 3), 0); empty.n != 0 || empty.percentiles() != (Percentiles{}) {
		t.Fatalf("merge of empty sketches: n=%d, percentiles %+v; want none", empty.n, empty.percentiles())
	}
}
