package sim

import (
	"math"
	"math/rand"
	"testing"
)

func TestORCAWeight_FormulaBlackoutAndExpiry(t *testing.T) {
	h := orcaHost{qps: 200, utilization: 0.5, eps: 10, nonEmptySince: 100, lastUpdate: 130}
	cases := map[string]struct {
		now  float64
		host orcaHost
		want float64
	}{
		"inside the 10 s blackout after the first report": {now: 105, host: h, want: 0},
		// weight = qps / (utilization + penalty × eps/qps) = 200 / (0.5 + 0 × 10/200): Istio's
		// backendUtilization sends an error penalty of 0, so errors do not lower a weight.
		"after the blackout: qps over utilization, errors not penalised as Istio configures it": {now: 131, host: h, want: 200 / 0.5},
		"no report for more than 3 minutes: expired":                                            {now: 130 + 181, host: h, want: 0},
		"never reported": {now: 500, host: orcaHost{nonEmptySince: -1}, want: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := orcaWeight(tc.host, tc.now); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("weight %v, want %v", got, tc.want)
			}
		})
	}
	if got := orcaWeights([]float64{400, 0, 100, 200}); got[1] != 200 {
		t.Fatalf("a host without a weight gets the median of the valid ones: %v", got)
	}
	if got := orcaWeights([]float64{0, 0}); got[0] != 1 || got[1] != 1 {
		t.Fatalf("no valid weight at all: equal weights, got %v", got)
	}
}

func TestPeakEWMA_PeaksAtOnceDecaysSlowlyAndPicksTheCheaperOfTwo(t *testing.T) {
	var p peakEWMA
	p.observe(0, 0, 0.010)
	p.observe(0, 1, 0.050) // a slower sample replaces the estimate at once
	if p.ewma[0] != 0.050 {
		t.Fatalf("peak not taken: %v", p.ewma[0])
	}
	p.observe(0, 11, 0.010) // 10 s later (one time constant) a fast sample pulls it down partway
	want := 0.050*math.Exp(-1) + 0.010*(1-math.Exp(-1))
	if math.Abs(p.ewma[0]-want) > 1e-12 {
		t.Fatalf("ewma %v, want %v", p.ewma[0], want)
	}
	// cost = decayed estimate × (active + 1): host 1 is faster but has 9 requests in flight.
	p.observe(1, 11, 0.005)
	active := []int32{0, 9}
	if c0, c1 := p.cost(0, 11, active[0]), p.cost(1, 11, active[1]); !(c0 < c1) {
		t.Fatalf("costs %v, %v: ten requests of 5 ms must cost more than one of 25 ms", c0, c1)
	}
	r := rand.New(rand.NewSource(1))
	zero := 0
	for i := 0; i < 10000; i++ {
		if p.pick([]int32{0, 1}, active, 11, r) == 1 {
			zero++
		}
	}
	if share := float64(zero) / 10000; math.Abs(share-0.25) > 0.02 {
		t.Fatalf("the costlier host won %.3f of the picks, want 0.25 (both choices on it)", share)
	}
}

func TestPrequal_HotColdRule(t *testing.T) {
	alive := func(int32) bool { return true }
	cases := map[string]struct {
		probes []prequalProbe
		want   int32
	}{
		"among cold replicas the lowest latency wins": {
			probes: []prequalProbe{{pod: 1, rif: 2, latency: 0.020}, {pod: 2, rif: 2, latency: 0.008}, {pod: 3, rif: 1, latency: 0.030}},
			want:   2,
		},
		"a hot replica is skipped even with the lowest latency": {
			// RIFs 1,1,1,1,1,9: the 0.84 quantile is 1, so the replica with 9 in flight is hot.
			probes: []prequalProbe{{pod: 1, rif: 1, latency: 0.02}, {pod: 2, rif: 1, latency: 0.03}, {pod: 3, rif: 1, latency: 0.04},
				{pod: 4, rif: 1, latency: 0.05}, {pod: 5, rif: 1, latency: 0.06}, {pod: 6, rif: 9, latency: 0.001}},
			want: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := prequalPool{probes: append([]prequalProbe(nil), tc.probes...)}
			got, ok := q.pick(0, alive)
			if !ok || got != tc.want {
				t.Fatalf("picked %d (ok %v), want %d", got, ok, tc.want)
			}
		})
	}
	// Probes age out and are reused a bounded number of times.
	q := prequalPool{probes: []prequalProbe{{pod: 1, at: 0}}}
	if _, ok := q.pick(prequalMaxAge+0.1, alive); ok {
		t.Fatal("a probe older than the maximum age was used")
	}
	q = prequalPool{probes: []prequalProbe{{pod: 1, at: 0}}}
	for i := 0; i < prequalReuse; i++ {
		if _, ok := q.pick(0, alive); !ok {
			t.Fatalf("use %d of a fresh probe refused", i+1)
		}
	}
	if _, ok := q.pick(0, alive); ok {
		t.Fatal("a probe was reused beyond its budget")
	}
}

// A Prequal probe reports the latency a request arriving now would see: the recent median at the
// pod's current requests-in-flight. A pod that was busy and is now idle must look fast again;
// reporting its busy past made every client avoid it and then herd onto it.
func TestPrequal_LatencyEstimateFollowsTheCurrentRIF(t *testing.T) {
	p := &pod{workers: 4}
	for range 8 {
		p.recordRIFLatency(0, 0.010) // alone: 10 ms
		p.recordRIFLatency(30, 2.0)  // behind a queue of 30: 2 s
	}
	if got := p.estimateLatency(); got != 0.010 {
		t.Errorf("idle pod reports %v s, want its RIF-0 latency 0.010", got)
	}
	p.queue = make([]int32, 29)
	p.running = []inService{{id: 1}}
	if got := p.estimateLatency(); got != 2.0 {
		t.Errorf("pod with 30 in flight reports %v s, want 2.0", got)
	}
	p.queue = p.queue[:4] // RIF 5: no samples there, the nearest level with samples is RIF 0
	if got := p.estimateLatency(); got != 0.010 {
		t.Errorf("pod at RIF 5 reports %v s, want the nearest level's 0.010", got)
	}
	if got := (&pod{}).estimateLatency(); got != 0 {
		t.Errorf("a pod that completed nothing reports %v, want 0", got)
	}
}
