package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// DefaultStaleServiceEntryTimeout is how long the mirror of a Service may keep failing before
// its ServiceEntry is deleted: long enough for an API server hiccup, a leader change or a
// rolling restart of the API servers, short against the minutes a refused write (a webhook or a
// policy that rejects it, a Role that lost a verb) would otherwise freeze the endpoints for.
const DefaultStaleServiceEntryTimeout = 2 * time.Minute

// Results for adaptivelb_stale_serviceentry_deletions_total.
const (
	StaleDeletionDeleted = "deleted"
	StaleDeletionFailed  = "failed"
)

// EventStaleServiceEntryRemoved is the Warning event of a ServiceEntry deleted because the mirror
// kept failing; EventStaleServiceEntryNotRemoved says that deletion failed too.
const (
	EventStaleServiceEntryRemoved    = adlbv1.ReasonStaleServiceEntryRemoved
	EventStaleServiceEntryNotRemoved = "StaleServiceEntryNotRemoved"
)

func (r *AdaptiveLoadBalancerReconciler) staleTimeout() time.Duration {
	if r.StaleServiceEntryTimeout > 0 {
		return r.StaleServiceEntryTimeout
	}
	return DefaultStaleServiceEntryTimeout
}

// mirrorFailed records a failed mirror of alb and returns when the failures began: the earliest
// of seed (when the failure is known to have begun, e.g. when an informer went blind), what this
// process already recorded, and what the status records. The status matters after a leader
// change: the new leader's memory is empty, and a deadline that restarted with every leader would
// never pass under an API brownout that moves leadership every minute or two. The status keeps
// it in EndpointsMirrored's lastTransitionTime (the condition turned False when the mirror began
// failing, and stays False while it fails).
func (r *AdaptiveLoadBalancerReconciler) mirrorFailed(alb *adlbv1.AdaptiveLoadBalancer, seed time.Time) time.Time {
	key := client.ObjectKeyFromObject(alb)
	if persisted, ok := persistedFailingSince(alb); ok && persisted.Before(seed) {
		seed = persisted
	}
	for {
		v, loaded := r.failingSince.LoadOrStore(key, seed)
		if !loaded {
			return seed
		}
		stored := v.(time.Time)
		if !seed.Before(stored) {
			return stored
		}
		if r.failingSince.CompareAndSwap(key, stored, seed) {
			return seed
		}
	}
}

// persistedFailingSince reads from alb's status when its mirror began failing, if it is failing:
// EndpointsMirrored False for a failed mirror (WriteFailed, CacheStale) or for a ServiceEntry
// already removed for it (StaleServiceEntryRemoved). The reasons that say the Service cannot be
// mirrored (TargetNotFound, Conflict, …) are outcomes, not failures.
func persistedFailingSince(alb *adlbv1.AdaptiveLoadBalancer) (time.Time, bool) {
	c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored)
	if c == nil || c.Status != metav1.ConditionFalse || c.LastTransitionTime.IsZero() {
		return time.Time{}, false
	}
	switch c.Reason {
	case adlbv1.ReasonWriteFailed, adlbv1.ReasonCacheStale, adlbv1.ReasonStaleServiceEntryRemoved:
		return c.LastTransitionTime.Time, true
	}
	return time.Time{}, false
}

// untilStale is how long key's mirror may still fail before its ServiceEntry is deleted; false
// when it is not failing.
func (r *AdaptiveLoadBalancerReconciler) untilStale(key types.NamespacedName) (time.Duration, bool) {
	since, ok := r.failingSince.Load(key)
	if !ok {
		return 0, false
	}
	return r.staleTimeout() - r.Clock.Since(since.(time.Time)), true
}

// removeStale handles a failed mirror (mirrorErr). While the failures are younger than the
// timeout the ServiceEntry keeps its last written endpoints (WriteFailed or CacheStale, retried
// with back-off). Past it, the ServiceEntry no longer follows the endpoints: Envoy would keep
// preferring its copy of every address, also of pods that are gone, so it is deleted and the
// Service's clients use the Kubernetes endpoints until a mirror succeeds and writes a new one.
// A failed deletion is reported and retried with the reconcile.
func (r *AdaptiveLoadBalancerReconciler) removeStale(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, mirrorErr error) mirrorOutcome {
	reason, seed := adlbv1.ReasonWriteFailed, r.Clock.Now()
	var stale *cacheStaleError
	if errors.As(mirrorErr, &stale) {
		reason, seed = adlbv1.ReasonCacheStale, stale.since
	}
	failing := mirrorOutcome{status: metav1.ConditionFalse, reason: reason, message: mirrorErr.Error(), keepEndpoints: true}
	key := client.ObjectKeyFromObject(alb)
	since := r.mirrorFailed(alb, seed)
	if r.Clock.Since(since) < r.staleTimeout() {
		return failing
	}
	what := fmt.Sprintf("mirroring Service %s/%s has failed for longer than %v (since %s): %v", alb.Namespace, alb.Spec.TargetRef.Name,
		r.staleTimeout(), since.UTC().Format(time.RFC3339), mirrorErr)
	deleted, err := r.deleteControlledServiceEntry(ctx, alb)
	if err != nil {
		r.Metrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionFailed).Inc()
		failing.message = fmt.Sprintf("%s; deleting the ServiceEntry, which no longer follows the endpoints, failed too: %v. Both are retried with back-off; check the operator's RBAC (delete on serviceentries) and admission webhooks or policies.", what, err)
		r.Recorder.Event(alb, corev1.EventTypeWarning, EventStaleServiceEntryNotRemoved, failing.message)
		log.FromContext(ctx).Error(err, "cannot delete a stale ServiceEntry", "failingSince", since)
		return failing
	}
	msg := fmt.Sprintf("%s. Its ServiceEntry was deleted, so that clients use the Kubernetes endpoints, unweighted; it is re-created once a mirror succeeds (retried with back-off).", what)
	r.Membership.Forget(key)
	if deleted {
		r.Metrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionDeleted).Inc()
		r.Recorder.Event(alb, corev1.EventTypeWarning, EventStaleServiceEntryRemoved, msg)
		log.FromContext(ctx).Info("ServiceEntry deleted: its mirror keeps failing; traffic falls back to the Kubernetes endpoints",
			"serviceEntry", types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}, "failingSince", since, "error", mirrorErr.Error())
	}
	return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonStaleServiceEntryRemoved, message: msg}
}

// deleteControlledServiceEntry deletes the ServiceEntry slices of alb's target that alb
// controls, reading them from the API server (the cache may be what fails); it reports whether
// there was one to delete.
func (r *AdaptiveLoadBalancerReconciler) deleteControlledServiceEntry(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (bool, error) {
	key := types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}
	se := &networkingv1.ServiceEntry{}
	if err := r.apiReader.Get(ctx, key, se); apierrors.IsNotFound(err) {
		se = nil
	} else if err != nil {
		return false, fmt.Errorf("get ServiceEntry %s/%s: %w", key.Namespace, key.Name, err)
	}
	set, err := r.ownedSlices(ctx, alb, se, nil, sliceReads{listLive: true})
	if err != nil {
		return false, err
	}
	deleted := false
	var errs []error
	for _, name := range set.names() {
		_, gone, err := r.deleteIfControlled(ctx, alb, set.newest[name])
		deleted = deleted || gone
		errs = append(errs, err)
	}
	return deleted, errors.Join(errs...)
}

// staleDeadlineLimiter is the reconcile back-off, shortened so that a failing AdaptiveLoadBalancer
// is retried when its ServiceEntry turns stale: the exponential back-off alone would reach the
// deadline up to its cap (5 min) late.
type staleDeadlineLimiter struct {
	workqueue.TypedRateLimiter[reconcile.Request]
	untilStale func(types.NamespacedName) (time.Duration, bool)
}

func (l staleDeadlineLimiter) When(req reconcile.Request) time.Duration {
	d := l.TypedRateLimiter.When(req)
	if until, failing := l.untilStale(req.NamespacedName); failing && until > 0 && until < d {
		return until
	}
	return d
}
