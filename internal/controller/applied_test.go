package controller

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
)

// editWeight sets one endpoint's weight in the ServiceEntry as someone other than the operator
// would (kubectl edit).
func (lf *loopFixture) editWeight(ip string, weight uint32) {
	lf.t.Helper()
	se, err := lf.serviceEntry("web")
	if err != nil {
		lf.t.Fatal(err)
	}
	found := false
	for _, e := range se.Spec.Endpoints {
		if e.Address == ip {
			e.Weight, found = weight, true
		}
	}
	if !found {
		lf.t.Fatalf("the ServiceEntry lists no %s", ip)
	}
	if err := k8s.Update(lf.ctx, se); err != nil {
		lf.t.Fatal(err)
	}
}

// forgetInMemory drops everything the operator keeps in memory about the fixture's
// ServiceEntry, as a new leader starts: only what the API objects hold remains.
func (lf *loopFixture) forgetInMemory() {
	sharedVersions.forget(types.NamespacedName{Namespace: lf.ns, Name: "web"})
	sharedMembership.Forget(lf.key())
}

// Issue 21.5: a weight someone edits by hand in the ServiceEntry is reverted to the weight the
// operator applied, in Active and in Frozen mode, and also by an operator that has just started
// and knows of the ServiceEntry only what the API server holds.
func TestMirror_RevertsAForeignWeightEditInEveryModeAndAfterARestart(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	applied := lf.adapt(skewedCores, equalRPS)
	if applied[lf.ips[0]] == applied[lf.ips[5]] {
		t.Fatalf("weights %v: the scenario needs adapted (unequal) weights", applied)
	}

	lf.editWeight(lf.ips[0], 999)
	lf.waitForWeights(applied)

	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeFrozen })
	lf.clock.Step(loopInterval)
	lf.run()
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonFrozen)
	lf.editWeight(lf.ips[5], 999)
	lf.waitForWeights(applied)

	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeActive })
	lf.forgetInMemory()
	lf.editWeight(lf.ips[0], 999)
	lf.waitForWeights(applied)

	// A membership change keeps the applied weights too, without anything in memory.
	lf.forgetInMemory()
	lf.joinSeventh()
	lf.waitForWeights(applied)
}

// Issue 21.6: a new pod that takes over a departed pod's address in one EndpointSlice update
// (the address never leaves the ServiceEntry) starts at its own instance type's weight, not at
// its predecessor's, and the weight cycle does not keep that weight as if it were the pod's own.
func TestMirror_APodAtAReusedAddressDoesNotInheritItsPredecessorsWeight(t *testing.T) {
	requireVM(t)
	lf := newLoopFixture(t, adlbv1.ModeActive, withInstanceTypes(newFixtureFor(t)))
	lf.useCapacity()
	adapted := lf.adapt(skewedCores, equalRPS)
	fast, slow := adapted[lf.ips[0]], adapted[lf.ips[4]]
	if slow != adapted[lf.ips[5]] || fast <= slow {
		t.Fatalf("weights %v: the scenario needs fast pods above two equal slow ones", orderedWeights(lf.ips, adapted))
	}

	// web-1 (fast machine) is gone; web-7, on the slow machine type, comes up on its address.
	if err := k8s.Delete(lf.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: lf.ns, Name: "web-1"}}); err != nil {
		t.Fatal(err)
	}
	lf.pod("web", "web-7", lf.ips[0], withCPULimit("2"), func(p *corev1.Pod) { p.Spec.NodeName = "slow-node" })
	eps := []sliceEndpoint{ready("web-7", lf.ips[0])}
	for i, ip := range lf.ips[1:] {
		eps = append(eps, ready(fmt.Sprintf("web-%d", i+2), ip))
	}
	lf.slice("web", "web-x", eps...)
	lf.eventually("the mirror lists web-7 at its address", func() error {
		sharedMembership.mu.Lock()
		defer sharedMembership.mu.Unlock()
		if l, ok := sharedMembership.byKey[lf.key()]; ok && l.weight[lf.ips[0]].pod == "web-7" {
			return nil
		}
		return errNotYet
	})
	if got := lf.weights()[lf.ips[0]]; got != slow {
		t.Fatalf("web-7 (slow machine) at web-1's address has weight %d, want its instance type's %d, not web-1's %d", got, slow, fast)
	}

	// web-7 has no metrics yet: the cycle must not keep its weight as one it earned itself.
	lf.clock.Step(loopInterval)
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	in := rep.Inputs[lf.key()]
	if in.Known[lf.ips[0]] {
		t.Errorf("the cycle takes web-7's weight as learnt from its own metrics: those were web-1's")
	}
	for _, r := range rep.Outcomes[lf.key()].Decision.Endpoints {
		if r.ID == lf.ips[0] && r.Reason == cycle.ReasonNoMetricsKept {
			t.Errorf("web-7's weight %d is kept as its last good one (%q): it never had metrics", r.Weight, r.Reason)
		}
	}
}

// Issue 21.4: the mirror's re-plan counts as written only once its write has landed. When a
// pod leaves while a weight cycle is between its plan and its write, and the mirror's write that
// would drop the pod and re-plan the others fails, the cycle must not yield to that re-plan and
// report "the re-planned weights are kept": the ServiceEntry holds none.
func TestWeightCycle_DoesNotYieldToAReplanWhoseWriteFailed(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(replanCores, replanRPS)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("first cycle: %+v", rep.Outcomes[lf.key()])
	}
	lf.clock.Step(3 * loopInterval)
	lf.load([]float64{0.45, 0.45, 1.2, 1.2, 1.2, 1.2}, []float64{50, 50, 400, 400, 400, 400}) // costs reversed: new weights needed

	fault := &apiFault{status: metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}}
	defer apiFaults.Delete(lf.ns)
	planned := func() bool {
		sharedMembership.plans.mu.Lock()
		defer sharedMembership.plans.mu.Unlock()
		return sharedMembership.plans.byKey[lf.key()].at.Equal(lf.clock.Now())
	}
	var attemptsBefore int64
	leave := func() {
		// web-1 leaves: the mirror's write, which would drop it and re-plan the others, fails.
		apiFaults.Store(lf.ns, fault)
		var eps []sliceEndpoint
		for i, ip := range lf.ips[1:] {
			eps = append(eps, ready(fmt.Sprintf("web-%d", i+2), ip))
		}
		lf.slice("web", "web-x", eps...)
		lf.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
		attemptsBefore = fault.attempts.Load()
	}
	lf.loop.Client = &getHook{Client: lf.loop.Client, name: "web", armed: planned, before: leave}
	rep := lf.run()
	if attemptsBefore == 0 {
		t.Fatal("the mirror never tried to write while the cycle planned: the scenario does not test the race")
	}
	if got := len(lf.weights()); got != len(lf.ips) {
		t.Fatalf("the ServiceEntry lists %d endpoints: the injected fault did not stop the mirror's write", got)
	}
	o := rep.Outcomes[lf.key()]
	if strings.Contains(o.Reason, "re-planned") || o.Action != cycle.ActionWrite {
		t.Fatalf("the cycle yields to a re-plan that never landed: %s: %s", o.Action, o.Reason)
	}
	if fault.attempts.Load() == attemptsBefore {
		t.Fatalf("the cycle reports a write it never attempted: %s", o.Reason)
	}
}

// Issue 21.4: when the TSDB is gone for longer than the hold time, every Service fails open in
// the same cycle whatever the write budget, and what the status and the events say is what the
// ServiceEntries carry.
func TestWeightCycle_EveryServiceFailsOpenInOneCycleWhateverTheBudget(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.addService("api")
	lf.loop.Budget = 1
	lf.load(skewedCores, equalRPS)
	for range 2 { // one write per cycle
		lf.run()
		lf.clock.Step(loopInterval)
		lf.load(skewedCores, equalRPS)
	}
	for _, name := range []string{"web", "api"} {
		if w := lf.weightsOf(name); w[lf.ips[0]] == w[lf.ips[5]] {
			t.Fatalf("%s: weights %v; the scenario needs both Services adapted", name, w)
		}
	}

	lf.vm.Stop() // the last good metrics were one interval ago
	for i := range 4 {
		if i > 0 {
			lf.clock.Step(loopInterval)
		}
		if o := lf.run().Outcomes[lf.key()]; o.Action != cycle.ActionHold {
			t.Fatalf("outage cycle %d: %s, want Hold (%s)", i+1, o.Action, o.Reason)
		}
	}
	lf.clock.Step(loopInterval) // five intervals since the last good metrics
	rep := lf.run()
	for _, name := range []string{"web", "api"} {
		key := types.NamespacedName{Namespace: lf.ns, Name: name}
		if o := rep.Outcomes[key]; o.Action != cycle.ActionWrite || !o.Fallback {
			t.Errorf("%s after the hold time: %s (fallback %v): %s", name, o.Action, o.Fallback, o.Reason)
		}
		for ip, w := range lf.weightsOf(name) {
			if w != 100 {
				t.Errorf("%s: %s still has weight %d after the fallback cycle", name, ip, w)
			}
		}
		lf.waitForCondition(name, adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonFallback)
	}
	fallbacks := 0
	for _, ev := range lf.drainEvents() {
		if strings.HasPrefix(ev, "Warning "+EventFallback) {
			fallbacks++
		}
	}
	if fallbacks != 2 {
		t.Errorf("%d %s events, want one per Service", fallbacks, EventFallback)
	}
}
