package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The mirror refreshes the status endpoint list from the ServiceEntry; the weight cycle fills in
// the signals, reasons and (in DryRun) the weights it computed. A refresh must not erase them.
func TestEndpointStatus_RefreshKeepsTheWeightCyclesView(t *testing.T) {
	earlier := metav1.NewTime(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	now := metav1.NewTime(earlier.Add(time.Minute))
	previous := []adlbv1.EndpointStatus{
		{Pod: "a", IP: "10.0.0.1", Weight: 250, Reason: "share from estimated capacity", CPUCores: "0.700", RequestRate: "70.0", LastChange: &earlier},
		{Pod: "b", IP: "10.0.0.2", Weight: 40, Reason: "share from estimated capacity", CPUCores: "0.300", RequestRate: "12.0", LastChange: &earlier},
	}
	mirrored := []istio.Endpoint{ // the ServiceEntry: equal weights in DryRun, a new pod c
		{Pod: "a", IP: "10.0.0.1", Weight: 100}, {Pod: "b", IP: "10.0.0.2", Weight: 100}, {Pod: "c", IP: "10.0.0.3", Weight: 100},
	}

	t.Run("DryRun keeps the computed weights, reasons and signals", func(t *testing.T) {
		got, _ := endpointStatus(previous, mirrored, now, true, nil)
		if got[0].Weight != 250 || got[1].Weight != 40 || got[0].Reason == "" || got[1].CPUCores != "0.300" || !got[0].LastChange.Equal(&earlier) {
			t.Errorf("the refresh replaced the weight cycle's view: %+v", got[:2])
		}
		if got[2].Weight != 100 || got[2].Reason != "" || !got[2].LastChange.Equal(&now) {
			t.Errorf("a new pod should show the ServiceEntry's weight, changed now: %+v", got[2])
		}
	})
	t.Run("Active shows the written weight; a changed weight drops the stale reason", func(t *testing.T) {
		active := []istio.Endpoint{{Pod: "a", IP: "10.0.0.1", Weight: 250}, {Pod: "b", IP: "10.0.0.2", Weight: 55}}
		got, _ := endpointStatus(previous, active, now, false, nil)
		if got[0].Weight != 250 || got[0].RequestRate != "70.0" || !got[0].LastChange.Equal(&earlier) {
			t.Errorf("an unchanged endpoint lost its signals: %+v", got[0])
		}
		if got[1].Weight != 55 || got[1].Reason != "" || !got[1].LastChange.Equal(&now) {
			t.Errorf("a weight written by someone else should show as changed now, without the old reason: %+v", got[1])
		}
	})
	t.Run("a reused IP of another pod starts fresh", func(t *testing.T) {
		got, _ := endpointStatus(previous, []istio.Endpoint{{Pod: "z", IP: "10.0.0.1", Weight: 100}}, now, true, nil)
		if got[0].Weight != 100 || got[0].Reason != "" || got[0].CPUCores != "" {
			t.Errorf("pod z inherited pod a's status: %+v", got[0])
		}
	})
}

// The per-endpoint CPU and request rate change every cycle; written each time they would cost
// one status patch per AdaptiveLoadBalancer per interval. They are refreshed every
// statusSignalsInterval; anything else that changes is written at once.
func TestWeightCycle_StatusSignalsAreThrottled(t *testing.T) {
	w := &WeightCycle{}
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	status := func(cpu string, weight int32) *adlbv1.AdaptiveLoadBalancerStatus {
		return &adlbv1.AdaptiveLoadBalancerStatus{Endpoints: []adlbv1.EndpointStatus{{Pod: "a", IP: "10.0.0.1", Weight: weight, CPUCores: adlbv1.Decimal(cpu)}}}
	}
	if !w.skipStatusWrite(key, status("0.5", 100), status("0.5", 100), t0) {
		t.Error("an unchanged status was written")
	}
	if w.skipStatusWrite(key, status("0.5", 100), status("0.6", 100), t0) {
		t.Error("the first signals were not written")
	}
	if !w.skipStatusWrite(key, status("0.6", 100), status("0.7", 100), t0.Add(time.Minute)) {
		t.Error("signals alone were written again within the interval")
	}
	if w.skipStatusWrite(key, status("0.6", 100), status("0.7", 120), t0.Add(2*time.Minute)) {
		t.Error("a weight change was held back")
	}
	if w.skipStatusWrite(key, status("0.7", 120), status("0.8", 120), t0.Add(2*time.Minute+statusSignalsInterval)) {
		t.Error("signals were not refreshed after the interval")
	}
}

// Issue 13.5: the reconciler and the weight cycle each write only their own conditions, under
// an optimistic lock. A reconciler working from a cached copy older than the cycle's last
// write must not put the old MetricsAvailable back, nor drop the reason of the weight the cycle
// wrote; Ready summarises what is there.
func TestStatus_AStaleWriterDoesNotOverwriteTheOtherOwnersConditions(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.41.0.1")
	f.slice("web", "web-x", ready("web-1", "10.41.0.1"))
	f.alb("web", "web")
	f.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics)
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	stale := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, stale); err != nil {
		t.Fatal(err)
	}

	// The weight cycle reports an outage meanwhile, and has written a weight with its reason.
	cycleView := stale.DeepCopy()
	if _, err := updateStatus(f.ctx, k8s, k8s, cycleView, func(a *adlbv1.AdaptiveLoadBalancer) bool {
		meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionFalse,
			Reason: adlbv1.ReasonMetricsFailed, Message: "TSDB unreachable", ObservedGeneration: a.Generation})
		a.Status.Endpoints[0].Weight, a.Status.Endpoints[0].Reason = 250, "share from estimated capacity"
		return true
	}); err != nil {
		t.Fatal(err)
	}

	// The reconciler, still holding the older copy, reports a new mirror outcome: the
	// ServiceEntry now carries the cycle's weight.
	r := &AdaptiveLoadBalancerReconciler{Client: k8s, apiReader: k8s, Clock: clock.RealClock{}, Metrics: testMetrics}
	if _, err := r.writeStatus(f.ctx, stale, mirrorOutcome{status: metav1.ConditionTrue, reason: adlbv1.ReasonMirrored,
		message:      "ServiceEntry web mirrors the ready endpoints of Service web (refreshed)",
		serviceEntry: "web", endpoints: []istio.Endpoint{{Pod: "web-1", IP: "10.41.0.1", Zone: "eu-west-1a", Weight: 250}}}); err != nil {
		t.Fatal(err)
	}
	got := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, got); err != nil {
		t.Fatal(err)
	}
	m := meta.FindStatusCondition(got.Status.Conditions, adlbv1.ConditionMetricsAvailable)
	if m == nil || m.Reason != adlbv1.ReasonMetricsFailed {
		t.Fatalf("the reconciler's stale write replaced the weight cycle's MetricsAvailable: %+v", m)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || !strings.Contains(c.Message, "refreshed") {
		t.Fatalf("the reconciler's own condition was not written: %+v", c)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, adlbv1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != adlbv1.ReasonMetricsFailed {
		t.Fatalf("Ready should summarise the failing MetricsAvailable: %+v", c)
	}
	// Issue 15 ("per-endpoint reason empty after a weight write"): the refresh keeps the
	// cycle's reason for the weight it wrote.
	if e := got.Status.Endpoints; len(e) != 1 || e[0].Weight != 250 || e[0].Reason != "share from estimated capacity" {
		t.Fatalf("the reconciler's refresh dropped the weight cycle's reason: %+v", e)
	}
}

func TestReadyCondition_SummarisesTheOthers(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason + " message"}
	}
	mirrored := cond(adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	cases := map[string]struct {
		conds      []metav1.Condition
		wantStatus metav1.ConditionStatus
		wantReason string
	}{
		"nothing reported yet is Unknown": {nil, metav1.ConditionUnknown, adlbv1.ReasonPending},
		"mirrored, weights applied and metrics fine is True": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied),
			cond(adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)}, metav1.ConditionTrue, adlbv1.ReasonMirrored},
		"a mirror failure wins": {[]metav1.Condition{cond(adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonUnsupported),
			cond(adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)}, metav1.ConditionFalse, adlbv1.ReasonUnsupported},
		"a failed weight write is not Ready": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)}, metav1.ConditionFalse, adlbv1.ReasonWriteFailed},
		"DryRun is deliberate, not a fault": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonDryRun)}, metav1.ConditionTrue, adlbv1.ReasonMirrored},
		"stale metrics are not Ready": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied),
			cond(adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsStale)}, metav1.ConditionFalse, adlbv1.ReasonMetricsStale},
		"ambient clients without a waypoint are not Ready": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied),
			cond(adlbv1.ConditionWeightsEnforced, metav1.ConditionFalse, adlbv1.ReasonAmbientWithoutWaypoint),
			cond(adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)}, metav1.ConditionFalse, adlbv1.ReasonAmbientWithoutWaypoint},
		"weights enforced through a waypoint are Ready": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionWeightsEnforced, metav1.ConditionTrue, adlbv1.ReasonEnforcedByWaypoint)}, metav1.ConditionTrue, adlbv1.ReasonMirrored},
		"metrics not fetched yet is still Ready": {[]metav1.Condition{mirrored,
			cond(adlbv1.ConditionMetricsAvailable, metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics)}, metav1.ConditionTrue, adlbv1.ReasonMirrored},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := readyCondition(tc.conds, 3)
			if got.Status != tc.wantStatus || got.Reason != tc.wantReason || got.ObservedGeneration != 3 || got.Message == "" {
				t.Errorf("Ready = %s/%s (%q, generation %d), want %s/%s", got.Status, got.Reason, got.Message, got.ObservedGeneration, tc.wantStatus, tc.wantReason)
			}
		})
	}
}

// Issue 13.6: a new leader rebuilds the hold state from the status the previous one wrote.
func TestSeedState_ContinuesThePreviousLeadersHold(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	began := metav1.NewTime(now.Add(-time.Minute))
	with := func(conds ...metav1.Condition) *adlbv1.AdaptiveLoadBalancer {
		return &adlbv1.AdaptiveLoadBalancer{Status: adlbv1.AdaptiveLoadBalancerStatus{Conditions: conds}}
	}
	metricsCond := func(status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: status, Reason: reason, LastTransitionTime: began}
	}
	cases := map[string]struct {
		alb          *adlbv1.AdaptiveLoadBalancer
		wantLastGood time.Time
		wantFallback bool
	}{
		"metrics good: the hold starts at the first failure from now": {with(metricsCond(metav1.ConditionTrue, adlbv1.ReasonMetricsOK)), now, false},
		"an outage in progress continues from its start":              {with(metricsCond(metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)), began.Add(-30 * time.Second), false},
		"a fallback stays a fallback": {with(metricsCond(metav1.ConditionFalse, adlbv1.ReasonMetricsFailed),
			metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonFallback}), time.Time{}, true},
		"never fetched: nothing to hold": {with(metricsCond(metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics)), time.Time{}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st := seedState(tc.alb, now, 30*time.Second)
			if !st.LastGoodMetrics.Equal(tc.wantLastGood) || st.FallenBack != tc.wantFallback {
				t.Errorf("state %+v, want last good %v, fallen back %v", st, tc.wantLastGood, tc.wantFallback)
			}
		})
	}
}

// Without a TSDB no weight cycle runs: a mode change must still show in WeightsApplied, which
// then only states the mode.
func TestStatus_ModeChangesShowWithoutAWeightCycle(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.42.0.1")
	f.slice("web", "web-x", ready("web-1", "10.42.0.1"))
	f.alb("web", "web")
	f.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonEqualWeights)
	for _, step := range []struct {
		mode   adlbv1.Mode
		status metav1.ConditionStatus
		reason string
	}{
		{adlbv1.ModeDryRun, metav1.ConditionFalse, adlbv1.ReasonDryRun},
		{adlbv1.ModeFrozen, metav1.ConditionTrue, adlbv1.ReasonFrozen},
		{adlbv1.ModeActive, metav1.ConditionTrue, adlbv1.ReasonEqualWeights},
	} {
		// The operator writes the status meanwhile: a user's edit retries on a conflict too.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			a := &adlbv1.AdaptiveLoadBalancer{}
			if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, a); err != nil {
				return err
			}
			a.Spec.Mode = step.mode
			return k8s.Update(f.ctx, a)
		})
		if err != nil {
			t.Fatal(err)
		}
		f.waitForCondition("web", adlbv1.ConditionWeightsApplied, step.status, step.reason)
		f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	}
}
