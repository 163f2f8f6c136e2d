package weights

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
)

// seedFleet is the published experiment's fleet at 1,500 rps under equal weights: three pods
// costing 2.9 ms per request and nine costing 7.6 ms, all limited to 2 cores on 8-core nodes.
func seedFleet(weight int, opts ...func(*Endpoint)) []Endpoint {
	var eps []Endpoint
	for i := 0; i < 3; i++ {
		eps = append(eps, ep(fmt.Sprintf("fast-%d", i), 125*0.0029, 125, 2, weight, opts...))
	}
	for i := 0; i < 9; i++ {
		eps = append(eps, ep(fmt.Sprintf("slow-%d", i), 125*0.0076, 125, 2, weight, opts...))
	}
	for i := range eps {
		if eps[i].NodeCPUCores == 0 {
			eps[i].NodeCPUCores = 8
		}
	}
	return eps
}

func withoutNode(e *Endpoint) { e.NodeCPUCores = -1 }

// shareOf is each endpoint's share of the total weight.
func shareOf(d Decision, id string) float64 {
	var total, w float64
	for _, r := range d.Endpoints {
		total += float64(r.Weight)
		if r.ID == id {
			w = float64(r.Weight)
		}
	}
	return w / total
}

// noSurgeBound is the tail algorithm's defaults with the surge bound off, for the tests of what
// the split does for the planning load alone.
func noSurgeBound() Settings {
	s := DefaultSettings(AlgorithmTail)
	s.Tail.SurgeFactor = 1
	return s
}

func TestTail_LoadsTheCheapPodsFarBeyondTheirCapacityShareAtLowLoad(t *testing.T) {
	d, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, noSurgeBound())
	if err != nil {
		t.Fatal(err)
	}
	// Capacity shares: 690 rps per fast pod, 263 per slow one; the fast three hold 47% of the
	// capacity. At 1,500 rps (a third of capacity) the slow pods' own service times set the
	// p99, so the split sends them little.
	fastShare := 3 * shareOf(d, "fast-0")
	if fastShare < 0.8 {
		t.Fatalf("fast pods get %.2f of the weight, want most of it: %v", fastShare, weightsOf(d))
	}
	for _, r := range d.Endpoints {
		if r.Weight < 1 {
			t.Fatalf("endpoint %s left without weight: %v", r.ID, weightsOf(d))
		}
		if r.Reason != ReasonTail && r.Reason != ReasonClampedMin && r.Reason != ReasonClampedMax {
			t.Fatalf("endpoint %s reason %q, want %q", r.ID, r.Reason, ReasonTail)
		}
	}
	if !d.Changed {
		t.Fatal("the first split must be written")
	}
}

func TestTail_KeepsEveryPodMeasurable(t *testing.T) {
	s := DefaultSettings(AlgorithmTail)
	d, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	// The planned share of a slow pod is at least MinPodRate of the 1,500 rps (weights being
	// proportional to shares on the first step, give or take rounding).
	if got := shareOf(d, "slow-0") * 1500; got < 0.8*s.Tail.MinPodRate {
		t.Fatalf("slow pod planned at %.2f rps, want at least %.1f", got, s.Tail.MinPodRate)
	}
}

func TestTail_PlansForTheRecentPeak(t *testing.T) {
	// Without the surge bound: with it, both loads would be past 1/SurgeFactor of the capacity,
	// where the split is the capacity algorithm's for the surge, whatever the peak.
	s := noSurgeBound()
	quiet, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	// The same window, but the Service served three times the rate a few minutes ago: the fast
	// pods must not be loaded as if the quiet spell would last.
	peak, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 4500}, s)
	if err != nil {
		t.Fatal(err)
	}
	if q, p := shareOf(quiet, "fast-0"), shareOf(peak, "fast-0"); p >= q {
		t.Fatalf("fast pod's share %.3f when planning for the peak, %.3f without; want less", p, q)
	}
}

func TestTail_WorksWithoutHistogramAndNodeSize(t *testing.T) {
	// Neither the node's CPU count nor a histogram: the model assumes 4× the limit and its
	// default size variability, and still prefers the cheap pods.
	d, err := Compute(Input{Endpoints: seedFleet(100, withoutNode), WindowSeconds: 60, RecentPeakRequestRate: 1500}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if shareOf(d, "fast-0") <= shareOf(d, "slow-0") {
		t.Fatalf("fast pod not preferred: %v", weightsOf(d))
	}
}

func TestTail_HistogramCalibratesTheModel(t *testing.T) {
	// Pods whose histogram is what the model predicts for a size variability: calibration must
	// find that variability, on the load axis as measured.
	const cost, rate = 0.0076, 125.0
	bounds := []float64{0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	for _, cv := range []float64{0.3, 1.5} {
		m := modelFor(newModelKey(8, 2, cost, cv))
		u := rate * cost / 2
		n := rate * 60
		var buckets []LatencyBucket
		for _, ub := range bounds {
			buckets = append(buckets, LatencyBucket{UpperBoundSeconds: ub, Count: math.Round(n * (1 - m.tail(ub/cost, u)))})
		}
		buckets = append(buckets, LatencyBucket{UpperBoundSeconds: math.Inf(1), Count: n})
		eps := []Endpoint{
			ep("a", rate*cost, rate, 2, 100, func(e *Endpoint) { e.NodeCPUCores, e.LatencyBuckets = 8, buckets }),
			ep("b", rate*cost, rate, 2, 100, func(e *Endpoint) { e.NodeCPUCores, e.LatencyBuckets = 8, buckets }),
		}
		groups := groupEndpoints(eps, []bool{true, true}, func(e Endpoint) float64 { return e.CPULimitCores })
		if len(groups) != 1 {
			t.Fatalf("%d groups for two identical pods, want 1", len(groups))
		}
		if g := groups[0]; g.model != m || g.loadScale != 1 {
			t.Fatalf("histogram of size CV %v: calibrated to another model (load scale %v)", cv, g.loadScale)
		}
	}
}

func TestTail_EndpointWithoutMetricsKeepsItsWeight(t *testing.T) {
	eps := seedFleet(0)
	for i := range eps {
		eps[i].CurrentWeight = 50
	}
	eps[0].CurrentWeight = 4000
	eps[1].CurrentWeight = 4000
	eps[2].CurrentWeight = 4000
	eps[2].HasMetrics = false
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if r := d.Endpoints[2]; r.Weight != 4000 || r.Reason != ReasonNoMetricsKept {
		t.Fatalf("endpoint without metrics: weight %d reason %q, want 4000 kept", r.Weight, r.Reason)
	}
}

func TestTail_HoldsWhileTheLoadSwings(t *testing.T) {
	eps := seedFleet(0)
	for i := range eps {
		eps[i].CurrentWeight = 50
	}
	for i := 0; i < 3; i++ {
		eps[i].CurrentWeight = 4000
	}
	// The window's rate is half the recent peak: shares seen now are no guide to the weights.
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, RecentPeakRequestRate: 3000}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed || d.Reason != ReasonWindowUnsettled {
		t.Fatalf("changed %v reason %q, want the weights kept until the load settles", d.Changed, d.Reason)
	}
}

func TestPodModel_TailGrowsWithLoadAndMatchesTheSizeDistributionWhenIdle(t *testing.T) {
	m := modelFor(newModelKey(4, 1, 0.01, 1))
	// Idle: latency is the request size, lognormal with mean 1 and CV 1; P(S > 3) ≈ 0.05.
	if got := m.tail(3, 0.01); got < 0.03 || got > 0.07 {
		t.Fatalf("idle P(latency > 3 mean costs) = %.3f, want about 0.05", got)
	}
	prev := 0.0
	for _, u := range []float64{0.1, 0.5, 0.8, 0.95} {
		got := m.tail(3, u)
		if got < prev {
			t.Fatalf("tail at load %.2f is %.4f, below %.4f at a lower load", u, got, prev)
		}
		prev = got
	}
	if got := m.tail(3, 0.99); got != 1 {
		t.Fatalf("beyond the tabulated loads the tail is %.3f, want 1 (no finite quantile)", got)
	}
}

func TestTailSettings_Validate(t *testing.T) {
	for name, mutate := range map[string]func(*TailParams){
		"tail quantile":       func(p *TailParams) { p.Quantile = 1 },
		"tail maxUtilization": func(p *TailParams) { p.MaxUtilization = 0.99 },
		"tail burstMargin":    func(p *TailParams) { p.BurstMargin = 0.5 },
		"tail maxShareRatio":  func(p *TailParams) { p.MaxShareRatio = 0 },
		"tail surgeFactor":    func(p *TailParams) { p.SurgeFactor = 0.5 },
		"tail minPodRate":     func(p *TailParams) { p.MinPodRate = math.NaN() },
	} {
		s := DefaultSettings(AlgorithmTail)
		mutate(&s.Tail)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: error %v, want one naming it", name, err)
		}
	}
	if err := DefaultSettings(AlgorithmTail).Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func clearModelCache() {
	modelCacheMu.Lock()
	clear(modelCache)
	modelCacheMu.Unlock()
}

// The surge bound keeps the split that a sudden rise of the load would meet within every group's
// limit: at a third of the fleet's capacity and a surge factor of 2.5, no group's share may
// exceed 1/(2.5 x 0.34) of its capacity share. The fast pods still get more than that share.
func TestTail_TheSurgeBoundNarrowsTheSplitAtLowLoad(t *testing.T) {
	s := DefaultSettings(AlgorithmTail)
	s.Tail.SurgeFactor = 2.5 // below 1/0.37: the bound, not the capacity fallback
	d, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	fastCapacity, slowCapacity := 2/0.0029, 2/0.0076
	fleetCapacity := 3*fastCapacity + 9*slowCapacity
	capacityShare := 3 * fastCapacity / fleetCapacity
	load := 1500 * DefaultSettings(AlgorithmTail).Tail.BurstMargin
	bound := capacityShare / (2.5 * load / fleetCapacity)
	fastShare := 3 * shareOf(d, "fast-0")
	if fastShare > bound+0.01 {
		t.Fatalf("fast pods get %.3f of the weight, above the surge bound %.3f: %v", fastShare, bound, weightsOf(d))
	}
	if fastShare <= capacityShare {
		t.Fatalf("fast pods get %.3f of the weight, no more than their capacity share %.3f: %v", fastShare, capacityShare, weightsOf(d))
	}
	wide, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, noSurgeBound())
	if err != nil {
		t.Fatal(err)
	}
	if w := 3 * shareOf(wide, "fast-0"); w <= fastShare {
		t.Fatalf("fast pods get %.3f without the bound and %.3f with it, want more without", w, fastShare)
	}
}

// From a planning load of 1/SurgeFactor of the fleet's capacity the surge bound leaves the model
// no choice (every group at its capacity share): the engine takes the capacity algorithm's
// square-root split for the load the bound must carry, SurgeFactor times the planning load (here
// beyond the fleet's capacity: the split proportional to capacity), and says so.
func TestTail_FromTheSurgeBoundOnTheSplitIsTheCapacitySplitForTheSurge(t *testing.T) {
	s := DefaultSettings(AlgorithmTail)
	fastCapacity, slowCapacity := 2/0.0029, 2/0.0076
	fleetCapacity := 3*fastCapacity + 9*slowCapacity
	for _, peak := range []float64{1700, 2100, 2600} {
		in := Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: peak}
		if load := planningLoad(in, 1500, s); s.Tail.SurgeFactor*load < fleetCapacity {
			t.Fatalf("peak %v: planning load %.0f is below 1/%v of the capacity %.0f: the case is not tested", peak, load, s.Tail.SurgeFactor, fleetCapacity)
		}
		d, err := Compute(in, s)
		if err != nil {
			t.Fatal(err)
		}
		if r := d.Endpoints[0].Reason; r != ReasonCapacity {
			t.Errorf("peak %v rps: fast pod's reason %q, want %q", peak, r, ReasonCapacity)
		}
		capacity := make([]float64, 12)
		ok := make([]bool, 12)
		for i := range capacity {
			capacity[i], ok[i] = slowCapacity, true
			if i < 3 {
				capacity[i] = fastCapacity
			}
		}
		want := 3 * targetShares(capacity, ok, s.Tail.SurgeFactor*planningLoad(in, 1500, s))[0]
		if got := 3 * shareOf(d, "fast-0"); math.Abs(got-want) > 0.01 {
			t.Errorf("peak %v rps: fast pods get %.3f of the weight, want the square-root split's %.3f: %v", peak, got, want, weightsOf(d))
		}
	}
}

func TestTail_PlansWithAMarginWhenThePeakIsUnknown(t *testing.T) {
	s := noSurgeBound()
	known, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60}, s)
	if err != nil {
		t.Fatal(err)
	}
	// Without a peak the engine cannot tell a steady load from the quiet half of a burst: it
	// plans for 1.5× the current rate, which leaves the fast pods more headroom.
	if k, u := shareOf(known, "fast-0"), shareOf(unknown, "fast-0"); u >= k {
		t.Fatalf("fast pod's share %.3f with the peak unknown, %.3f with a steady peak; want less", u, k)
	}
}

func TestTail_SplitsAGroupByEachMembersCapacity(t *testing.T) {
	// Two pods 15% apart in cost share one group; the cheaper one must still get more.
	eps := []Endpoint{
		ep("a", 0.5, 50, 1, 100, func(e *Endpoint) { e.NodeCPUCores = 4 }),
		ep("b", 0.575, 50, 1, 100, func(e *Endpoint) { e.NodeCPUCores = 4 }),
		ep("c", 0.5, 50, 1, 100, func(e *Endpoint) { e.NodeCPUCores = 4 }),
	}
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, RecentPeakRequestRate: 150}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if w := weightsOf(d); w[1] >= w[0] || w[0] != w[2] {
		t.Fatalf("weights %v: want the costlier pod b below the equal a and c", w)
	}
}

// The split's search finds a load's place in the table from a guess; it must be the place a
// binary search finds, or the predictions (and so the weights) would change.
func TestUtilizationIndexMatchesBinarySearch(t *testing.T) {
	us := modelUtilizations
	check := func(u float64) {
		if u <= us[0] || u > maxModelUtilization {
			return
		}
		if got, want := utilizationIndex(u), sort.SearchFloat64s(us, u); got != want {
			t.Fatalf("utilizationIndex(%v) = %d, binary search gives %d", u, got, want)
		}
	}
	for _, v := range us {
		for _, u := range []float64{v, math.Nextafter(v, 0), math.Nextafter(v, 1), v + 0.025, v - 0.025} {
			check(u)
		}
	}
	for k := 0; k <= 100000; k++ {
		check(float64(k) / 100000)
	}
}

// Reading a tail through a column must give exactly what the model's direct read gives.
func TestTailFromColumnEqualsTailAt(t *testing.T) {
	m := &podModel{ccdf: make([][]float64, len(modelUtilizations))}
	for i := range m.ccdf {
		m.ccdf[i] = make([]float64, modelTimePoints)
		for j := range m.ccdf[i] {
			m.ccdf[i][j] = math.Exp(-float64(j) / (10 + 7*float64(i)) * (1 + 0.1*math.Sin(float64(i*j))))
		}
	}
	col := make([]float64, len(modelUtilizations))
	for _, pos := range []float64{-3, 0, 0.37, 12.5, 100.999, modelTimePoints - 1, 500} {
		m.column(pos, col)
		for k := 0; k <= 1000; k++ {
			u := float64(k) / 1000
			if got, want := tailFromColumn(col, u), m.tailAt(pos, u); got != want {
				t.Fatalf("pos %v load %v: column gives %v, direct read %v", pos, u, got, want)
			}
		}
	}
}

// quietFleet is four alike pods (10 ms per request, 1 core each on 4-core nodes) whose observed
// rates follow their weights, as Envoy's shares do once a window has settled.
func quietFleet(rates []float64, weights []int) []Endpoint {
	var eps []Endpoint
	for i, r := range rates {
		eps = append(eps, ep(fmt.Sprintf("pod-%d", i), r*0.010, r, 1, weights[i], func(e *Endpoint) { e.NodeCPUCores = 4 }))
	}
	return eps
}

func TestTail_WritePromisingTooLittleGainIsSkipped(t *testing.T) {
	// One pod carries twice its peers' traffic at a tenth of its capacity: the feedback would
	// even it out (a 20% weight change, well outside the dead band), but at this load the
	// unevenness costs the p99 nothing worth an istiod push.
	eps := quietFleet([]float64{16, 8, 8, 8}, []int{200, 100, 100, 100})
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 40}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed || d.Reason != ReasonGainTooSmall {
		t.Fatalf("changed %v reason %q weights %v, want the weights kept: %q", d.Changed, d.Reason, weightsOf(d), ReasonGainTooSmall)
	}
	for i, r := range d.Endpoints {
		if r.Weight != eps[i].CurrentWeight || r.Reason != ReasonGainTooSmall {
			t.Fatalf("endpoint %s: weight %d reason %q, want %d kept", r.ID, r.Weight, r.Reason, eps[i].CurrentWeight)
		}
	}
}

func TestTail_ReplanIsNotHeldByTheGainGate(t *testing.T) {
	// The input the gate holds back above, as a re-plan after endpoints left: the re-plan rides
	// on the mirror's write, costs no push of its own, and goes out.
	eps := quietFleet([]float64{16, 8, 8, 8}, []int{200, 100, 100, 100})
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 40, Replan: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Reason == ReasonGainTooSmall || d.Endpoints[0].Weight >= 200 {
		t.Fatalf("changed %v reason %q weights %v, want the re-plan written with the busy pod's weight lowered", d.Changed, d.Reason, weightsOf(d))
	}
}

func TestTail_WritePromisingARealGainGoesOut(t *testing.T) {
	// The same unevenness at 80% of the busy pod's capacity: its queue sets the p99, and
	// evening the split out is predicted to gain far more than the tolerance.
	eps := quietFleet([]float64{80, 40, 40, 40}, []int{200, 100, 100, 100})
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 200}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[0].Weight >= 200 {
		t.Fatalf("changed %v reason %q weights %v, want the busy pod's weight lowered", d.Changed, d.Reason, weightsOf(d))
	}
}

func TestTail_SettledSplitDoesNotFollowTheTrickleNoise(t *testing.T) {
	// Converged weights: the cheap pods take nearly everything, the slow ones a trickle of
	// about 1 rps whose count in a window is Poisson noise (here 0.6 to 1.6 rps). The trickle
	// pods' weights must not chase it.
	s := noSurgeBound() // the model's own split, which sends the slow pods a trickle
	first, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	eps := seedFleet(0)
	var total float64
	for i := range eps {
		eps[i].CurrentWeight = first.Endpoints[i].Weight
		total += float64(eps[i].CurrentWeight)
	}
	noise := []float64{0.6, 1.6, 1.0, 0.7, 1.4, 1.2, 0.8, 1.5, 0.6}
	var trickle float64
	for k := 3; k < len(eps); k++ {
		r := noise[k-3]
		eps[k].RequestRate, eps[k].CPUCores = r, r*0.0076
		trickle += r
	}
	for k := 0; k < 3; k++ {
		r := (1500 - trickle) / 3
		eps[k].RequestRate, eps[k].CPUCores = r, r*0.0029
	}
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 1, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("weights %v rewritten to %v (%s) for the trickle's noise", weightsOf(first), weightsOf(d), d.Reason)
	}
}

// A re-plan after endpoints left is not held back by the settle rules (the survivors' rate is
// below the peak because the departed pods' traffic is missing from it), and keeps every bound.
func TestTail_ReplanAfterEndpointsLeftSkipsTheSettleRules(t *testing.T) {
	eps := seedFleet(0)
	for i := range eps {
		eps[i].CurrentWeight = 50
	}
	for i := 0; i < 3; i++ {
		eps[i].CurrentWeight = 4000
	}
	s := DefaultSettings(AlgorithmTail)
	d, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 0.5, RecentPeakRequestRate: 3000, Replan: true}, s)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Reason == ReasonWindowUnsettled {
		t.Fatalf("changed %v reason %q, want a re-plan for the peak over these endpoints", d.Changed, d.Reason)
	}
	lo, hi := s.MaxWeight, 0
	for _, r := range d.Endpoints {
		lo, hi = min(lo, r.Weight), max(hi, r.Weight)
	}
	if lo < s.MinWeight || hi > s.MaxWeight || float64(hi) > s.Capacity.MaxWeightRatio*float64(lo)+0.5 {
		t.Fatalf("weights %d..%d break the bounds [%d, %d] or the ratio %.0f", lo, hi, s.MinWeight, s.MaxWeight, s.Capacity.MaxWeightRatio)
	}
}
