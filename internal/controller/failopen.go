package controller

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// MarkServiceEntryRemoved records on the AdaptiveLoadBalancer that controlled the deleted
// ServiceEntry se that it is gone and why: EndpointsMirrored=False (reason, such as
// OperatorUnavailable or TargetNotFound, with why), WeightsApplied and WeightsEnforced False
// (NoServiceEntry), no ServiceEntry, no slices and no endpoints in status, and Ready recomputed
// from them: what the mesh has, as the mirror reports a ServiceEntry it removed itself. The fail-open watchdog calls it after each deletion: it stands in
// for the endpoint mirror, which owns these, while no operator runs, so that no status claims
// Ready=True for a Service the operator no longer serves; the mirror replaces them at its first
// reconcile once an operator runs again. An owner that is gone, or that is another object of
// the same name (another UID), is left alone. c reads and writes the API server directly.
func MarkServiceEntryRemoved(ctx context.Context, c client.Client, se metav1.Object, reason, why string) error {
	ref := metav1.GetControllerOfNoCopy(se)
	if ref == nil || ref.Kind != "AdaptiveLoadBalancer" || !strings.HasPrefix(ref.APIVersion, adlbv1.GroupVersion.Group+"/") {
		return nil
	}
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: se.GetNamespace(), Name: ref.Name}, alb); err != nil {
		return client.IgnoreNotFound(err)
	}
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		if alb.UID != ref.UID {
			return false
		}
		gen := alb.Generation
		meta.SetStatusCondition(&alb.Status.Conditions, metav1.Condition{Type: adlbv1.ConditionEndpointsMirrored, Status: metav1.ConditionFalse,
			Reason: reason, Message: why, ObservedGeneration: gen})
		meta.SetStatusCondition(&alb.Status.Conditions, placeholderWeightsCondition(alb, false))
		meta.SetStatusCondition(&alb.Status.Conditions, noServiceEntryEnforced(gen))
		alb.Status.ServiceEntry, alb.Status.ServiceEntrySlices, alb.Status.EndpointCount = "", 0, 0
		alb.Status.Endpoints, alb.Status.EndpointsTruncated = nil, false
		return true
	}
	_, err := updateStatus(ctx, c, c, alb, mutate)
	return err
}
