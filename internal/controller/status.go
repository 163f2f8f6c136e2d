package controller

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// Status ownership. Two writers share an AdaptiveLoadBalancer's status: the reconciler (the
// endpoint mirror) and the weight cycle. Each condition has one owner:
//
//   - EndpointsMirrored, observedGeneration, serviceEntry, endpointCount and the endpoint list's
//     membership (pod, ip, zone, weight outside DryRun): the reconciler;
//   - MetricsAvailable, WeightsApplied, lastWeightWrite and each endpoint's reason and signals
//     (and weight in DryRun): the weight cycle. Two exceptions, both tied to the ServiceEntry's
//     existence, which the reconciler decides: it sets WeightsApplied=False NoServiceEntry when
//     there is no ServiceEntry (Unsupported, NoPorts, TargetNotFound, Conflict, not owned), and
//     the placeholder that only states the mode (EqualWeights, DryRun, Frozen) when it has just
//     written one or when the spec changed and the condition only stated the old mode (without
//     a TSDB no cycle runs to do it); it adds the MetricsAvailable placeholder while that
//     condition is absent;
//   - Ready is derived: every writer recomputes it from the other three as it writes.
//
// Every write is a read-modify-write under an optimistic lock (the patch carries the
// resourceVersion it was computed from), so neither writer can overwrite what the other wrote
// since its read: a conflict re-reads the object from the API server and recomputes.

// statusWriteAttempts bounds the conflict retries of one status write; the caller's next
// reconcile or cycle retries after that.
const statusWriteAttempts = 5

// updateStatus applies mutate to alb and writes the status if it changed, recomputing Ready
// first. mutate works on the object as read, and returns false to write nothing. On a conflict
// the object is read again from reader (uncached) and mutate runs again on the fresh copy. A
// deleted object is not an error. It reports whether a write happened; alb holds what was
// written (or the last version read).
func updateStatus(ctx context.Context, c client.Client, reader client.Reader, alb *adlbv1.AdaptiveLoadBalancer, mutate func(*adlbv1.AdaptiveLoadBalancer) bool) (bool, error) {
	if reader == nil {
		reader = c
	}
	key := client.ObjectKeyFromObject(alb)
	for attempt := 1; ; attempt++ {
		base := alb.DeepCopy()
		if !mutate(alb) {
			return false, nil
		}
		meta.SetStatusCondition(&alb.Status.Conditions, readyCondition(alb.Status.Conditions, alb.Generation))
		if apiequality.Semantic.DeepEqual(&base.Status, &alb.Status) {
			return false, nil
		}
		err := c.Status().Patch(ctx, alb, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case !apierrors.IsConflict(err) || attempt == statusWriteAttempts:
			return false, fmt.Errorf("update status of AdaptiveLoadBalancer %s: %w", key, err)
		}
		fresh := &adlbv1.AdaptiveLoadBalancer{}
		if err := reader.Get(ctx, key, fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return false, fmt.Errorf("re-read AdaptiveLoadBalancer %s after a status conflict: %w", key, err)
		}
		*alb = *fresh
	}
}

// readyCondition summarises the other conditions. Ready is False, with the first failing
// condition's reason and message, when the endpoints are not mirrored, the weights could not be
// written or wait for the budget, or the metrics are failing, stale or partly broken; Unknown
// before the mirror has reported; True otherwise (DryRun and Frozen are deliberate, not faults).
func readyCondition(conds []metav1.Condition, gen int64) metav1.Condition {
	ready := metav1.Condition{Type: adlbv1.ConditionReady, ObservedGeneration: gen}
	mirrored := meta.FindStatusCondition(conds, adlbv1.ConditionEndpointsMirrored)
	if mirrored == nil {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionUnknown, adlbv1.ReasonPending, "the endpoint mirror has not reported yet"
		return ready
	}
	if mirrored.Status != metav1.ConditionTrue {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, mirrored.Reason, mirrored.Message
		return ready
	}
	if w := meta.FindStatusCondition(conds, adlbv1.ConditionWeightsApplied); w != nil && w.Status == metav1.ConditionFalse &&
		w.Reason != adlbv1.ReasonDryRun && w.Reason != adlbv1.ReasonFrozen {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, w.Reason, "WeightsApplied: "+w.Message
		return ready
	}
	if m := meta.FindStatusCondition(conds, adlbv1.ConditionMetricsAvailable); m != nil && m.Status == metav1.ConditionFalse {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, m.Reason, "MetricsAvailable: "+m.Message
		return ready
	}
	ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, mirrored.Reason, mirrored.Message
	if w := meta.FindStatusCondition(conds, adlbv1.ConditionWeightsApplied); w != nil {
		ready.Message += "; weights: " + w.Reason
	}
	return ready
}

// statusThrottle spaces one writer's status writes that carry only a minor change (the mirror's
// endpoint list, the weight cycle's per-endpoint signals): it remembers when each
// AdaptiveLoadBalancer's status was last written. It lives in memory only: a new leader's first
// write of each object goes out at once, which costs one write, never a wrong status.
type statusThrottle struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

// wait returns how long a minor write of key's status must still wait at now to keep interval
// after the last write; 0 when it may go now.
func (t *statusThrottle) wait(key types.NamespacedName, now time.Time, interval time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	last, ok := t.last[key]
	if !ok {
		return 0
	}
	return max(interval-now.Sub(last), 0)
}

// wrote records a status write of key at now.
func (t *statusThrottle) wrote(key types.NamespacedName, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[types.NamespacedName]time.Time{}
	}
	t.last[key] = now
}

// retain forgets every AdaptiveLoadBalancer for which keep is false.
func (t *statusThrottle) retain(keep func(types.NamespacedName) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	maps.DeleteFunc(t.last, func(key types.NamespacedName, _ time.Time) bool { return !keep(key) })
}
