package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

const operatorNamespace = "adaptive-lb-system"

// TestOperations_LeastPrivilegeAndFailover runs `adaptive-lb run` in-process as the ServiceAccount
// bound to exactly config/rbac, against a real API server: the full mirror must work with those
// rights alone (a missing verb makes it fail), and with two and three replicas the standby takes
// over after a crash (no lease release) and after a graceful stop.
// operatorEnv starts a real API server with the CRDs, applies config/rbac (after mutateRole edits
// the ClusterRole, if given) and returns an admin client and a kubeconfig that acts as the
// operator's ServiceAccount.
func operatorEnv(t testing.TB, mutateRole func(*unstructured.Unstructured)) (client.Client, string) {
	t.Helper()
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
	mustCreate := func(o client.Object) {
		t.Helper()
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	mustCreate(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}})
	applyDir(t, admin, filepath.Join("..", "..", "config", "rbac"), mutateRole)

	// A kubeconfig that acts as the operator's ServiceAccount, nothing more.
	kubeconfig := kubeconfigFile(t, env, "system:serviceaccount:"+operatorNamespace+":adaptive-lb")
	return admin, kubeconfig
}

// opsCluster is a real API server with the operator's RBAC, one application Service of three
// pods, and operator replicas run in-process as the ServiceAccount.
type opsCluster struct {
	t          testing.TB
	ctx        context.Context
	admin      client.Client
	kubeconfig string
	slice      *discoveryv1.EndpointSlice
}

const opsApp = "shop"

func newOpsCluster(t testing.TB) *opsCluster {
	admin, kubeconfig := operatorEnv(t, nil)
	c := &opsCluster{t: t, ctx: context.Background(), admin: admin, kubeconfig: kubeconfig}
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opsApp}})
	c.create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: opsApp}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "web"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}})
	for i := 1; i <= 3; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i), Namespace: opsApp, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
		c.create(p)
		p.Status = corev1.PodStatus{PodIP: fmt.Sprintf("10.9.0.%d", i), PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.9.0.%d", i)}}}
		if err := admin.Status().Update(c.ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	c.slice = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Namespace: opsApp, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
	return c
}

func (c *opsCluster) create(o client.Object) {
	c.t.Helper()
	if err := c.admin.Create(c.ctx, o); err != nil {
		c.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// start runs one replica of `adaptive-lb run`; stop cancels it (releasing the lease only if
// release is set, as a graceful stop does; otherwise it is a crash).
func (c *opsCluster) start(name string, release bool) (stop func(), logs *bytes.Buffer) {
	runCtx, cancel := context.WithCancel(c.ctx)
	logs = &bytes.Buffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, logs)
		root.SetArgs([]string{"run", "--kubeconfig", c.kubeconfig, "--leader-elect", "--leader-election-namespace", operatorNamespace,
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error",
			"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms",
			fmt.Sprintf("--leader-elect-release-on-cancel=%v", release)})
		if err := root.ExecuteContext(runCtx); err != nil {
			fmt.Fprintf(logs, "%s stopped: %v\n", name, err)
		}
	}()
	return func() { cancel(); <-done }, logs
}

// setReady makes the first n pods the slice's ready endpoints.
func (c *opsCluster) setReady(n int) {
	c.t.Helper()
	c.slice.Endpoints = nil
	for i := 1; i <= n; i++ {
		c.slice.Endpoints = append(c.slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.9.0.%d", i)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("web-%d", i), Namespace: opsApp}})
	}
	if c.slice.ResourceVersion == "" {
		c.create(c.slice)
	} else if err := c.admin.Update(c.ctx, c.slice); err != nil {
		c.t.Fatal(err)
	}
}

func (c *opsCluster) waitForEndpoints(n int, logs ...*bytes.Buffer) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		se := &networkingv1.ServiceEntry{}
		if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, se); err == nil && len(se.Spec.Endpoints) == n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	var all []string
	for _, l := range logs {
		all = append(all, l.String())
	}
	c.t.Fatalf("the ServiceEntry never listed %d endpoints; operator logs:\n%s", n, strings.Join(all, "\n"))
}

func (c *opsCluster) holder() string {
	lease := &coordinationv1.Lease{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: operatorNamespace, Name: "adaptive-lb.adaptivelb.io"}, lease); err != nil {
		return ""
	}
	return ptr.Deref(lease.Spec.HolderIdentity, "")
}

func (c *opsCluster) createALB() {
	c.create(&adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: opsApp}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}})
}

// TestOperations_LeastPrivilegeAndFailover runs `adaptive-lb run` in-process as the ServiceAccount
// bound to exactly config/rbac, against a real API server: the full mirror must work with those
// rights alone (a missing verb makes it fail, see below), and the standby takes over after a
// crash (no lease release) and after a graceful stop.
func TestOperations_LeastPrivilegeAndFailover(t *testing.T) {
	c := newOpsCluster(t)
	// Replica A leads; it will "crash" (stop without releasing its lease).
	stopA, logsA := c.start("A", false)
	c.setReady(1)
	c.createALB()
	c.waitForEndpoints(1, logsA)
	leaderA := c.holder()
	if leaderA == "" {
		t.Fatal("no leader lease held")
	}
	// Replica B waits as a warm standby.
	stopB, logsB := c.start("B", true)
	stopA()
	c.setReady(2)
	c.waitForEndpoints(2, logsA, logsB)
	if h := c.holder(); h == leaderA || h == "" {
		t.Fatalf("lease holder %q after the crash; want the standby", h)
	}
	// Replica C joins; B stops gracefully and releases the lease: C takes over.
	stopC, logsC := c.start("C", true)
	defer stopC()
	stopB()
	c.setReady(3)
	c.waitForEndpoints(3, logsB, logsC)
}

// BenchmarkFailover measures how long an endpoint change waits when the leader goes away: from
// the leader's stop to the standby's ServiceEntry write, after a crash (the lease must expire:
// 4 s here) and after a graceful stop (the lease is released).
//
//	make envtest-assets && KUBEBUILDER_ASSETS=$PWD/.cache/tools/k8s go test -run '^$' -bench Failover -benchtime 1x ./cmd/adaptive-lb/
func BenchmarkFailover(b *testing.B) {
	c := newOpsCluster(b)
	for b.Loop() {
		stopA, _ := c.start("A", false)
		c.setReady(1)
		c.createALB()
		c.waitForEndpoints(1)
		stopB, _ := c.start("B", true)
		time.Sleep(2 * time.Second) // let the standby's caches sync
		t0 := time.Now()
		stopA()
		c.setReady(2)
		c.waitForEndpoints(2)
		crash := time.Since(t0)
		stopC, _ := c.start("C", true)
		time.Sleep(2 * time.Second)
		t1 := time.Now()
		stopB()
		c.setReady(3)
		c.waitForEndpoints(3)
		graceful := time.Since(t1)
		stopC()
		b.ReportMetric(crash.Seconds(), "crash_takeover_s")
		b.ReportMetric(graceful.Seconds(), "graceful_takeover_s")
	}
}

// applyDir creates every object of every YAML file in dir except kustomization.yaml.
func applyDir(t testing.TB, c client.Client, dir string, mutateRole func(*unstructured.Unstructured)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if err == io.EOF {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if mutateRole != nil && u.GetKind() == "ClusterRole" && u.GetName() == "adaptive-lb" {
				mutateRole(u)
			}
			if err := c.Create(context.Background(), u); err != nil {
				t.Fatalf("apply %s %s from %s: %v", u.GetKind(), u.GetName(), f, err)
			}
		}
	}
}

func TestOperations_AMissingVerbBreaksTheMirror(t *testing.T) {
	// Without "create" on serviceentries the operator must fail visibly, which is what makes the
	// least-privilege test above a real check of config/rbac.
	admin, kubeconfig := operatorEnv(t, func(role *unstructured.Unstructured) {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			if fmt.Sprint(rule["apiGroups"]) == "[networking.istio.io]" {
				var verbs []any
				for _, v := range rule["verbs"].([]any) {
					if v != "create" {
						verbs = append(verbs, v)
					}
				}
				rule["verbs"] = verbs
			}
		}
		_ = unstructured.SetNestedSlice(role.Object, rules, "rules")
	})
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
				if c.Type == adlbv1.ConditionReady && c.Reason == adlbv1.ReasonWriteFailed && strings.Contains(c.Message, "forbidden") {
					// The failure is also counted where the alerts look for it.
					if n := reconcileErrors(t, "forbidden"); n < 1 {
						t.Fatalf("adaptivelb_reconcile_errors_total{reason=\"forbidden\"} = %v", n)
					}
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("with create removed from the ClusterRole, Ready never reported WriteFailed/forbidden")
}

func reconcileErrors(t *testing.T, reason string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "adaptivelb_reconcile_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
