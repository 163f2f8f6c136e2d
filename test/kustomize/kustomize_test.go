// Package kustomize tests the kustomize install of docs/install.md: config/default built with the
// real kustomize CLI (default load restrictor, as `kubectl apply -k` runs it) and applied to a
// real API server.
package kustomize

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

const namespace = "adaptive-lb-system"

// build runs `kustomize build config/default` and returns the objects in kustomize's order.
func build(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	kustomize := testtools.RequireEnv(t, "ADAPTIVELB_KUSTOMIZE_BIN", "kustomize")
	return testtools.Render(t, kustomize, "build", "../../config/default")
}

func TestKustomize_DefaultInstallsTheOperatorOnARealAPIServer(t *testing.T) {
	testtools.RequireEnv(t, "KUBEBUILDER_ASSETS", "kube-apiserver and etcd")
	objs := build(t)
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Istio is installed first: the operator's Role and RoleBinding live in istiod's namespace.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}); err != nil {
		t.Fatal(err)
	}
	// In kustomize's order (the Namespace and the CRD first), as kubectl apply -k sends them.
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}

	get := func(key types.NamespacedName, o client.Object) {
		t.Helper()
		if err := c.Get(ctx, key, o); err != nil {
			t.Errorf("the kustomize install has no %T %s: %v", o, key, err)
		}
	}
	ns := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: namespace, Name: name} }
	var (
		deploy   appsv1.Deployment
		sa       corev1.ServiceAccount
		metrics  corev1.Service
		role     rbacv1.ClusterRole
		binding  rbacv1.ClusterRoleBinding
		leRole   rbacv1.Role
		leBind   rbacv1.RoleBinding
		authRole rbacv1.ClusterRoleBinding
		crd      apiextensionsv1.CustomResourceDefinition
		istio    rbacv1.Role
		istioBnd rbacv1.RoleBinding
		members  flowcontrolv1.FlowSchema
		status   flowcontrolv1.FlowSchema
		level    flowcontrolv1.PriorityLevelConfiguration
	)
	get(ns("adaptive-lb"), &deploy)
	get(ns("adaptive-lb"), &sa)
	get(ns("adaptive-lb-metrics"), &metrics)
	get(types.NamespacedName{Name: "adaptive-lb"}, &role)
	get(types.NamespacedName{Name: "adaptive-lb"}, &binding)
	get(ns("adaptive-lb-leader-election"), &leRole)
	get(ns("adaptive-lb-leader-election"), &leBind)
	get(types.NamespacedName{Name: "adaptive-lb-metrics-auth"}, &authRole)
	get(types.NamespacedName{Name: "adaptiveloadbalancers.adaptivelb.io"}, &crd)
	get(types.NamespacedName{Namespace: "istio-system", Name: "adaptive-lb"}, &istio)
	get(types.NamespacedName{Namespace: "istio-system", Name: "adaptive-lb"}, &istioBnd)
	get(types.NamespacedName{Name: "adaptive-lb-membership"}, &members)
	get(types.NamespacedName{Name: "adaptive-lb-status"}, &status)
	get(types.NamespacedName{Name: "adaptive-lb-status"}, &level)
	if t.Failed() {
		return
	}
	if len(istioBnd.Subjects) != 1 || istioBnd.Subjects[0].Name != sa.Name || istioBnd.Subjects[0].Namespace != namespace || istioBnd.RoleRef.Name != istio.Name {
		t.Errorf("the RoleBinding in istio-system does not bind %s to the ServiceAccount: %+v", istio.Name, istioBnd)
	}

	// The FlowSchemas are the installed ServiceAccount's, and the status schema uses the installed
	// level (test/chart's TestChart_APFPutsTheMembershipWritesAboveTheStatusWrites checks how the
	// API server classifies the same objects, rendered by the chart).
	for _, schema := range []flowcontrolv1.FlowSchema{members, status} {
		if len(schema.Spec.Rules) != 1 || len(schema.Spec.Rules[0].Subjects) != 1 || schema.Spec.Rules[0].Subjects[0].ServiceAccount == nil ||
			*schema.Spec.Rules[0].Subjects[0].ServiceAccount != (flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: sa.Name}) {
			t.Errorf("FlowSchema %s is not the installed ServiceAccount's: %+v", schema.Name, schema.Spec.Rules)
		}
	}
	if status.Spec.PriorityLevelConfiguration.Name != level.Name {
		t.Errorf("FlowSchema %s uses the level %s, not the installed %s", status.Name, status.Spec.PriorityLevelConfiguration.Name, level.Name)
	}

	pod := deploy.Spec.Template
	if pod.Spec.ServiceAccountName != sa.Name {
		t.Errorf("the Deployment runs as %q, not the installed ServiceAccount %q", pod.Spec.ServiceAccountName, sa.Name)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != namespace || binding.RoleRef.Name != role.Name {
		t.Errorf("the ClusterRoleBinding does not bind %s to the ServiceAccount: %+v", role.Name, binding)
	}
	// The metrics Service selects the operator's pods and targets its named metrics port.
	for k, v := range metrics.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("metrics Service selector %v does not select the pod labels %v", metrics.Spec.Selector, pod.Labels)
		}
	}
	var containerPorts []string
	for _, p := range pod.Spec.Containers[0].Ports {
		containerPorts = append(containerPorts, p.Name)
	}
	if len(metrics.Spec.Ports) != 1 || metrics.Spec.Ports[0].TargetPort.String() != "metrics" || !slices.Contains(containerPorts, "metrics") {
		t.Errorf("metrics Service ports %+v, container ports %v: want the container's port named metrics", metrics.Spec.Ports, containerPorts)
	}
	// A scraper bound to the metrics-reader role may GET /metrics: the operator's HTTPS metrics
	// endpoint asks the API server exactly this SubjectAccessReview; an unbound one may not.
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-reads-adaptive-lb"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "adaptive-lb-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "monitoring"}},
	}); err != nil {
		t.Fatalf("bind the metrics-reader ClusterRole: %v", err)
	}
	mayGetMetrics := func(user string) *authorizationv1.SubjectAccessReview {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar
	}
	// The API server's authorizer sees a new binding through its informer, moments after the
	// create returns: ask until it does, within a bound.
	bound := "system:serviceaccount:monitoring:prometheus"
	sar := mayGetMetrics(bound)
	for until := time.Now().Add(30 * time.Second); !sar.Status.Allowed && time.Now().Before(until); sar = mayGetMetrics(bound) {
		time.Sleep(100 * time.Millisecond)
	}
	if !sar.Status.Allowed {
		t.Errorf("%s may GET /metrics: false, want true (%s)", bound, sar.Status.Reason)
	}
	if other := "system:serviceaccount:monitoring:other"; mayGetMetrics(other).Status.Allowed {
		t.Errorf("%s may GET /metrics: true, want false", other)
	}

	// The CRD is served, so AdaptiveLoadBalancers can be created right after the install.
	deadline := time.Now().Add(30 * time.Second)
	for !established(&crd) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		get(types.NamespacedName{Name: crd.Name}, &crd)
	}
	if !established(&crd) {
		t.Errorf("the CRD never became Established: %+v", crd.Status.Conditions)
	}
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// No Role or ClusterRole of config/default (and config/rbac, which it includes) lets anyone read
// Secrets, and every binding points at a role it defines (see testtools.SecretGrants).
func TestKustomize_NoRoleGrantsSecrets(t *testing.T) {
	objs := build(t)
	grants, err := testtools.SecretGrants(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) > 0 {
		t.Fatalf("config/default grants access to Secrets:\n%s", strings.Join(grants, "\n"))
	}
	roles := 0
	for _, o := range objs {
		if o.GetKind() == "Role" || o.GetKind() == "ClusterRole" {
			roles++
		}
	}
	if roles < 4 {
		t.Fatalf("only %d Roles and ClusterRoles built: the build is not config/default's", roles)
	}
}
