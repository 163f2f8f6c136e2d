package controller

import (
	"context"
	"fmt"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// EventOrphanDeleted is the event on a managed ServiceEntry deleted because no
// AdaptiveLoadBalancer owns it.
const EventOrphanDeleted = "OrphanDeleted"

// orphanReconciler deletes managed ServiceEntries whose AdaptiveLoadBalancer is gone: left by
// `kubectl delete adaptiveloadbalancer --cascade=orphan`, by an owner reference someone removed,
// or by an AdaptiveLoadBalancer deleted and re-created under the same name (another UID) whose
// mirror has not taken it over yet. Nothing would update them again, so they would route to the
// pods of the day they were last written, and Envoy prefers their copy of each address. The
// garbage collector only deletes what has an owner reference to a deleted object, and only while
// it can resolve the owner's kind. It runs on every managed ServiceEntry the cache lists (so once
// for all of them at start), on each change of one, and on the deletion of its owner
// (ownerDeleted).
type orphanReconciler struct {
	*AdaptiveLoadBalancerReconciler
}

func (o *orphanReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("serviceentry-orphans").
		For(&networkingv1.ServiceEntry{}, builder.WithPredicates(managedServiceEntry(), predicate.Funcs{
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		Watches(&adlbv1.AdaptiveLoadBalancer{}, o.ownerDeleted()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(o)
}

// ownerDeleted checks the ServiceEntries an AdaptiveLoadBalancer controlled when it is deleted.
// The garbage collector deletes them too, but not always: it may be slow or down, and when the
// AdaptiveLoadBalancer CRD is deleted (every AdaptiveLoadBalancer with it) it may no longer
// resolve the owners' kind. The operator does not wait for it.
func (o *orphanReconciler) ownerDeleted() handler.EventHandler {
	return handler.Funcs{
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			var owned networkingv1.ServiceEntryList
			if err := o.List(ctx, &owned, client.InNamespace(e.Object.GetNamespace()),
				client.MatchingFields{indexServiceEntryController: string(e.Object.GetUID())}, client.UnsafeDisableDeepCopy); err != nil {
				return
			}
			for _, se := range owned.Items {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(se)})
			}
		},
	}
}

// managedServiceEntry passes ServiceEntries labelled as the operator's.
func managedServiceEntry() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[ManagedByLabel] == ManagedByValue
	})
}

// Reconcile deletes one managed ServiceEntry if no live AdaptiveLoadBalancer controls it.
func (o *orphanReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if !o.Activity.enter() {
		return ctrl.Result{}, nil
	}
	defer o.Activity.exit()
	se := &networkingv1.ServiceEntry{}
	if err := o.Get(ctx, req.NamespacedName, se); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if se.Labels[ManagedByLabel] != ManagedByValue || !se.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	why, err := o.orphaned(ctx, se)
	if err != nil || why == "" {
		return ctrl.Result{}, err
	}
	// The UID and resourceVersion preconditions: an owner may have adopted it meanwhile.
	if err := o.Delete(ctx, se, client.Preconditions{UID: &se.UID, ResourceVersion: &se.ResourceVersion}); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		// A conflict: it changed since it was read; the retry decides on the new version.
		return ctrl.Result{}, fmt.Errorf("delete orphaned ServiceEntry %s/%s: %w", se.Namespace, se.Name, err)
	}
	o.Versions.forget(req.NamespacedName)
	msg := fmt.Sprintf("Deleted ServiceEntry %s: %s; traffic falls back to the Kubernetes endpoints", se.Name, why)
	o.Recorder.Event(se, corev1.EventTypeNormal, EventOrphanDeleted, msg)
	log.FromContext(ctx).Info("ServiceEntry deleted: no AdaptiveLoadBalancer owns it; traffic falls back to the Kubernetes endpoints",
		"serviceEntry", req.NamespacedName, "why", why)
	return ctrl.Result{}, nil
}

// orphaned says why se has no live owner, or "" when an AdaptiveLoadBalancer controls it. The
// cache may not have seen an owner created a moment ago, so a missing owner is confirmed on the
// API server before the ServiceEntry goes.
func (o *orphanReconciler) orphaned(ctx context.Context, se *networkingv1.ServiceEntry) (string, error) {
	ref := metav1.GetControllerOf(se)
	if ref == nil || ref.Kind != "AdaptiveLoadBalancer" || !strings.HasPrefix(ref.APIVersion, adlbv1.GroupVersion.Group+"/") {
		return "it is labelled as adaptive-lb's and no AdaptiveLoadBalancer is its controller (its owner reference was removed, or the owner deleted with --cascade=orphan)", nil
	}
	key := types.NamespacedName{Namespace: se.Namespace, Name: ref.Name}
	owner := &adlbv1.AdaptiveLoadBalancer{}
	err := o.Get(ctx, key, owner)
	if err == nil && owner.UID == ref.UID {
		return "", nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("get AdaptiveLoadBalancer %s, owner of ServiceEntry %s: %w", key, se.Name, err)
	}
	if err := o.apiReader.Get(ctx, key, owner); apierrors.IsNotFound(err) {
		return fmt.Sprintf("its owner, AdaptiveLoadBalancer %s, does not exist", ref.Name), nil
	} else if err != nil {
		return "", fmt.Errorf("read AdaptiveLoadBalancer %s, owner of ServiceEntry %s, from the API server: %w", key, se.Name, err)
	}
	if owner.UID != ref.UID {
		return fmt.Sprintf("its owner, AdaptiveLoadBalancer %s, was deleted (the one of that name now is another object)", ref.Name), nil
	}
	return "", nil
}
