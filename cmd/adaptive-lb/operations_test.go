package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
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
func operatorEnv(t testing.TB, mutateRole func(*unstructured.Unstructured)) (client.Client, string, *envtest.Environment) {
	t.Helper()
	return operatorEnvWith(t, nil, mutateRole)
}

// operatorEnvWith is operatorEnv with extra kube-apiserver flags.
func operatorEnvWith(t testing.TB, flags map[string]string, mutateRole func(*unstructured.Unstructured)) (client.Client, string, *envtest.Environment) {
	t.Helper()
	env, cfg := startAPIServerWith(t, flags, ownCRDPath, istioCRDPath(t))
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
	// Istio is installed first: config/rbac binds a Role in istiod's namespace.
	mustCreate(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}})
	applyDir(t, admin, filepath.Join("..", "..", "config", "rbac"), mutateRole)

	// A kubeconfig that acts as the operator's ServiceAccount, nothing more.
	kubeconfig := kubeconfigFile(t, env, "system:serviceaccount:"+operatorNamespace+":adaptive-lb")
	return admin, kubeconfig, env
}

// opsCluster is a real API server with the operator's RBAC, one application Service of three
// pods, and operator replicas run in-process as the ServiceAccount.
type opsCluster struct {
	t          testing.TB
	ctx        context.Context
	admin      client.Client
	kubeconfig string
	slice      *discoveryv1.EndpointSlice
	env        *envtest.Environment
}

const opsApp = "shop"

func newOpsCluster(t testing.TB) *opsCluster {
	return newOpsClusterWith(t, nil)
}

// newOpsClusterWith is newOpsCluster with extra kube-apiserver flags.
func newOpsClusterWith(t testing.TB, flags map[string]string) *opsCluster {
	admin, kubeconfig, env := operatorEnvWith(t, flags, nil)
	c := &opsCluster{t: t, ctx: context.Background(), admin: admin, kubeconfig: kubeconfig, env: env}
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

// start runs one replica of `adaptive-lb run`, with extra flags if given; stop cancels it
// (releasing the lease only if release is set, as a graceful stop does; otherwise it is a crash).
func (c *opsCluster) start(name string, release bool, extra ...string) (stop func(), logs *lockedBuffer) {
	runCtx, cancel := context.WithCancel(c.ctx)
	logs = &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, logs)
		// No TSDB: the mesh is declared one cluster (the controller suite reads istiod's count).
		root.SetArgs(append([]string{"run", "--kubeconfig", c.kubeconfig, "--mesh-multi-cluster=false", "--leader-elect", "--leader-election-namespace", operatorNamespace,
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error",
			"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms",
			fmt.Sprintf("--leader-elect-release-on-cancel=%v", release)}, extra...))
		if err := root.ExecuteContext(runCtx); err != nil {
			fmt.Fprintf(logs, "%s: the process exited: %v\n", name, err)
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

func (c *opsCluster) waitForEndpoints(n int, logs ...*lockedBuffer) {
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
	alb := &adlbv1.AdaptiveLoadBalancer{}
	_ = c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, alb)
	c.t.Fatalf("the ServiceEntry never listed %d endpoints (AdaptiveLoadBalancer conditions: %+v); operator logs:\n%s", n, alb.Status.Conditions, strings.Join(all, "\n"))
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
	specs := c.recordServiceEntrySpecs()
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

	// Through both handovers, every write changed the ServiceEntry, and none undid another
	// replica's: the specs seen go 1 → 2 → 3 endpoints and never repeat.
	got := specs()
	for i := 1; i < len(got); i++ {
		if got[i] == got[i-1] {
			t.Errorf("write %d repeats the spec before it (a duplicate write): %s", i, got[i])
		}
		for j := 0; j < i-1; j++ {
			if got[i] == got[j] {
				t.Errorf("write %d reverts to the spec of write %d (conflicting writers): %s", i, j, got[i])
			}
		}
	}
	if len(got) != 3 {
		t.Errorf("saw %d ServiceEntry versions, want 3 (one per endpoint change):\n%s", len(got), strings.Join(got, "\n"))
	}
}

// recordServiceEntrySpecs watches the application's ServiceEntry from now on and returns a
// function that lists the spec of every version seen, in order.
func (c *opsCluster) recordServiceEntrySpecs() func() []string {
	c.t.Helper()
	scheme, err := operatorScheme()
	if err != nil {
		c.t.Fatal(err)
	}
	wc, err := client.NewWithWatch(c.env.Config, client.Options{Scheme: scheme})
	if err != nil {
		c.t.Fatal(err)
	}
	w, err := wc.Watch(c.ctx, &networkingv1.ServiceEntryList{}, client.InNamespace(opsApp))
	if err != nil {
		c.t.Fatal(err)
	}
	var mu sync.Mutex
	var specs []string
	done := make(chan struct{})
	go func() { // ends when the watch is stopped below
		defer close(done)
		for ev := range w.ResultChan() {
			se, ok := ev.Object.(*networkingv1.ServiceEntry)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			raw, err := json.Marshal(&se.Spec)
			if err != nil {
				continue
			}
			mu.Lock()
			specs = append(specs, string(raw))
			mu.Unlock()
		}
	}()
	c.t.Cleanup(func() { w.Stop(); <-done })
	return func() []string {
		time.Sleep(time.Second) // let the last events arrive
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(specs)
	}
}

// BenchmarkFailover measures how long an endpoint change waits when the leader goes away: from
// the leader's stop to the standby's ServiceEntry write, after a crash (the lease must expire:
// 4 s here) and after a graceful stop (the lease is released).
//
//	make envtest-assets && eval "$(make -s test-env)" && go test -run '^$' -bench Failover -benchtime 1x ./cmd/adaptive-lb/
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
	admin, kubeconfig, _ := operatorEnv(t, func(role *unstructured.Unstructured) {
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
	c, alb := mirrorOnce(t, admin, kubeconfig)
	if c.Reason != adlbv1.ReasonWriteFailed || !strings.Contains(c.Message, "forbidden") {
		t.Fatalf("with create removed from the ClusterRole, EndpointsMirrored is %s/%s: %s", c.Status, c.Reason, c.Message)
	}
	ready := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionReady)
	if ready == nil || ready.Reason != adlbv1.ReasonWriteFailed || !strings.Contains(ready.Message, "forbidden") {
		t.Fatalf("with create removed from the ClusterRole, Ready is %+v, want WriteFailed/forbidden", ready)
	}
	// The failure is also counted where the alerts look for it.
	if n := reconcileErrors(t, "forbidden"); n < 1 {
		t.Fatalf("adaptivelb_reconcile_errors_total{reason=\"forbidden\"} = %v", n)
	}
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

// TestRun_ResumesAfterTheAPIServerWasDown stops the real kube-apiserver for 30 s under a running
// leader (etcd keeps running) and starts it again on the same address. The leader cannot renew
// its lease in that time and loses it; the process must rejoin the election and mirror the next
// endpoint change without being restarted.
func TestRun_ResumesAfterTheAPIServerWasDown(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(3)
	c.createALB()
	stop, logs := c.start("a", true)
	defer stop()
	c.waitForEndpoints(3, logs)
	leader := c.holder()

	apiServer := c.env.ControlPlane.APIServer
	if err := apiServer.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Second) // the outage the issue names; longer than the 3 s renew deadline
	if err := apiServer.Start(); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}

	c.setReady(2)
	c.waitForEndpoints(2, logs)
	// The operator's own log lines (JSON, on the same stderr) may say a manager stopped; only
	// this marker says the process did.
	if strings.Contains(logs.String(), "the process exited") {
		t.Fatalf("the operator process stopped instead of resuming:\n%s", logs)
	}
	// The rebuilt manager kept the process's leader identity, so it took its own lease back at
	// once instead of waiting it out as a stranger.
	if h := c.holder(); h != leader {
		t.Fatalf("lease holder %q after the outage, was %q: the process changed its leader identity", h, leader)
	}
}

// BenchmarkAPIServerOutageRecovery measures the blind window after an API-server outage: from the
// API server's restart (after 20 s down, beyond the renew deadline: the leader loses its lease)
// to the ServiceEntry reflecting an endpoint change made right after the restart. One replica,
// lease duration 4 s, renew deadline 3 s, retry period 500 ms.
//
//	make envtest-assets && eval "$(make -s test-env)" && go test -run '^$' -bench APIServerOutageRecovery -benchtime 1x ./cmd/adaptive-lb/
func BenchmarkAPIServerOutageRecovery(b *testing.B) {
	c := newOpsCluster(b)
	c.setReady(3)
	c.createALB()
	stop, logs := c.start("a", true)
	defer stop()
	c.waitForEndpoints(3, logs)
	n := 3
	for b.Loop() {
		apiServer := c.env.ControlPlane.APIServer
		if err := apiServer.Stop(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Second)
		if err := apiServer.Start(); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		n = 5 - n // 3 → 2 → 3 …
		c.setReady(n)
		c.waitForEndpoints(n, logs)
		b.ReportMetric(time.Since(t0).Seconds(), "blind_after_restart_s")
	}
}
