package main

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// readyOf returns the AdaptiveLoadBalancer's Ready condition and endpoint count.
func (c *opsCluster) readyOf() (*metav1.Condition, int32) {
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, alb); err != nil {
		return nil, 0
	}
	return meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionReady), alb.Status.EndpointCount
}

// Issue 21.8: once the watchdog has deleted a ServiceEntry because no operator runs, its
// AdaptiveLoadBalancer no longer says Ready=True with the endpoints it had: it says the
// operator is unavailable and lists none, until an operator runs again.
func TestFailsafe_TheStatusSaysTheWatchdogRemovedTheServiceEntry(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(3)
	c.createALB()
	stopA, logsA := c.start("A", false)
	c.waitForEndpoints(3, logsA)
	c.waitFor("Ready=True with 3 endpoints", func() bool {
		ready, n := c.readyOf()
		return ready != nil && ready.Status == metav1.ConditionTrue && n == 3
	})
	stopWatchdog, watchdogLogs := c.startFailsafe("--stale-after", "3s", "--check-interval", "200ms")
	defer stopWatchdog()

	stopA() // a crash: no operator runs
	c.waitFor("the watchdog deletes the ServiceEntry", c.serviceEntryGone, watchdogLogs)
	c.waitFor("the status says the operator is unavailable, with no endpoints", func() bool {
		ready, n := c.readyOf()
		return ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == adlbv1.ReasonOperatorUnavailable && n == 0
	}, watchdogLogs)

	stopB, logsB := c.start("B", true)
	defer stopB()
	c.waitForEndpoints(3, logsB)
	c.waitFor("Ready=True again once an operator mirrors the Service", func() bool {
		ready, n := c.readyOf()
		return ready != nil && ready.Status == metav1.ConditionTrue && n == 3
	})
}

// Once the watchdog has deleted the ServiceEntry, nothing in the status claims it: no slices
// (the SLICES column), and the weights are not enforced, since there is no ServiceEntry to carry
// them, instead of the counts and WeightsEnforced the last operator wrote.
func TestFailsafe_AfterTheWatchdogDeletesNoStatusFieldClaimsTheServiceEntry(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(2)
	c.createALB()
	stopA, logsA := c.start("A", false)
	c.waitForEndpoints(2, logsA)
	status := func() adlbv1.AdaptiveLoadBalancerStatus {
		alb := &adlbv1.AdaptiveLoadBalancer{}
		if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, alb); err != nil {
			t.Fatal(err)
		}
		return alb.Status
	}
	c.waitFor("the operator reports one slice and whether its weights are enforced", func() bool {
		s := status()
		enforced := meta.FindStatusCondition(s.Conditions, adlbv1.ConditionWeightsEnforced)
		return s.ServiceEntrySlices == 1 && enforced != nil && enforced.Reason != adlbv1.ReasonNoServiceEntry
	})
	stopWatchdog, watchdogLogs := c.startFailsafe("--stale-after", "3s", "--check-interval", "200ms")
	defer stopWatchdog()

	stopA()
	c.waitFor("the watchdog deletes the ServiceEntry", c.serviceEntryGone, watchdogLogs)
	c.waitFor("the status says the operator is unavailable", func() bool {
		ready, _ := c.readyOf()
		return ready != nil && ready.Reason == adlbv1.ReasonOperatorUnavailable
	}, watchdogLogs)
	s := status()
	if s.ServiceEntry != "" || s.ServiceEntrySlices != 0 || s.EndpointCount != 0 || len(s.Endpoints) != 0 {
		t.Errorf("status claims ServiceEntry %q, %d slices, %d endpoints (%d listed) after the watchdog deleted it; want none", s.ServiceEntry, s.ServiceEntrySlices, s.EndpointCount, len(s.Endpoints))
	}
	for _, cond := range []string{adlbv1.ConditionWeightsApplied, adlbv1.ConditionWeightsEnforced} {
		if c := meta.FindStatusCondition(s.Conditions, cond); c == nil || c.Status != metav1.ConditionFalse || c.Reason != adlbv1.ReasonNoServiceEntry {
			t.Errorf("%s = %+v after the watchdog deleted the ServiceEntry; want False NoServiceEntry", cond, c)
		}
	}
}
