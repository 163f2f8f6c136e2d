package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// dropFinalizersRule removes the adaptiveloadbalancers/finalizers rule from the ClusterRole.
func dropFinalizersRule(role *unstructured.Unstructured) {
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var kept []any
	for _, r := range rules {
		if !strings.Contains(fmt.Sprint(r.(map[string]any)["resources"]), "adaptiveloadbalancers/finalizers") {
			kept = append(kept, r)
		}
	}
	_ = unstructured.SetNestedSlice(role.Object, kept, "rules")
}

// mirrorOnce runs the operator as its ServiceAccount until the AdaptiveLoadBalancer's
// EndpointsMirrored condition is set and returns it.
func mirrorOnce(t *testing.T, admin client.Client, kubeconfig string) metav1.Condition {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, io.Discard)
		root.SetArgs([]string{"run", "--kubeconfig", kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error"})
		_ = root.ExecuteContext(ctx)
	}()
	defer func() { cancel(); <-done }()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}},
		&adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		alb := &adlbv1.AdaptiveLoadBalancer{}
		if err := admin.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web"}, alb); err == nil {
			for _, c := range alb.Status.Conditions {
				if c.Type == adlbv1.ConditionEndpointsMirrored && (c.Status == metav1.ConditionTrue || c.Reason == adlbv1.ReasonWriteFailed) {
					return c
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the AdaptiveLoadBalancer was never reconciled")
	return metav1.Condition{}
}

// Clusters that enforce owner-reference permissions (OpenShift by default) allow setting
// blockOwnerDeletion only to who may update the owner's finalizers. With the chart's RBAC
// (config/rbac, kept equal to the chart by test/chart) the ServiceEntry is created; without the
// finalizers rule every create is forbidden, which is what makes this a test of the rule.
func TestOperations_OwnerReferencePermissionEnforcement(t *testing.T) {
	enforce := map[string]string{"enable-admission-plugins": "OwnerReferencesPermissionEnforcement"}
	t.Run("with the chart's RBAC the ServiceEntry is created", func(t *testing.T) {
		admin, kubeconfig, _ := operatorEnvWith(t, enforce, nil)
		if c := mirrorOnce(t, admin, kubeconfig); c.Status != metav1.ConditionTrue {
			t.Fatalf("EndpointsMirrored %s/%s: %s", c.Status, c.Reason, c.Message)
		}
		se := &networkingv1.ServiceEntry{}
		if err := admin.Get(context.Background(), types.NamespacedName{Namespace: "shop", Name: "web"}, se); err != nil {
			t.Fatal(err)
		}
		if ref := metav1.GetControllerOf(se); ref == nil || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Fatalf("owner reference %v lacks blockOwnerDeletion", ref)
		}
	})
	t.Run("without the finalizers rule the create is forbidden", func(t *testing.T) {
		admin, kubeconfig, _ := operatorEnvWith(t, enforce, dropFinalizersRule)
		c := mirrorOnce(t, admin, kubeconfig)
		if c.Reason != adlbv1.ReasonWriteFailed || !strings.Contains(c.Message, "cannot set blockOwnerDeletion") {
			t.Fatalf("EndpointsMirrored %s/%s: %s; want WriteFailed naming blockOwnerDeletion", c.Status, c.Reason, c.Message)
		}
	})
}
