package main

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

// deleteWithoutService deletes the managed ServiceEntries of this installation whose Service (in
// the same namespace, named by the slice's ServiceLabel, or as the ServiceEntry) no longer exists, whether or not an operator leads: a
// ServiceEntry must never outlive its Service. Without the Service, istiod makes the
// ServiceEntry the host's only service, and in ambient mode gives ztunnel a second workload for
// every pod address, without tunnel or identity (test/istiod
// TestAmbientServiceEntryOutlivingItsService). The operator deletes it as soon as it sees the
// Service go; this covers the time no operator runs. The garbage collector cannot: it deletes an
// object only once all of its owners are gone, and the ServiceEntry's owner is its
// AdaptiveLoadBalancer. It costs two metadata lists per check, none when there is no managed
// ServiceEntry.
func (w *watchdog) deleteWithoutService(ctx context.Context) (int, error) {
	namespaces := w.namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	deleted := 0
	var errs []error
	for _, ns := range namespaces {
		var managed []metav1.PartialObjectMetadata
		for _, sel := range installSelectors(controller.InstallID(w.lease.Namespace, w.lease.Name)) {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(serviceEntryListGVK)
			if err := w.client.List(ctx, list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				errs = append(errs, fmt.Errorf("list ServiceEntries %s in %q: %w", sel, ns, err))
				continue
			}
			managed = append(managed, list.Items...)
		}
		if len(managed) == 0 {
			continue
		}
		// Listed after the ServiceEntries: a ServiceEntry listed above was written for a Service
		// that existed before it, and a Service deleted since is caught at the next check.
		services := &metav1.PartialObjectMetadataList{}
		services.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ServiceList"))
		if err := w.client.List(ctx, services, client.InNamespace(ns)); err != nil {
			errs = append(errs, fmt.Errorf("list Services in %q: %w", ns, err))
			continue
		}
		exists := make(map[types.NamespacedName]bool, len(services.Items))
		for _, s := range services.Items {
			exists[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = true
		}
		for i := range managed {
			se := &managed[i]
			if exists[types.NamespacedName{Namespace: se.Namespace, Name: serviceOf(se)}] {
				continue
			}
			se.SetGroupVersionKind(serviceEntryGVK)
			if err := w.client.Delete(ctx, se, client.Preconditions{UID: ptr.To(se.UID)}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("delete ServiceEntry %s/%s, whose Service is gone: %w", se.Namespace, se.Name, err))
				continue
			}
			deleted++
			w.logger.Info("deleted a ServiceEntry whose Service is gone", "serviceEntry", types.NamespacedName{Namespace: se.Namespace, Name: se.Name})
			// The mirror owns this status, and no operator may be running to write it: without
			// this, it would go on claiming a ServiceEntry that no longer exists.
			why := fmt.Sprintf("Service %s/%s does not exist: the fail-open watchdog deleted its ServiceEntry %s; create the Service or fix spec.targetRef.name", se.Namespace, serviceOf(se), se.Name)
			if err := controller.MarkServiceEntryRemoved(ctx, w.client, se, adlbv1.ReasonTargetNotFound, why); err != nil {
				w.logger.Error(err, "cannot say on its AdaptiveLoadBalancer that the ServiceEntry is deleted", "serviceEntry", types.NamespacedName{Namespace: se.Namespace, Name: se.Name})
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// serviceOf is the Service a managed ServiceEntry mirrors: its ServiceLabel, or, on one written
// before slices, its name.
func serviceOf(se *metav1.PartialObjectMetadata) string {
	if name := se.Labels[controller.ServiceLabel]; name != "" {
		return name
	}
	return se.Name
}
