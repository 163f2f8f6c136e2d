package controller

import (
	"context"

	"fmt"
	"math"
	"testing"
	"time"

	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// Four fast pods (3 ms of CPU per request) carry most of the load, two slow ones (9 ms) little.
var (
	replanCores = []float64{1.2, 1.2, 1.2, 1.2, 0.45, 0.45}
	replanRPS   = []float64{400, 400, 400, 400, 50, 50}
)

// dropPod rewrites the Service's slice without pod i (1-based web-i), as the endpointslice
// controller does when a pod dies, and returns the ServiceEntry generation before and the first
// version without its address.
func (lf *loopFixture) dropPod(i int) (int64, map[string]int, int64) {
	lf.t.Helper()
	se, err := lf.serviceEntry("web")
	if err != nil {
		lf.t.Fatal(err)
	}
	before := se.Generation
	var eps []sliceEndpoint
	var keep []string
	for j, ip := range lf.ips {
		if j+1 != i {
			eps = append(eps, ready(fmt.Sprintf("web-%d", j+1), ip))
			keep = append(keep, ip)
		}
	}
	lf.slice("web", "web-x", eps...)
	after := lf.waitForAddresses("web", keep...)
	got := map[string]int{}
	for _, e := range after.Spec.Endpoints {
		got[e.Address] = int(e.Weight)
	}
	return before, got, after.Generation
}

// survivorsReplan is what the planner decides, as a re-plan, for a cycle's input without the
// first pod (the one dropPod(1) removes); the test fails when that is no write, since the
// scenario could then not tell a re-plan from none.
func (lf *loopFixture) survivorsReplan(t *testing.T, in cycle.Target) weights.Decision {
	t.Helper()
	want := in
	want.Replan, want.WindowCoverage = true, 1
	want.Endpoints = nil
	for _, e := range in.Endpoints {
		if e.ID != lf.ips[0] {
			want.Endpoints = append(want.Endpoints, e)
		}
	}
	outs, _ := cycle.Plan(lf.clock.Now(), []cycle.Target{want}, map[string]cycle.State{}, 0)
	if outs[0].Err != nil || outs[0].Action != cycle.ActionWrite {
		t.Fatalf("the planner does not re-plan the survivors (%s: %s); the scenario cannot tell a re-plan from none", outs[0].Action, outs[0].Reason)
	}
	return outs[0].Decision
}

func TestMirror_ReplansTheSurvivorsWeightsInTheWriteThatDropsAnEndpoint(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.withoutSurgeBound()
	lf.load(replanCores, replanRPS)
	rep := lf.run()
	if lf.wrote(rep) != 1 {
		t.Fatalf("first cycle wrote %d times: %+v", lf.wrote(rep), rep.Outcomes[lf.key()])
	}
	written := lf.weights()
	in := rep.Inputs[lf.key()]

	lf.clock.Step(8 * time.Second) // within the metrics window (2 intervals): the plan still counts
	gen, got, genAfter := lf.dropPod(1)
	if genAfter != gen+1 {
		t.Fatalf("ServiceEntry generation %d -> %d: the endpoint's removal and the re-plan must be one update", gen, genAfter)
	}
	// What the planner decides for the survivors' inputs of that cycle, as a re-plan.
	replanned := lf.survivorsReplan(t, in)
	moved := false
	for _, r := range replanned.Endpoints {
		if got[r.ID] != r.Weight {
			t.Fatalf("survivor %s has weight %d, the re-plan computes %d (written %v, now %v)", r.ID, got[r.ID], r.Weight, written, got)
		}
		moved = moved || written[r.ID] != r.Weight
	}
	if !moved {
		t.Fatalf("the re-plan kept every weight (%v): the scenario does not test it", got)
	}
	t.Logf("cycle: %v; after web-1 left: %v", orderedWeights(lf.ips, written), orderedWeights(lf.ips, got))

	// The next cycle's window straddles the re-planned weights: its coverage counts from the
	// re-plan (4 s of a 10 s window), not from the cycle's own last write 12 s ago.
	lf.clock.Step(4 * time.Second)
	lf.load(replanCores, replanRPS)
	next := lf.run().Inputs[lf.key()]
	if math.Abs(next.WindowCoverage-0.4) > 0.01 {
		t.Fatalf("window coverage after the re-plan %.2f, want 0.40 (4 s since the re-plan over a 10 s window)", next.WindowCoverage)
	}
}

func TestMirror_NoReplanWhenTheLastCyclesMetricsFailed(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(replanCores, replanRPS)
	lf.run()
	written := lf.weights()
	lf.vm.Stop()
	lf.clock.Step(loopInterval)
	if o := lf.run().Outcomes[lf.key()]; o.Action != cycle.ActionHold {
		t.Fatalf("outage cycle: %s (%s), want Hold", o.Action, o.Reason)
	}
	gen, got, genAfter := lf.dropPod(1)
	if genAfter != gen+1 {
		t.Fatalf("ServiceEntry generation %d -> %d, want one update", gen, genAfter)
	}
	for ip, w := range got {
		if written[ip] != w {
			t.Fatalf("%s's weight went %d -> %d while metrics are failing: want the held weights kept (%v -> %v)", ip, written[ip], w, written, got)
		}
	}
}

// A re-plan that changes nothing must leave the weights the ServiceEntry has: the planner's
// unchanged decision carries the last cycle's basis, and writing it would undo a later write.
// The published operator's algorithm never re-plans.
func TestReplanWeights_WritesOnlyAChangeAndOnlyForItsOwnAlgorithms(t *testing.T) {
	m := NewMembership(clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "uid-1"}}
	alb.Spec.Algorithm = adlbv1.AlgorithmCapacity
	// Four equal pods at equal weights: the engine keeps every weight.
	var eps []weights.Endpoint
	se := &networkingv1.ServiceEntry{}
	var built []istio.Endpoint
	for i := 1; i <= 4; i++ {
		ip := fmt.Sprintf("10.0.0.%d", i)
		eps = append(eps, weights.Endpoint{ID: ip, CPUCores: 0.5, RequestRate: 100, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 100})
		// A later write moved every weight to 150.
		se.Spec.Endpoints = append(se.Spec.Endpoints, &apinetworkingv1.WorkloadEntry{Address: ip, Weight: 150})
		if i > 1 {
			built = append(built, istio.Endpoint{Pod: fmt.Sprintf("web-%d", i), IP: ip, Weight: 150})
		}
	}
	var listed []MemberEndpoint
	for i, e := range eps {
		listed = append(listed, MemberEndpoint{IP: e.ID, Pod: fmt.Sprintf("web-%d", i+1), Weight: 150})
	}
	m.Observe(key, listed) // the mirror's record: every survivor listed since before the cycle
	m.RecordPlan(alb, time.Minute, cycle.Target{Key: key.String(), Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmCapacity), WindowSeconds: 60, RecentPeakRequestRate: 400}, 0)
	if got, _ := m.replanWeights(alb, se, built); got != nil {
		t.Fatalf("an unchanged re-plan returned %v; want nil (keep the ServiceEntry's 150s)", got)
	}

	// Uneven costs make the capacity engine move the survivors; cpu-distance still never re-plans.
	eps[1].CPUCores, eps[2].CPUCores = 0.2, 1.5
	m.RecordPlan(alb, time.Minute, cycle.Target{Key: key.String(), Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmCapacity), WindowSeconds: 60, RecentPeakRequestRate: 400}, 0)
	if got, _ := m.replanWeights(alb, se, built); got == nil || got["web-2"] <= got["web-3"] {
		t.Fatalf("capacity re-plan %v: want web-2 (cheaper per request) above web-3", got)
	}
	alb.Spec.Algorithm = adlbv1.AlgorithmCPUDistance
	if got, _ := m.replanWeights(alb, se, built); got != nil {
		t.Fatalf("cpu-distance re-planned to %v; it must react in its cycle only", got)
	}
	// A spec changed since the cycle (here: another target Service, whose pods may share
	// addresses with the old one's) waits for a cycle that planned for it.
	alb.Spec.Algorithm, alb.Spec.TargetRef.Name, alb.Generation = adlbv1.AlgorithmCapacity, "web-canary", alb.Generation+1
	if got, _ := m.replanWeights(alb, se, built); got != nil {
		t.Fatalf("re-planned %v from a cycle that planned for generation %d; the spec is now at %d", got, alb.Generation-1, alb.Generation)
	}
	alb.Generation--
	// A recreated AdaptiveLoadBalancer of the same name does not inherit the plan.
	alb.Spec.Algorithm, alb.UID = adlbv1.AlgorithmCapacity, "uid-2"
	if got, _ := m.replanWeights(alb, se, built); got != nil {
		t.Fatalf("a new AdaptiveLoadBalancer re-planned from its predecessor's cycle: %v", got)
	}
}

// A survivor whose address was taken by another pod since the last cycle (the pod that was
// observed left, a new one got its IP) has no observation of its own: the re-plan must not hand
// it the departed pod's measurements and weight. Same when the pod at an address changed
// between two mirror writes without the address ever leaving the ServiceEntry.
func TestReplanWeights_NotFromAnotherPodsObservationsAtAReusedAddress(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	m := NewMembership(clk)
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "uid-1"}}
	alb.Spec.Algorithm = adlbv1.AlgorithmCapacity
	ip := func(i int) string { return fmt.Sprintf("10.0.0.%d", i) }
	listed := func(pods ...string) []MemberEndpoint {
		var out []MemberEndpoint
		for i, p := range pods {
			if p != "" {
				out = append(out, MemberEndpoint{IP: ip(i + 1), Pod: p, Weight: 100})
			}
		}
		return out
	}
	var eps []weights.Endpoint
	for i := 1; i <= 4; i++ {
		eps = append(eps, weights.Endpoint{ID: ip(i), CPUCores: 0.5, RequestRate: 100, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 100})
	}
	eps[1].CPUCores, eps[2].CPUCores = 0.2, 1.5 // uneven: the re-plan moves the weights
	plan := cycle.Target{Key: key.String(), Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmCapacity), WindowSeconds: 60, RecentPeakRequestRate: 400}
	se := func(pods ...string) *networkingv1.ServiceEntry {
		s := &networkingv1.ServiceEntry{}
		for _, e := range listed(pods...) {
			s.Spec.Endpoints = append(s.Spec.Endpoints, &apinetworkingv1.WorkloadEntry{Address: e.IP, Weight: e.Weight})
		}
		return s
	}
	built := func(pods ...string) []istio.Endpoint {
		var out []istio.Endpoint
		for _, e := range listed(pods...) {
			out = append(out, istio.Endpoint{Pod: e.Pod, IP: e.IP, Weight: e.Weight})
		}
		return out
	}

	m.Observe(key, listed("web-1", "web-2", "web-3", "web-4"))
	clk.Step(10 * time.Second)
	m.RecordPlan(alb, time.Minute, plan, 0)
	if got, _ := m.replanWeights(alb, se("web-1", "web-2", "web-3", "web-4"), built("web-1", "web-2", "web-3", "")); got == nil {
		t.Fatal("no re-plan when web-4 leaves: the scenario cannot tell a refused re-plan from none")
	}

	// web-1 leaves; web-9 comes up on its address; then web-4 leaves.
	clk.Step(5 * time.Second)
	m.Observe(key, listed("", "web-2", "web-3", "web-4"))
	clk.Step(5 * time.Second)
	m.Observe(key, listed("web-9", "web-2", "web-3", "web-4"))
	if got, _ := m.replanWeights(alb, se("web-9", "web-2", "web-3", "web-4"), built("web-9", "web-2", "web-3", "")); got != nil {
		t.Fatalf("re-planned %v: web-9 was given web-1's observations at the reused address", got)
	}

	// The pod at 10.0.0.1 changes between two mirror writes without the address leaving.
	m = NewMembership(clk)
	m.Observe(key, listed("web-1", "web-2", "web-3", "web-4"))
	clk.Step(10 * time.Second)
	m.RecordPlan(alb, time.Minute, plan, 0)
	clk.Step(5 * time.Second)
	m.Observe(key, listed("web-9", "web-2", "web-3", "web-4"))
	if got, _ := m.replanWeights(alb, se("web-9", "web-2", "web-3", "web-4"), built("web-9", "web-2", "web-3", "")); got != nil {
		t.Fatalf("re-planned %v: web-9 took over web-1's address between two writes and was given its observations", got)
	}
}

// getHook runs before on the first Get of a ServiceEntry named name once armed says so, then
// reads through.
type getHook struct {
	client.Client
	name   string
	armed  func() bool
	before func()
	done   bool
}

func (h *getHook) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*networkingv1.ServiceEntry); ok && key.Name == h.name && !h.done && h.armed() {
		h.done = true
		h.before()
	}
	return h.Client.Get(ctx, key, obj, opts...)
}

// A pod that leaves while a weight cycle is between its plan and its write: the mirror re-plans
// the survivors from the cycle's fresh inputs, and the cycle's decision, which still counts the
// departed pod's capacity, must not overwrite them a moment later.
func TestMirror_ReplanIsNotUndoneByTheWriteOfACycleThatPlannedBeforeThePodLeft(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.withoutSurgeBound()
	lf.load(replanCores, replanRPS)
	var got map[string]int
	// The cycle reads the ServiceEntry to plan, and again to write, after it recorded its plan.
	planned := func() bool {
		sharedMembership.plans.mu.Lock()
		defer sharedMembership.plans.mu.Unlock()
		_, ok := sharedMembership.plans.byKey[lf.key()]
		return ok
	}
	lf.loop.Client = &getHook{Client: lf.loop.Client, name: "web", armed: planned, before: func() { _, got, _ = lf.dropPod(1) }}
	rep := lf.run()
	if got == nil {
		t.Fatal("the cycle never read the ServiceEntry to write its weights: the scenario does not test the race")
	}
	in := rep.Inputs[lf.key()]
	replanned := lf.survivorsReplan(t, in)
	cycleWeights := rep.Outcomes[lf.key()].Decision.Weights()
	final := lf.weights()
	differs := false
	for _, r := range replanned.Endpoints {
		if got[r.ID] != r.Weight {
			t.Fatalf("the mirror wrote %v, the re-plan computes %d for %s", got, r.Weight, r.ID)
		}
		if final[r.ID] != r.Weight {
			t.Fatalf("survivor %s has weight %d after the cycle, the mirror's re-plan %d: the cycle's decision for the old membership %v undid the re-plan %v (now %v)", r.ID, final[r.ID], r.Weight, cycleWeights, got, final)
		}
		differs = differs || cycleWeights[r.ID] != r.Weight
	}
	if !differs {
		t.Fatalf("the cycle's decision %v equals the re-plan %v: the scenario cannot tell one from the other", cycleWeights, got)
	}
	if o := rep.Outcomes[lf.key()]; o.Action == cycle.ActionWrite || lf.wrote(rep) != 0 {
		t.Fatalf("the cycle reports %s (%d writes) though the re-plan superseded its decision: %s", o.Action, lf.wrote(rep), o.Reason)
	}
}

// The weights the mirror re-planned are named as such in the status until the next cycle
// records its plan; an endpoint whose weight did not change keeps the cycle's reason.
func TestEndpointStatus_NamesTheMirrorsReplannedWeights(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	m := NewMembership(clk)
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "uid-1"}}
	m.RecordPlan(alb, time.Minute, cycle.Target{Key: key.String()}, 0)
	m.Replanned(key, map[string]uint32{"10.0.0.2": 100, "10.0.0.3": 28}, appliedWeights{})
	replanned := func(ip string, w uint32) bool { return m.ReplannedWeight(key, ip, w) }

	earlier := metav1.NewTime(clk.Now().Add(-time.Minute))
	now := metav1.NewTime(clk.Now())
	previous := []adlbv1.EndpointStatus{
		{Pod: "web-1", IP: "10.0.0.1", Weight: 100, Reason: weights.ReasonTail, LastChange: &earlier},
		{Pod: "web-2", IP: "10.0.0.2", Weight: 100, Reason: weights.ReasonTail, LastChange: &earlier},
		{Pod: "web-3", IP: "10.0.0.3", Weight: 13, Reason: weights.ReasonTail, LastChange: &earlier},
	}
	mirrored := []istio.Endpoint{{Pod: "web-2", IP: "10.0.0.2", Weight: 100}, {Pod: "web-3", IP: "10.0.0.3", Weight: 28}}
	got, _ := endpointStatus(previous, mirrored, now, false, replanned)
	if got[0].Reason != weights.ReasonTail || got[1].Reason != ReasonReplanned || !got[1].LastChange.Equal(&now) {
		t.Fatalf("status %+v: want web-2's unchanged weight with the cycle's reason, web-3's re-planned one named as such", got)
	}

	// The next cycle records its plan: its own status write owns the reasons from then on.
	m.RecordPlan(alb, time.Minute, cycle.Target{Key: key.String()}, 0)
	if got, _ := endpointStatus(previous, mirrored, now, false, replanned); got[1].Reason != "" {
		t.Fatalf("web-3 still named as re-planned after the next cycle: %+v", got[1])
	}
}

// Issue 21.9: while a fast pod flaps (it leaves, comes back, leaves again, with weight cycles in
// between), the re-plan must not ratchet the other pods' weights up: the weights re-planned when
// it left are undone when it comes back, and each departure re-plans from the same weights.
func TestMirror_AFlappingPodDoesNotRatchetTheReplan(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.withoutSurgeBound()
	written := lf.adapt(replanCores, replanRPS)
	var first map[string]int
	var previous map[string]int
	for flap := 1; flap <= 5; flap++ {
		lf.clock.Step(time.Second)
		_, replanned, _ := lf.dropPod(1)
		t.Logf("flap %d: web-1 left: %v", flap, orderedWeights(lf.ips, replanned))
		if first == nil {
			first = replanned
			if replanned[lf.ips[5]] == written[lf.ips[5]] {
				t.Fatalf("the re-plan kept the slow pod's weight %d: the scenario does not test it", written[lf.ips[5]])
			}
		}
		// Each departure re-plans from the weights before it (restored below), on the same
		// observations: the same re-plan every time. The first two re-plan from the plan the
		// cycle recorded for the equal first weights; from the third on the plan starts from the
		// adapted weights and the re-plan may differ from the first, but a ratchet would move
		// it again with every flap.
		for _, ip := range lf.ips[1:] {
			if flap >= 4 && replanned[ip] != previous[ip] {
				t.Fatalf("flap %d: %s re-planned to %d, the previous departure's re-plan from the same weights gave %d: the re-plan ratchets (%v, previous %v, first %v)",
					flap, ip, replanned[ip], previous[ip], orderedWeights(lf.ips, replanned), orderedWeights(lf.ips, previous), orderedWeights(lf.ips, first))
			}
		}
		previous = replanned
		lf.waitForMembership(lf.ips[0], false)
		lf.clock.Step(time.Second)
		lf.slice("web", "web-x", lf.allReady()...)
		back := lf.waitForAddresses("web", lf.ips...)
		got := map[string]int{}
		for _, e := range back.Spec.Endpoints {
			got[e.Address] = int(e.Weight)
		}
		for _, ip := range lf.ips {
			if got[ip] != written[ip] {
				t.Fatalf("flap %d: web-1 is back, yet %s has weight %d, not the %d it had before web-1 left (%v)", flap, ip, got[ip], written[ip], orderedWeights(lf.ips, got))
			}
		}
		lf.waitForMembership(lf.ips[0], true)
		// A weight cycle while it is back plans from the weights in force.
		lf.clock.Step(time.Second)
		lf.load(replanCores, replanRPS)
		lf.run()
	}
}
