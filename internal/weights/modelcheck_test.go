package weights

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// hotFleet is twelve pods in two hardware classes, each with a 2-core limit on an 8-core node,
// after the tail split loaded the fast class near its limit: six fast pods at 5 ms per request
// serving 390 rps each (98% of their limit, a p99 of 200 ms: 40 times their cost) and six slow
// pods at 10 ms serving 150 rps each (75%, a p99 of 30 ms: 3 times their cost). The weights are
// the ones that produced that split.
func hotFleet() []Endpoint {
	var eps []Endpoint
	for i := 0; i < 6; i++ {
		eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 390*0.005, 390, 2, 200, onNode(8), withP99(0.2)))
	}
	for i := 0; i < 6; i++ {
		eps = append(eps, ep(fmt.Sprintf("slow-%d", i), 150*0.010, 150, 2, 50, onNode(8), withP99(0.03)))
	}
	return eps
}

func onNode(cores float64) func(*Endpoint) { return func(e *Endpoint) { e.NodeCPUCores = cores } }

func fleetShare(d Decision, prefix string) float64 {
	var total, part float64
	for _, r := range d.Endpoints {
		total += float64(r.Weight)
		if strings.HasPrefix(r.ID, prefix) {
			part += float64(r.Weight)
		}
	}
	return part / total
}

func TestTail_AGroupTheWeightsLoadedToItsLimitIsRelievedAtOnce(t *testing.T) {
	eps := hotFleet()
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 3240}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.ModelOverruled == "" || !strings.Contains(d.ModelOverruled, "98% of its CPU limit") {
		t.Fatalf("ModelOverruled = %q, want the fast group named at 98%% of its CPU limit", d.ModelOverruled)
	}
	if !d.Changed {
		t.Fatal("the relief must be written")
	}
	if d.ModelDistrust != 1 {
		t.Fatalf("ModelDistrust = %v, want 1 after a group was found at its limit", d.ModelDistrust)
	}
	// Before: the fast class holds 200/(200+50) = 80% of the weight. The capacity split gives it
	// two thirds of the traffic.
	if got := fleetShare(d, "fast-"); got > 0.7 {
		t.Fatalf("fast class keeps %.2f of the weight, want it moved to the capacity split (about 0.67): %v", got, weightsOf(d))
	}
	if !strings.Contains(d.Reason, "model overruled") {
		t.Fatalf("Reason = %q, want it to say the model was overruled", d.Reason)
	}
}

func TestTail_AHotGroupIsRelievedEvenInAWindowThatStraddlesAWrite(t *testing.T) {
	// Half the window under the current weights: any other correction waits for a clean window,
	// but a group at its limit must not.
	d, err := Compute(Input{Endpoints: hotFleet(), WindowSeconds: 60, WindowCoverage: 0.5, RecentPeakRequestRate: 3240}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.ModelOverruled == "" || !d.Changed {
		t.Fatalf("ModelOverruled = %q, Changed = %v: want the relief written at once", d.ModelOverruled, d.Changed)
	}
}

func TestTail_AHotGroupIsNotRelievedTwiceFromWindowsThatStraddleTheRelief(t *testing.T) {
	// The relief was written and the model is fully distrusted; the next window mixes the old
	// weights with the new. It shows nothing new about the split in force, so it must not move
	// the weights again.
	eps := hotFleet()
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 0.5, RecentPeakRequestRate: 3240, ModelDistrust: 1}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed || d.ModelOverruled != "" {
		t.Fatalf("Changed = %v, ModelOverruled = %q: a window straddling the relief must hold", d.Changed, d.ModelOverruled)
	}
	if d.ModelDistrust != 1 {
		t.Fatalf("ModelDistrust = %v, want it kept at 1", d.ModelDistrust)
	}
}

func TestTail_AGroupNearItsLimitWhoseLatencyHasNotRisenIsLeftThere(t *testing.T) {
	// The fast class at 92% of its limit, but its p99 is 4 times its cost, against 2.5 times for
	// the slow class at 86%: small, even requests queue little even there.
	var eps []Endpoint
	for i := 0; i < 6; i++ {
		eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 368*0.005, 368, 2, 150, onNode(8), withP99(0.02)))
		eps = append(eps, ep(fmt.Sprintf("slow-%d", i), 172*0.010, 172, 2, 68, onNode(8), withP99(0.025)))
	}
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 3240}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.ModelOverruled, "CPU limit") {
		t.Fatalf("ModelOverruled = %q: a group near its limit without a risen latency is not hot", d.ModelOverruled)
	}
}

func TestTail_AGroupAtItsLimitWhenEveryGroupIsThereIsNotTheWeightsDoing(t *testing.T) {
	// The whole fleet at 96%: no group is loaded beyond the others, so the model is not to blame.
	var eps []Endpoint
	for i := 0; i < 6; i++ {
		eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 384*0.005, 384, 2, 200, onNode(8), withP99(0.2)))
		eps = append(eps, ep(fmt.Sprintf("slow-%d", i), 192*0.010, 192, 2, 100, onNode(8), withP99(0.4)))
	}
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 3456}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.ModelOverruled != "" {
		t.Fatalf("ModelOverruled = %q, want no overrule when every group is equally loaded", d.ModelOverruled)
	}
}

func TestTail_DistrustFadesOverWindowsThatAgreeWithTheModel(t *testing.T) {
	// A calm fleet at 40% load under the capacity split, one cycle after an overrule.
	distrust := 1.0
	s := DefaultSettings(AlgorithmTail)
	for cycle := 1; cycle <= 4; cycle++ {
		var eps []Endpoint
		for i := 0; i < 6; i++ {
			eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 160*0.005, 160, 2, 200, onNode(8)))
			eps = append(eps, ep(fmt.Sprintf("slow-%d", i), 80*0.010, 80, 2, 100, onNode(8)))
		}
		d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 1440, ModelDistrust: distrust}, s)
		if err != nil {
			t.Fatal(err)
		}
		if want := 1 - 0.25*float64(cycle); math.Abs(d.ModelDistrust-want) > 1e-9 {
			t.Fatalf("cycle %d: ModelDistrust = %v, want %v", cycle, d.ModelDistrust, want)
		}
		distrust = d.ModelDistrust
	}
}

func TestTail_NeverPlansAGroupAboveItsUtilizationCap(t *testing.T) {
	// Whatever the histograms make of the model's load axis (a calibrated scale below 1 says a
	// pod queues less than the model at the same load), the plan never loads any group above
	// MaxUtilization of its measured capacity at the planning load, unless the whole fleet must
	// run above it, or beyond explorationStep past the utilization the group was measured at
	// (scaled to the planning load), and never above maxModelUtilization. Random fleets of two to
	// four classes, with histograms light enough to fit scales below 1.
	defer func(n int) { modelSamples = n; clearModelCache() }(modelSamples)
	clearModelCache()
	modelSamples = 3000 // the bound does not depend on the model's accuracy
	s := DefaultSettings(AlgorithmTail)
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 40; trial++ {
		classes := 2 + rng.Intn(3)
		var eps []Endpoint
		var fleetCapacity float64
		for c := 0; c < classes; c++ {
			cost := []float64{0.002, 0.003, 0.0045, 0.006}[rng.Intn(4)]
			rate := (0.2 + 0.7*rng.Float64()) * 2 / cost
			for i := 0; i < 1+rng.Intn(5); i++ {
				e := ep(fmt.Sprintf("c%d-%d", c, i), rate*cost, rate, 2, 100, onNode(8))
				// Everything within twice the cost: a histogram of an idle pod.
				n := rate * 60
				e.LatencyBuckets = []LatencyBucket{{UpperBoundSeconds: 2 * cost, Count: 0.9 * n}, {UpperBoundSeconds: 10 * cost, Count: n}, {UpperBoundSeconds: math.Inf(1), Count: n}}
				eps = append(eps, e)
				fleetCapacity += 2 / cost
			}
		}
		var total float64
		for _, e := range eps {
			total += e.RequestRate
		}
		ok := make([]bool, len(eps))
		for i := range ok {
			ok[i] = true
		}
		in := Input{Endpoints: eps, WindowSeconds: 60, RecentPeakRequestRate: total}
		_, shares, _, found := tailShares(in, ok, func(e Endpoint) float64 { return e.CPULimitCores }, total, s)
		if !found {
			continue
		}
		load := planningLoad(in, total, s)
		allowed := math.Max(s.Tail.MaxUtilization, math.Min(maxModelUtilization, load/fleetCapacity))
		for i, e := range eps {
			capacity := 2 / (e.CPUCores / e.RequestRate)
			measured := e.CPUCores / 2 * load / total
			cap := math.Max(allowed, math.Min(measured+explorationStep, maxModelUtilization))
			if u := shares[i] * load / capacity; u > cap+1e-6 {
				t.Fatalf("trial %d: %s planned at %.2f of its capacity at the planning load, above the cap %.2f", trial, e.ID, u, cap)
			}
		}
	}
}

func TestTail_ATailTheModelCannotExplainOverrulesIt(t *testing.T) {
	// A calm fleet, but the slow class, loaded a little above the fleet's mean, reports 10% of its
	// requests slower than 250 ms: far more than any calibration of its model explains at 50% of
	// its limit.
	var eps []Endpoint
	for i := 0; i < 6; i++ {
		eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 160*0.005, 160, 2, 200, onNode(8)))
	}
	for i := 0; i < 6; i++ {
		e := ep(fmt.Sprintf("slow-%d", i), 100*0.010, 100, 2, 100, onNode(8))
		n := 100.0 * 60
		e.LatencyBuckets = []LatencyBucket{{UpperBoundSeconds: 0.01, Count: 0.5 * n}, {UpperBoundSeconds: 0.025, Count: 0.8 * n}, {UpperBoundSeconds: 0.05, Count: 0.85 * n}, {UpperBoundSeconds: 0.1, Count: 0.88 * n}, {UpperBoundSeconds: 0.25, Count: 0.9 * n}, {UpperBoundSeconds: 1, Count: n}, {UpperBoundSeconds: math.Inf(1), Count: n}}
		eps = append(eps, e)
	}
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 1560}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.ModelOverruled, "costing 10ms") || !strings.Contains(d.ModelOverruled, "slower than") {
		t.Fatalf("ModelOverruled = %q, want the slow group's unexplained tail named", d.ModelOverruled)
	}
	if d.ModelDistrust != mispredictionDistrust {
		t.Fatalf("ModelDistrust = %v, want %v", d.ModelDistrust, mispredictionDistrust)
	}
}

func TestTail_AHistogramTheModelPredictsDoesNotOverruleIt(t *testing.T) {
	// Each group's histogram is exactly what its model predicts at the load it carries: no
	// bound may count as unexplained, at any load up to the utilization cap.
	const cost = 0.005
	bounds := []float64{0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	for _, u := range []float64{0.2, 0.5, 0.7, 0.85} {
		for _, cv := range modelCVs {
			m := modelFor(newModelKey(8, 2, cost, cv))
			rate := u * 2 / cost
			n := rate * 60
			var buckets []LatencyBucket
			for _, ub := range bounds {
				buckets = append(buckets, LatencyBucket{UpperBoundSeconds: ub, Count: n * (1 - m.tail(ub/cost, u))})
			}
			buckets = append(buckets, LatencyBucket{UpperBoundSeconds: math.Inf(1), Count: n})
			var eps []Endpoint
			for i := 0; i < 4; i++ {
				e := ep(fmt.Sprintf("p-%d", i), rate*cost, rate, 2, 100, onNode(8))
				e.LatencyBuckets = buckets
				eps = append(eps, e)
			}
			groups := groupEndpoints(eps, []bool{true, true, true, true}, func(e Endpoint) float64 { return e.CPULimitCores })
			if v := checkModel(eps, groups, func(e Endpoint) float64 { return e.CPULimitCores }); v.mispredicted || v.hot {
				t.Fatalf("u=%.2f cv=%.1f: verdict %+v, want the model's own histogram accepted", u, cv, v)
			}
		}
	}
}

func TestJudgeModel(t *testing.T) {
	hot := modelVerdict{hot: true}
	mis := modelVerdict{mispredicted: true}
	calm := modelVerdict{}
	for _, tc := range []struct {
		name            string
		previous        float64
		v               modelVerdict
		settled         bool
		coverage        float64
		distrust        float64
		overrule, reset bool
	}{
		{"a hot group the model trusted resets to the capacity split", 0, hot, true, 1, 1, true, true},
		{"a hot group in a straddling window is relieved at once", 0.25, hot, false, 0.6, 1, true, true},
		{"a hot group in a window mostly before the last write waits", 0.25, hot, false, 0.3, 0.25, false, false},
		{"a hot group after the reset, in a clean window, is corrected past the dead band", 1, hot, true, 1, 1, true, false},
		{"a hot group after the reset, in a straddling window, waits", 1, hot, false, 0.6, 1, false, false},
		{"an unexplained tail adds distrust", 0, mis, true, 1, 0.5, true, false},
		{"an unexplained tail at full distrust changes nothing", 1, mis, true, 1, 1, false, false},
		{"an unexplained tail in a straddling window is no evidence", 0, mis, false, 0.6, 0, false, false},
		{"a clean window that agrees takes distrust away", 0.5, calm, true, 1, 0.25, false, false},
		{"a straddling window that agrees changes nothing", 0.5, calm, false, 0.6, 0.5, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, o, r := judgeModel(tc.previous, tc.v, tc.settled, tc.coverage)
			if d != tc.distrust || o != tc.overrule || r != tc.reset {
				t.Fatalf("judgeModel = (%v, %v, %v), want (%v, %v, %v)", d, o, r, tc.distrust, tc.overrule, tc.reset)
			}
		})
	}
}

func TestProjectRequestRate(t *testing.T) {
	ramp := []RateSample{{EndSeconds: 0, Rate: 1000}, {EndSeconds: 30, Rate: 1250}, {EndSeconds: 60, Rate: 1500}}
	for _, tc := range []struct {
		name    string
		samples []RateSample
		horizon float64
		want    float64
	}{
		{"a steady ramp is extrapolated along its slope", ramp, 60, 2000},
		{"no horizon is the latest rate", ramp, 0, 1500},
		{"a projection never passes twice the latest rate", ramp, 600, 3000},
		{"a falling rate projects to the latest", []RateSample{{0, 1500}, {30, 1250}, {60, 1000}}, 60, 1000},
		{"one sample is unknown", ramp[:1], 60, 0},
		{"samples at one instant are unknown", []RateSample{{10, 1000}, {10, 1200}}, 60, 0},
		{"a NaN rate is unknown", []RateSample{{0, 1000}, {30, math.NaN()}}, 60, 0},
		{"a negative horizon is unknown", ramp, -1, 0},
		// The operator passes Unix seconds: their squares must not swallow the slope.
		{"wall-clock times fit like small ones", []RateSample{{1.7941e9, 1000}, {1.7941e9 + 30, 1250}, {1.7941e9 + 60, 1500}}, 60, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProjectRequestRate(tc.samples, tc.horizon); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("ProjectRequestRate = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTail_PlansForTheProjectedRate(t *testing.T) {
	s := noSurgeBound()
	now, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	// The same window, but the rate is rising: by the time these weights are replaced, the
	// Service will serve 3,000 rps. The fast pods must not be planned for 1,500.
	rising, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500, ProjectedRequestRate: 3000}, s)
	if err != nil {
		t.Fatal(err)
	}
	if n, r := shareOf(now, "fast-0"), shareOf(rising, "fast-0"); r >= n {
		t.Fatalf("fast pod's share %.3f planning for the projected rate, %.3f without; want less", r, n)
	}
}

// A re-plan after endpoints left goes to the target shares without hysteresis; with the model
// distrusted it goes to the blend toward the capacity split, not back to the model's optimum.
func TestTail_AReplanKeepsTheModelsDistrust(t *testing.T) {
	s := noSurgeBound()
	in := Input{Endpoints: seedFleet(100), WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 1500, Replan: true}
	trusted, err := Compute(in, s)
	if err != nil {
		t.Fatal(err)
	}
	in.ModelDistrust = 1
	distrusted, err := Compute(in, s)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := 3*shareOf(trusted, "fast-0"), 3*shareOf(distrusted, "fast-0"); !(b < a-0.05) {
		t.Fatalf("fast pods' share %.3f in a re-plan with the model distrusted, %.3f trusted: want the distrusted one nearer the capacity split", b, a)
	}
}
