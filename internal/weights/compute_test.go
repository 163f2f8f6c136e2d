package weights

import (
	"math"
	"math/rand"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func cpuDistance(k float64) Settings {
	s := DefaultSettings(AlgorithmCPUDistance)
	s.CPUDistance.K = k
	return s
}

func TestCompute_CPUDistanceMatchesPublishedFormula(t *testing.T) {
	cases := map[string]struct {
		settings  Settings
		endpoints []Endpoint
		want      []int
	}{
		"at the published k of 1% the weights move by half a percent of the distance": {
			settings: cpuDistance(0.01),
			// mean cpu 2.0: distances -0.5, 0, +0.5; alpha = -0.005, (dead band), +0.005.
			endpoints: []Endpoint{ep("a", 1, 100, 0, 350), ep("b", 2, 100, 0, 350), ep("c", 3, 100, 0, 350)},
			want:      []int{352, 350, 348}, // 351.75, 350, 348.25; median already 350
		},
		"a larger k moves weights further and the median stays at mid-range": {
			settings:  cpuDistance(0.5),
			endpoints: []Endpoint{ep("a", 1, 100, 0, 350), ep("b", 2, 100, 0, 350), ep("c", 3, 100, 0, 350)},
			want:      []int{438, 350, 263}, // 437.5, 350, 262.5
		},
		"weights are rescaled so that the median sits at (min+max)/2": {
			settings: cpuDistance(0.01),
			// Equal CPU: every endpoint inside the dead band, only the rescale acts: factor 350/500.
			endpoints: []Endpoint{ep("a", 1, 100, 0, 500), ep("b", 1, 100, 0, 500), ep("c", 1, 100, 0, 200)},
			want:      []int{350, 350, 140},
		},
		"a weight is clamped at max before the rescale": {
			settings: cpuDistance(1),
			// mean 1.0: a is at -0.9 → 600*1.9 clamped to 600; b,c at +0.45 → 300*0.55 = 165.
			endpoints: []Endpoint{ep("a", 0.1, 100, 0, 600), ep("b", 1.45, 100, 0, 300), ep("c", 1.45, 100, 0, 300)},
			// median 165 → factor 350/165: a = 1272 clamped to 600, b = c = 350.
			want: []int{600, 350, 350},
		},
		"an endpoint without metrics gets the median weight": {
			settings:  cpuDistance(0.01),
			endpoints: []Endpoint{ep("a", 1, 100, 0, 350), ep("b", 1, 100, 0, 350), ep("c", 0, 0, 0, 120, noMetrics)},
			want:      []int{350, 350, 350},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := Compute(Input{Endpoints: tc.endpoints}, tc.settings)
			if err != nil {
				t.Fatal(err)
			}
			if got := weightsOf(d); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("weights = %v, want %v (reasons %+v)", got, tc.want, d.Endpoints)
			}
		})
	}
}

// planAsSeen is the capacity default with the load planned as observed, so that hand-computed
// square-root splits apply directly.
func planAsSeen() Settings {
	s := DefaultSettings(AlgorithmCapacity)
	s.Capacity.PlanningLoadFactor = 1
	return s
}

func TestCompute_CapacityFirstStepSplitsLoadByTheSquareRootRule(t *testing.T) {
	// Equal weights, 400 rps each, limit 2: capacities μ = 900, 900, 400, 400 rps (CPU 0.889 and
	// 2.0). Load Λ = 1600, Σμ = 2600, Σ√μ = 100, so c = (2600−1600)/100 = 10 and the target rates
	// μ − c√μ are 600, 600, 200, 200: shares 3:3:1:1. The median of the log shares maps to 100,
	// so the weights are 100·√3 and 100/√3.
	eps := []Endpoint{
		ep("a", 800.0/900, 400, 2, 1),
		ep("b", 800.0/900, 400, 2, 1),
		ep("c", 2.0, 400, 2, 1),
		ep("d", 2.0, 400, 2, 1),
	}
	d, err := Compute(Input{Endpoints: eps}, planAsSeen())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := weightsOf(d), []int{173, 173, 58, 58}; !reflect.DeepEqual(got, want) {
		t.Fatalf("weights = %v, want %v", got, want)
	}
	if !d.Changed {
		t.Fatal("first step from equal weights must be a change")
	}
	for _, r := range d.Endpoints {
		if r.Reason != ReasonCapacity {
			t.Fatalf("endpoint %s reason %q, want %q", r.ID, r.Reason, ReasonCapacity)
		}
	}
}

func TestTargetShares(t *testing.T) {
	ok := []bool{true, true, true, true}
	cases := map[string]struct {
		capacity []float64
		load     float64
		want     []float64
	}{
		"moderate load: fast endpoints get more than their capacity share": {
			capacity: []float64{900, 900, 400, 400}, load: 1600, want: []float64{0.375, 0.375, 0.125, 0.125},
		},
		"full load: shares proportional to capacity": {
			capacity: []float64{900, 900, 400, 400}, load: 2600, want: []float64{900.0 / 2600, 900.0 / 2600, 400.0 / 2600, 400.0 / 2600},
		},
		"overload: still proportional": {
			capacity: []float64{900, 900, 400, 400}, load: 5000, want: []float64{900.0 / 2600, 900.0 / 2600, 400.0 / 2600, 400.0 / 2600},
		},
		"equal capacities: equal shares at any load": {
			capacity: []float64{300, 300, 300, 300}, load: 100, want: []float64{0.25, 0.25, 0.25, 0.25},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := targetShares(tc.capacity, ok, tc.load)
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("shares = %v, want %v", got, tc.want)
				}
			}
		})
	}
	// Light load: the slow endpoints' rate would be negative; they keep a trickle, never zero.
	got := targetShares([]float64{900, 900, 400, 400}, ok, 100)
	if got[2] <= 0 || got[2] > 0.01 {
		t.Fatalf("light load: slow share %v, want a small positive trickle", got[2])
	}
}

func TestCompute_CapacityUsesMedianLimitWhenNoneIsSet(t *testing.T) {
	// b has no limit: it is treated as having the fleet's median limit (2), so its capacity equals a's.
	eps := []Endpoint{ep("a", 0.1, 100, 2, 1), ep("b", 0.1, 100, 0, 1), ep("c", 0.2, 100, 2, 1)}
	d, err := Compute(Input{Endpoints: eps}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	w := weightsOf(d)
	if w[0] != w[1] || w[2] >= w[0] {
		t.Fatalf("weights = %v: want a == b > c", w)
	}
}

func TestCompute_CapacityFeedbackMovesWeightAgainstHighUtilization(t *testing.T) {
	// Already adapted weights; c runs hotter (utilization 0.8) than the fleet, so it must lose weight
	// and the others gain, with the median held at 100.
	eps := []Endpoint{
		ep("a", 0.8, 200, 2, 120),
		ep("b", 0.8, 200, 2, 100),
		ep("c", 1.6, 200, 2, 80),
	}
	d, err := Compute(Input{Endpoints: eps}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	w := weightsOf(d)
	if !(w[2] < 80) {
		t.Fatalf("hot endpoint weight %d, want below its current 80 (all %v)", w[2], w)
	}
	if w[1] != 100 {
		t.Fatalf("median endpoint weight %d, want 100 (all %v)", w[1], w)
	}
	if d.Endpoints[2].Reason != ReasonUtilization {
		t.Fatalf("reason %q, want %q", d.Endpoints[2].Reason, ReasonUtilization)
	}
}

// converged serves the target shares of TestCompute_CapacityFirstStepSplitsLoadByTheSquareRootRule
// (600, 600, 200, 200 rps for capacities 900, 900, 400, 400) at weights 3:3:1:1.
func converged(cpuNoise ...float64) []Endpoint {
	eps := []Endpoint{ep("a", 1200.0/900, 600, 2, 300), ep("b", 1200.0/900, 600, 2, 300), ep("c", 1, 200, 2, 100), ep("d", 1, 200, 2, 100)}
	for i, f := range cpuNoise {
		eps[i].CPUCores *= f
	}
	return eps
}

func TestCompute_CapacitySteadySignalsInsideDeadBandWriteNothing(t *testing.T) {
	d, err := Compute(Input{Endpoints: converged()}, planAsSeen())
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("changed = true for converged weights: %+v", d.Endpoints)
	}
	if got, want := weightsOf(d), []int{300, 300, 100, 100}; !reflect.DeepEqual(got, want) {
		t.Fatalf("weights = %v, want the current %v", got, want)
	}
}

func TestCompute_CapacitySmallNoiseStaysInsideDeadBand(t *testing.T) {
	eps := converged(1.02, 0.99, 1.01, 0.98)
	d, err := Compute(Input{Endpoints: eps}, planAsSeen())
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("2%% noise caused a write: %+v", d.Endpoints)
	}
	for _, r := range d.Endpoints {
		if r.Reason != ReasonInsideDeadBand {
			t.Fatalf("reason %q, want %q", r.Reason, ReasonInsideDeadBand)
		}
	}
}

func TestCompute_CapacityStepIsBounded(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	s.Capacity.Gain = 1
	s.Capacity.MaxStepRatio = 1.5
	// c is 16x hotter than the others: a full step would divide its weight by 16.
	eps := []Endpoint{ep("a", 0.1, 100, 2, 100), ep("b", 0.1, 100, 2, 110), ep("c", 1.6, 100, 2, 100)}
	d, err := Compute(Input{Endpoints: eps}, s)
	if err != nil {
		t.Fatal(err)
	}
	if w := d.Endpoints[2].Weight; w < 66 {
		t.Fatalf("weight %d fell below current/1.5", w)
	}
	if d.Endpoints[2].Reason != ReasonStepLimited {
		t.Fatalf("reason %q, want %q", d.Endpoints[2].Reason, ReasonStepLimited)
	}
}

func TestCompute_CapacityRatioIsBounded(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	s.Capacity.MaxWeightRatio = 4
	eps := []Endpoint{ep("a", 0.01, 100, 2, 1), ep("b", 0.1, 100, 2, 1), ep("c", 1, 100, 2, 1)}
	d, err := Compute(Input{Endpoints: eps}, s)
	if err != nil {
		t.Fatal(err)
	}
	w := weightsOf(d)
	sort.Ints(w)
	if float64(w[2])/float64(w[0]) > 4.05 {
		t.Fatalf("max/min = %d/%d exceeds the ratio bound 4", w[2], w[0])
	}
}

func TestCompute_MissingData(t *testing.T) {
	nan := math.NaN()
	cases := map[string]struct {
		endpoints   []Endpoint
		wantWeights []int
		wantReasons []string
	}{
		// a, b, c: capacities 900, 400, 400 at 400 rps each; c = 500/70, target rates 685.7,
		// 257.1, 257.1: a gets 100·685.7/257.1.
		"an endpoint without metrics gets the median of the decided weights": {
			endpoints:   []Endpoint{ep("a", 800.0/900, 400, 2, 1), ep("b", 2, 400, 2, 1), ep("c", 2, 400, 2, 1), ep("x", 0, 0, 2, 1, noMetrics)},
			wantWeights: []int{267, 100, 100, 100},
			wantReasons: []string{ReasonCapacity, ReasonCapacity, ReasonCapacity, ReasonNoMetrics},
		},
		"NaN CPU is treated as missing, never propagated": {
			endpoints:   []Endpoint{ep("a", 800.0/900, 400, 2, 1), ep("b", 2, 400, 2, 1), ep("c", 2, 400, 2, 1), ep("x", nan, 100, 2, 1)},
			wantWeights: []int{267, 100, 100, 100},
			wantReasons: []string{ReasonCapacity, ReasonCapacity, ReasonCapacity, ReasonInvalidMetrics},
		},
		"+Inf request rate is treated as missing": {
			endpoints:   []Endpoint{ep("a", 800.0/900, 400, 2, 1), ep("b", 2, 400, 2, 1), ep("c", 2, 400, 2, 1), ep("x", 0.1, math.Inf(1), 2, 1)},
			wantWeights: []int{267, 100, 100, 100},
			wantReasons: []string{ReasonCapacity, ReasonCapacity, ReasonCapacity, ReasonInvalidMetrics},
		},
		"fewer than two endpoints with data: all equal": {
			endpoints:   []Endpoint{ep("a", 0.1, 100, 2, 150), ep("b", 0, 0, 2, 40, noMetrics), ep("c", nan, nan, 2, 70)},
			wantWeights: []int{100, 100, 100},
			wantReasons: []string{ReasonTooFewWithData, ReasonTooFewWithData, ReasonTooFewWithData},
		},
		"a new endpoint starts at the median weight": {
			endpoints:   []Endpoint{ep("a", 0.5, 100, 2, 200), ep("b", 1, 100, 2, 100), ep("c", 1.5, 100, 2, 66), ep("new", 0.1, 100, 2, 0)},
			wantWeights: nil, // checked below: the median
			wantReasons: []string{ReasonUtilization, ReasonUtilization, ReasonUtilization, ReasonNewEndpoint},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := Compute(Input{Endpoints: tc.endpoints}, planAsSeen())
			if err != nil {
				t.Fatal(err)
			}
			got := weightsOf(d)
			if tc.wantWeights != nil && !reflect.DeepEqual(got, tc.wantWeights) {
				t.Fatalf("weights = %v, want %v", got, tc.wantWeights)
			}
			if tc.wantWeights == nil {
				others := []float64{float64(got[0]), float64(got[1]), float64(got[2])}
				if want := int(math.Round(median(others))); got[3] != want {
					t.Fatalf("new endpoint weight %d, want the median %d of %v", got[3], want, got[:3])
				}
			}
			for i, r := range d.Endpoints {
				if r.Reason != tc.wantReasons[i] {
					t.Errorf("endpoint %s reason %q, want %q", r.ID, r.Reason, tc.wantReasons[i])
				}
			}
			if !d.Changed {
				t.Error("decision must report a change")
			}
		})
	}
}

func TestCompute_RejectsBadInput(t *testing.T) {
	bad := DefaultSettings(AlgorithmCapacity)
	bad.MinWeight = 0
	if _, err := Compute(Input{Endpoints: []Endpoint{ep("a", 1, 1, 1, 1)}}, bad); err == nil || !strings.Contains(err.Error(), "minWeight 0 must be at least 1") {
		t.Fatalf("err = %v, want the minWeight message", err)
	}
	unknown := DefaultSettings(AlgorithmCapacity)
	unknown.Algorithm = "fastest"
	if _, err := Compute(Input{Endpoints: nil}, unknown); err == nil || !strings.Contains(err.Error(), `algorithm "fastest" is unknown`) {
		t.Fatalf("err = %v, want the unknown-algorithm message", err)
	}
	dup := []Endpoint{ep("a", 1, 1, 1, 1), ep("a", 1, 1, 1, 1)}
	if _, err := Compute(Input{Endpoints: dup}, DefaultSettings(AlgorithmCapacity)); err == nil || !strings.Contains(err.Error(), `endpoint "a" appears twice`) {
		t.Fatalf("err = %v, want the duplicate message", err)
	}
}

// randomEndpoints draws messy but plausible inputs, including missing and non-finite data.
func randomEndpoints(r *rand.Rand, n int) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		e := ep(string(rune('a'+i%26))+string(rune('a'+i/26)), r.Float64()*3, r.Float64()*300, float64(r.Intn(4)), r.Intn(1200))
		switch r.Intn(12) {
		case 0:
			e.HasMetrics = false
		case 1:
			e.CPUCores = math.NaN()
		case 2:
			e.RequestRate = math.Inf(1)
		case 3:
			e.RequestRate = 0
		}
		eps[i] = e
	}
	return eps
}

func TestCompute_PropertiesHoldOnRandomInput(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for _, alg := range Algorithms {
		s := DefaultSettings(alg)
		iterations := 2000
		if alg == AlgorithmTail {
			// Random costs make nearly every group a new pod shape whose model must be built:
			// coarse models and fewer rounds keep the test short.
			iterations = 300
			defer func(n int) { modelSamples = n; clearModelCache() }(modelSamples)
			modelSamples = 500
			clearModelCache()
		}
		for iter := 0; iter < iterations; iter++ {
			eps := randomEndpoints(r, 1+r.Intn(40))
			d, err := Compute(Input{Endpoints: eps}, s)
			if err != nil {
				t.Fatalf("%s: %v", alg, err)
			}
			if len(d.Endpoints) != len(eps) {
				t.Fatalf("%s: %d results for %d endpoints", alg, len(d.Endpoints), len(eps))
			}
			for i, res := range d.Endpoints {
				if res.ID != eps[i].ID {
					t.Fatalf("%s: result %d is %q, want input order %q", alg, i, res.ID, eps[i].ID)
				}
				if res.Weight < s.MinWeight || res.Weight > s.MaxWeight || res.Weight < 1 {
					t.Fatalf("%s: weight %d outside [%d, %d] for %+v", alg, res.Weight, s.MinWeight, s.MaxWeight, eps[i])
				}
			}
			again, _ := Compute(Input{Endpoints: eps}, s)
			if !reflect.DeepEqual(d, again) {
				t.Fatalf("%s: Compute is not deterministic", alg)
			}
			// The order of the input must not matter.
			perm := r.Perm(len(eps))
			shuffled := make([]Endpoint, len(eps))
			for i, j := range perm {
				shuffled[i] = eps[j]
			}
			ds, _ := Compute(Input{Endpoints: shuffled}, s)
			if !reflect.DeepEqual(d.Weights(), ds.Weights()) {
				t.Fatalf("%s: weights depend on input order", alg)
			}
		}
	}
}

func TestCompute_CapacityHigherCapacityNeverGetsLowerWeight(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	s := DefaultSettings(AlgorithmCapacity)
	for iter := 0; iter < 2000; iter++ {
		n := 2 + r.Intn(30)
		eps := make([]Endpoint, n)
		for i := range eps {
			// Fresh start (equal weights) and a shared limit: capacity is rps/cpu.
			eps[i] = ep(string(rune('A'+i)), 0.05+r.Float64()*2, 1+r.Float64()*300, 2, 1)
		}
		d, err := Compute(Input{Endpoints: eps}, s)
		if err != nil {
			t.Fatal(err)
		}
		for i := range eps {
			for j := range eps {
				ci := eps[i].RequestRate / eps[i].CPUCores
				cj := eps[j].RequestRate / eps[j].CPUCores
				if ci > cj && d.Endpoints[i].Weight < d.Endpoints[j].Weight {
					t.Fatalf("capacity %.1f got weight %d below capacity %.1f's %d", ci, d.Endpoints[i].Weight, cj, d.Endpoints[j].Weight)
				}
			}
		}
	}
}

func TestCompute_CapacityWaitsForAWindowObservedUnderTheCurrentWeights(t *testing.T) {
	eps := []Endpoint{ep("a", 0.8, 200, 2, 120), ep("b", 0.8, 200, 2, 100), ep("c", 1.6, 200, 2, 80)}
	held, err := Compute(Input{Endpoints: eps, WindowCoverage: 0.5}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	if held.Changed || held.Endpoints[2].Reason != ReasonWindowUnsettled {
		t.Fatalf("half-covered window: changed %v reason %q; want the weights kept", held.Changed, held.Endpoints[2].Reason)
	}
	settled, _ := Compute(Input{Endpoints: eps, WindowCoverage: 0.95}, DefaultSettings(AlgorithmCapacity))
	if !settled.Changed {
		t.Fatal("a settled window must let the feedback act")
	}
	// A first step does not depend on shares, so it never waits.
	fresh := []Endpoint{ep("a", 0.1, 100, 2, 1), ep("b", 0.4, 100, 2, 1)}
	first, _ := Compute(Input{Endpoints: fresh, WindowCoverage: 0.1}, DefaultSettings(AlgorithmCapacity))
	if !first.Changed {
		t.Fatal("the first step must not wait for a settled window")
	}
}

func TestCompute_CapacityPlansForMoreLoadThanSeen(t *testing.T) {
	// The capacities of TestCompute_CapacityFirstStepSplitsLoadByTheSquareRootRule at 1,600 rps
	// give shares 3:3:1:1. Planning for 1.5 × 1,600 = 2,400 rps gives c = 2 and target rates
	// 840, 840, 360, 360: a ratio of 7:3, less skewed, leaving the fast pods room for a burst.
	eps := []Endpoint{ep("a", 800.0/900, 400, 2, 1), ep("b", 800.0/900, 400, 2, 1), ep("c", 2.0, 400, 2, 1), ep("d", 2.0, 400, 2, 1)}
	s := DefaultSettings(AlgorithmCapacity)
	if s.Capacity.PlanningLoadFactor != 1.5 {
		t.Fatalf("default planning factor %v, want 1.5", s.Capacity.PlanningLoadFactor)
	}
	d, err := Compute(Input{Endpoints: eps}, s)
	if err != nil {
		t.Fatal(err)
	}
	// Median of the log shares → 100: 100·√(7/3) and 100/√(7/3).
	if got, want := weightsOf(d), []int{153, 153, 65, 65}; !reflect.DeepEqual(got, want) {
		t.Fatalf("weights = %v, want %v", got, want)
	}
}

func withP99(seconds float64) func(*Endpoint) {
	return func(e *Endpoint) { e.LatencyP99Seconds = seconds }
}

// A pod at a low weight is quiet because of its weight. Handing it the median weight would send
// it traffic, make it measurable and take the traffic away again: the weights would flap.
func TestCompute_CapacityQuietEndpointKeepsItsWeight(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	// Converged: shares 40/40/20 of 100 rps delivered as planned, c is quiet at its floor.
	endpoints := []Endpoint{
		ep("a", 0.4, 50, 1, 200), ep("b", 0.4, 50, 1, 200),
		ep("c", 0.004, 0.2, 1, 10), // 0.2 rps: below MinRequestRate
	}
	d, err := Compute(Input{Endpoints: endpoints}, s)
	if err != nil {
		t.Fatal(err)
	}
	if r := d.Endpoints[2]; r.Weight != 10 {
		t.Errorf("quiet endpoint: got %+v, want weight 10 kept", r)
	}
	if d.Endpoints[0].Weight != 200 || d.Endpoints[1].Weight != 200 {
		t.Errorf("the measured endpoints moved: %v", weightsOf(d))
	}
}

// The common scale follows the median endpoint above the ratio floor: endpoints far below it
// entering or leaving the measured set must not rescale everybody.
func TestCompute_CapacityScaleIgnoresFlooredEndpoints(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	// Four equal fast pods at 100 get their planned share; two slow pods at the floor get a
	// trickle that the square-root rule would cut further. Before the fix the median of the six
	// targets fell between the groups and every weight was scaled up ×4.
	endpoints := []Endpoint{
		ep("f1", 0.24, 24, 1, 100), ep("f2", 0.24, 24, 1, 100), ep("f3", 0.24, 24, 1, 100), ep("f4", 0.24, 24, 1, 100),
		ep("s1", 0.1, 2, 1, 10), ep("s2", 0.1, 2, 1, 10),
	}
	d, err := Compute(Input{Endpoints: endpoints}, s)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if w := d.Endpoints[i].Weight; w < 90 || w > 110 {
			t.Errorf("fast pod %d rescaled to %d: %v", i, w, weightsOf(d))
		}
	}
}

// A queue in front of a pod shows in its p99 long before its average CPU says anything. A pod
// whose p99, in units of its own cost per request, is far above its peers' is cut at once, even
// in a window that straddles the last weight change.
func TestCompute_CapacityOverloadedEndpointIsHalvedAtOnce(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	// Cost per request 10 ms everywhere; the peers' p99 is 40 ms (stretch 4), d's 400 ms (40).
	mk := func(p99d float64) []Endpoint {
		return []Endpoint{
			ep("a", 0.5, 50, 1, 100, withP99(0.04)), ep("b", 0.5, 50, 1, 100, withP99(0.04)),
			ep("c", 0.5, 50, 1, 120, withP99(0.04)), ep("d", 0.5, 50, 1, 120, withP99(p99d)),
		}
	}
	t.Run("in an unsettled window only the overloaded pod moves", func(t *testing.T) {
		d, err := Compute(Input{Endpoints: mk(0.4), WindowCoverage: 0.6}, s)
		if err != nil {
			t.Fatal(err)
		}
		if got := weightsOf(d); !reflect.DeepEqual(got, []int{100, 100, 120, 60}) {
			t.Errorf("got %v, want d halved and the rest kept", got)
		}
		if d.Endpoints[3].Reason != ReasonOverloaded || !d.Changed {
			t.Errorf("got %+v changed=%v", d.Endpoints[3], d.Changed)
		}
	})
	t.Run("a window mostly before the last write does not cut again", func(t *testing.T) {
		// With the TSDB's lag such a window shows the queue the last write may have relieved.
		d, err := Compute(Input{Endpoints: mk(0.4), WindowCoverage: 0.3}, s)
		if err != nil {
			t.Fatal(err)
		}
		if got := weightsOf(d); !reflect.DeepEqual(got, []int{100, 100, 120, 120}) || d.Changed {
			t.Errorf("got %v changed=%v, want every weight kept", got, d.Changed)
		}
	})
	t.Run("a p99 within the ratio is not overload", func(t *testing.T) {
		d, err := Compute(Input{Endpoints: mk(0.1), WindowCoverage: 0.3}, s)
		if err != nil {
			t.Fatal(err)
		}
		if d.Changed {
			t.Errorf("a stretch of 10 against 4 (ratio 2.5 < 3) moved weights: %v", weightsOf(d))
		}
	})
	t.Run("turned off with a ratio of 0", func(t *testing.T) {
		off := s
		off.Capacity.OverloadLatencyRatio = 0
		d, err := Compute(Input{Endpoints: mk(0.4), WindowCoverage: 0.3}, off)
		if err != nil {
			t.Fatal(err)
		}
		if d.Changed {
			t.Errorf("moved weights with detection off: %v", weightsOf(d))
		}
	})
	t.Run("a ratio of 1 or below is rejected", func(t *testing.T) {
		bad := s
		bad.Capacity.OverloadLatencyRatio = 1
		if _, err := Compute(Input{Endpoints: mk(0.4)}, bad); err == nil || !strings.Contains(err.Error(), "overloadLatencyRatio") {
			t.Errorf("got %v", err)
		}
	})
}

// With 500 requests behind a share, sampling noise alone moves it by about 1/√500 ≈ 4.5%. A
// converged quiet Service must not chase that noise; a real error beyond it is still corrected.
func TestCompute_CapacityFeedbackIgnoresShareNoise(t *testing.T) {
	s := DefaultSettings(AlgorithmCapacity)
	// Converged on equal shares, then one window observes 16% more on a, 16% less on b: about
	// two standard errors of ~500 requests.
	noisy := []Endpoint{ep("a", 0.0967, 9.67, 1, 100), ep("b", 0.07, 7, 1, 101), ep("c", 0.0833, 8.33, 1, 99)}
	d, err := Compute(Input{Endpoints: noisy, WindowSeconds: 60}, s)
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Errorf("moved on noise: %v (%s)", weightsOf(d), d.Reason)
	}
	// Without the window the engine cannot tell noise from error, and corrects.
	if d, _ := Compute(Input{Endpoints: noisy}, s); !d.Changed {
		t.Errorf("without a window the same error should be corrected: %s", d.Reason)
	}
	// A 20% error over a window with ten times the traffic is real and gets corrected.
	busy := []Endpoint{ep("a", 1.2, 100, 2, 100), ep("b", 0.8, 66.7, 2, 101), ep("c", 1.0, 83.3, 2, 99)}
	d, err = Compute(Input{Endpoints: busy, WindowSeconds: 60}, s)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed {
		t.Errorf("a 20%% error over 5,000 requests per pod was left alone: %s", d.Reason)
	}
}
