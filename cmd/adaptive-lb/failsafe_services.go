package main

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

// deleteWithoutService deletes the managed ServiceEntries of this installation whose Service (in
// the same namespace, named by the slice's ServiceLabel, or as the ServiceEntry) no longer
// exists, whether or not an operator leads: a ServiceEntry must never outlive its Service.
// Without the Service, istiod makes the ServiceEntry the host's only service, and in ambient
// mode gives ztunnel a second workload for every pod address, without tunnel or identity
// (test/istiod TestAmbientServiceEntryOutlivingItsService). The operator deletes it as soon as it
// sees the Service go; this covers the time no operator runs. The garbage collector cannot: it
// deletes an object only once all of its owners are gone, and the ServiceEntry's owner is its
// AdaptiveLoadBalancer.
//
// It reads both from the watches (w.watched), which must have synced: no request to the API
// server, except one GET per Service the watch says is gone, to confirm it before deleting.
func (w *watchdog) deleteWithoutService(ctx context.Context) (int, error) {
	managed, err := w.managedServiceEntries(ctx)
	if err != nil {
		return 0, err
	}
	gone := map[types.NamespacedName]bool{} // per Service, for its further slices
	deleted := 0
	var errs []error
	for i := range managed {
		se := &managed[i]
		service := types.NamespacedName{Namespace: se.Namespace, Name: serviceOf(se)}
		isGone, known := gone[service]
		if !known {
			if isGone, err = w.serviceGone(ctx, service); err != nil {
				errs = append(errs, err)
				continue
			}
			gone[service] = isGone
		}
		if !isGone {
			continue
		}
		se.SetGroupVersionKind(serviceEntryGVK)
		if err := w.client.Delete(ctx, se, client.Preconditions{UID: ptr.To(se.UID)}); apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			// Deleted already (the operator, which then writes the status itself, or this
			// watchdog at a check before its watch saw it go), or re-created for a new Service.
			continue
		} else if err != nil {
			errs = append(errs, fmt.Errorf("delete ServiceEntry %s/%s, whose Service is gone: %w", se.Namespace, se.Name, err))
			continue
		}
		deleted++
		w.logger.Info("deleted a ServiceEntry whose Service is gone", "serviceEntry", types.NamespacedName{Namespace: se.Namespace, Name: se.Name})
		// The mirror owns this status, and no operator may be running to write it: without
		// this, it would go on claiming a ServiceEntry that no longer exists.
		why := fmt.Sprintf("Service %s does not exist: the fail-open watchdog deleted its ServiceEntry %s; create the Service or fix spec.targetRef.name", service, se.Name)
		if err := controller.MarkServiceEntryRemoved(ctx, w.client, se, adlbv1.ReasonTargetNotFound, why); err != nil {
			w.logger.Error(err, "cannot say on its AdaptiveLoadBalancer that the ServiceEntry is deleted", "serviceEntry", types.NamespacedName{Namespace: se.Namespace, Name: se.Name})
		}
	}
	return deleted, errors.Join(errs...)
}

// managedServiceEntries are this installation's ServiceEntries (installSelectors) in the watched
// namespaces, as the watch has them.
func (w *watchdog) managedServiceEntries(ctx context.Context) ([]metav1.PartialObjectMetadata, error) {
	all := &metav1.PartialObjectMetadataList{}
	all.SetGroupVersionKind(serviceEntryListGVK)
	if err := w.watched.reader.List(ctx, all); err != nil {
		return nil, fmt.Errorf("read the managed ServiceEntries from the watch: %w", err)
	}
	selectors := installSelectors(controller.InstallID(w.lease.Namespace, w.lease.Name))
	var mine []metav1.PartialObjectMetadata
	for _, se := range all.Items {
		for _, sel := range selectors {
			if sel.Matches(labels.Set(se.Labels)) {
				mine = append(mine, se)
				break
			}
		}
	}
	return mine, nil
}

// serviceGone reports whether Service key does not exist. The watch answers when it has the
// Service. When it has not, one GET asks the API server, and only its NotFound says gone: a
// watch lags behind the API server (a Service created just before its ServiceEntry, a watch
// being re-established), and a lagging watch must not delete the ServiceEntry of a live Service.
// A Service is rarely gone, so this GET is rare.
func (w *watchdog) serviceGone(ctx context.Context, key types.NamespacedName) (bool, error) {
	err := w.watched.reader.Get(ctx, key, metadataOf(serviceGVK))
	if err == nil {
		return false, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("read Service %s from the watch: %w", key, err)
	}
	err = w.client.Get(ctx, key, metadataOf(serviceGVK))
	switch {
	case err == nil:
		w.logger.V(1).Info("the watch has not seen the Service yet; the API server has it", "service", key)
		return false, nil
	case apierrors.IsNotFound(err):
		return true, nil
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("confirm with the API server that Service %s is gone: the watchdog's Role must allow get on services: %w", key, err)
	default:
		return false, fmt.Errorf("confirm with the API server that Service %s is gone: %w", key, err)
	}
}

// serviceOf is the Service a managed ServiceEntry mirrors: its ServiceLabel, or, on one written
// before slices, its name.
func serviceOf(se *metav1.PartialObjectMetadata) string {
	if name := se.Labels[controller.ServiceLabel]; name != "" {
		return name
	}
	return se.Name
}
