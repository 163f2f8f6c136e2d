package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

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
// EndpointsMirrored condition is set (True, or WriteFailed) and returns the AdaptiveLoadBalancer
// as it was then, with the condition.
func mirrorOnce(t *testing.T, admin client.Client, kubeconfig string) (metav1.Condition, *adlbv1.AdaptiveLoadBalancer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, io.Discard)
		root.SetArgs([]string{"run", "--kubeconfig", kubeconfig, "--mesh-multi-cluster=false", "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error"})
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
					return c, alb
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the AdaptiveLoadBalancer was never reconciled")
	return metav1.Condition{}, nil
}

// Clusters that enforce owner-reference permissions (OpenShift by default) allow setting
// blockOwnerDeletion only to who may update the owner's finalizers. With the chart's RBAC
// (config/rbac, kept equal to the chart by test/chart) the ServiceEntry is created; without the
// finalizers rule every create is forbidden, which is what makes this a test of the rule.
func TestOperations_OwnerReferencePermissionEnforcement(t *testing.T) {
	enforce := map[string]string{"enable-admission-plugins": "OwnerReferencesPermissionEnforcement"}
	t.Run("with the chart's RBAC the ServiceEntry is created", func(t *testing.T) {
		admin, kubeconfig, _ := operatorEnvWith(t, enforce, nil)
		if c, _ := mirrorOnce(t, admin, kubeconfig); c.Status != metav1.ConditionTrue {
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
		c, _ := mirrorOnce(t, admin, kubeconfig)
		if c.Reason != adlbv1.ReasonWriteFailed || !strings.Contains(c.Message, "cannot set blockOwnerDeletion") {
			t.Fatalf("EndpointsMirrored %s/%s: %s; want WriteFailed naming blockOwnerDeletion", c.Status, c.Reason, c.Message)
		}
	})
}

// namespacedRBAC grants the operator's ServiceAccount the generated rules (config/rbac/role.yaml)
// as a Role in each namespace, the generated Role in istiod's namespace, and nodes and
// namespaces through a ClusterRole of their own: what the chart renders with watchNamespaces.
func namespacedRBAC(t *testing.T, admin client.Client, namespaces ...string) {
	t.Helper()
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("config/rbac/role.yaml has %d documents, want the ClusterRole and the Role in istiod's namespace", len(docs))
	}
	var generated rbacv1.ClusterRole
	var istioRole rbacv1.Role
	if err := yaml.Unmarshal([]byte(docs[0]), &generated); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(docs[1]), &istioRole); err != nil {
		t.Fatal(err)
	}
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "adaptive-lb", Namespace: operatorNamespace}}
	istioRole.ResourceVersion = ""
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioRole.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range []client.Object{&istioRole, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "adaptive-lb", Namespace: istioRole.Namespace}, Subjects: sa,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: istioRole.Name}}} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range namespaces {
		for _, o := range []client.Object{
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "adaptive-lb", Namespace: ns}, Rules: generated.Rules},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "adaptive-lb", Namespace: ns}, Subjects: sa,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "adaptive-lb"}},
		} {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, o := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "adaptive-lb-nodes"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "adaptive-lb-nodes"}, Subjects: sa,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "adaptive-lb-nodes"}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// With --watch-namespaces the operator works on Roles in those namespaces alone (plus reading
// nodes), mirrors the Services there and touches nothing elsewhere.
func TestRun_WatchNamespacesWorksWithRolesOnly(t *testing.T) {
	env, cfg := startAPIServer(t, ownCRDPath, istioCRDPath(t))
	scheme, err := operatorScheme()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{operatorNamespace, "shop", "other"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	namespacedRBAC(t, admin, "shop")
	for _, ns := range []string{"shop", "other"} {
		for _, o := range []client.Object{
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
			&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
				AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}},
			&adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}},
		} {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubeconfig := kubeconfigFile(t, env, "system:serviceaccount:"+operatorNamespace+":adaptive-lb")
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var logs lockedBuffer
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, &logs)
		root.SetArgs([]string{"run", "--kubeconfig", kubeconfig, "--mesh-multi-cluster=false", "--watch-namespaces", "shop", "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error"})
		if err := root.ExecuteContext(runCtx); err != nil {
			fmt.Fprintf(&logs, "stopped: %v", err)
		}
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		alb := &adlbv1.AdaptiveLoadBalancer{}
		if err := admin.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web"}, alb); err == nil && meta.IsStatusConditionTrue(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := admin.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web"}, &networkingv1.ServiceEntry{}); err != nil {
		t.Fatalf("the watched namespace's ServiceEntry: %v; logs:\n%s", err, logs.String())
	}
	// The other namespace: no ServiceEntry, no status, not even an attempt (which RBAC would
	// have refused and the status would show).
	other := &adlbv1.AdaptiveLoadBalancer{}
	if err := admin.Get(ctx, types.NamespacedName{Namespace: "other", Name: "web"}, other); err != nil || len(other.Status.Conditions) != 0 {
		t.Fatalf("the unwatched namespace's AdaptiveLoadBalancer was touched: %v (err %v)", other.Status.Conditions, err)
	}
	if err := admin.Get(ctx, types.NamespacedName{Namespace: "other", Name: "web"}, &networkingv1.ServiceEntry{}); err == nil {
		t.Fatal("a ServiceEntry was written in an unwatched namespace")
	}
	if strings.Contains(logs.String(), "stopped") {
		t.Fatalf("the operator stopped:\n%s", logs.String())
	}
}
