package testtools

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SetPodReady sets a pod's Ready condition, as its kubelet does when its readiness probe starts
// or stops passing; a conflicting write is retried.
func SetPodReady(ctx context.Context, c client.Client, pod types.NamespacedName, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := c.Get(ctx, pod, p); err != nil {
			return err
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		return c.Status().Update(ctx, p)
	})
}

// LeaseRenewTime reads a Lease's renew time: zero when the Lease or its renew time is missing.
func LeaseRenewTime(ctx context.Context, c client.Reader, lease types.NamespacedName) (time.Time, error) {
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, lease, l); err != nil {
		if apierrors.IsNotFound(err) {
			return time.Time{}, nil
		}
		return time.Time{}, err
	}
	if l.Spec.RenewTime == nil {
		return time.Time{}, nil
	}
	return l.Spec.RenewTime.Time, nil
}
