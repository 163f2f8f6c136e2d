package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

func TestFailsafe_RejectsBadFlags(t *testing.T) {
	code, _, errOut := runCLI(t, "failsafe", "--stale-after", "10s", "--check-interval", "1m")
	if code != exitUsageError || !strings.Contains(errOut, "--check-interval 1m0s must not exceed --stale-after 10s") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

// lockedBuffer is a log sink a test may read while the command writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startFailsafe runs `adaptive-lb failsafe` in-process as the watchdog's own ServiceAccount
// (config/rbac/failsafe.yaml) until the returned stop is called.
func (c *opsCluster) startFailsafe(args ...string) (stop func(), logs *lockedBuffer) {
	kubeconfig := kubeconfigFile(c.t, c.env, "system:serviceaccount:"+operatorNamespace+":adaptive-lb-failsafe")
	ctx, cancel := context.WithCancel(c.ctx)
	logs = &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(io.Discard, logs)
		root.SetArgs(append([]string{"failsafe", "--kubeconfig", kubeconfig, "--leader-election-namespace", operatorNamespace}, args...))
		if err := root.ExecuteContext(ctx); err != nil {
			fmt.Fprintf(logs, "failsafe stopped: %v\n", err)
		}
	}()
	return func() { cancel(); <-done }, logs
}

func (c *opsCluster) serviceEntryGone() bool {
	err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, &networkingv1.ServiceEntry{})
	return apierrors.IsNotFound(err)
}

// waitFor polls cond for up to a minute; the bound only stops a hung test.
func (c *opsCluster) waitFor(what string, cond func() bool, logs ...fmt.Stringer) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	var all []string
	for _, l := range logs {
		all = append(all, l.String())
	}
	c.t.Fatalf("%s: not after 60s; logs:\n%s", what, strings.Join(all, "\n"))
}

// With every operator replica gone, the watchdog deletes the ServiceEntry that went stale (pods
// left it meanwhile), so clients fall back to the Kubernetes endpoints; the operator, back,
// re-creates it with the current endpoints. The watchdog runs with its own least-privilege RBAC.
func TestFailsafe_DeletesStaleServiceEntriesUntilTheOperatorIsBack(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(3)
	c.createALB()
	stopA, logsA := c.start("A", false)
	c.waitForEndpoints(3, logsA)
	// The operator names its installation, the Lease the watchdog reads, on the ServiceEntry.
	se := &networkingv1.ServiceEntry{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, se); err != nil {
		t.Fatal(err)
	}
	if got, want := se.Labels[controller.InstallLabel], controller.InstallID(operatorNamespace, "adaptive-lb.adaptivelb.io"); got != want {
		t.Fatalf("the operator's ServiceEntry has %s=%q, want %q", controller.InstallLabel, got, want)
	}

	stopWatchdog, watchdogLogs := c.startFailsafe("--stale-after", "6s", "--check-interval", "200ms", "--log-level", "debug")
	defer stopWatchdog()
	// While the operator renews its heartbeat, the watchdog leaves its ServiceEntry alone.
	c.waitFor("watchdog saw the heartbeat renewed", func() bool {
		return strings.Count(watchdogLogs.String(), "heartbeat fresh") >= 10
	}, watchdogLogs)
	if c.serviceEntryGone() {
		t.Fatalf("the watchdog deleted the ServiceEntry of a live operator:\n%s", watchdogLogs)
	}

	// Every replica crashes (no lease release); two pods leave: the ServiceEntry is now stale.
	stopA()
	c.setReady(1)
	c.waitFor("the watchdog deletes the stale ServiceEntry", c.serviceEntryGone, watchdogLogs)
	// The log line follows the deletion.
	c.waitFor("the deletion is logged", func() bool {
		return strings.Contains(watchdogLogs.String(), "no operator has renewed its heartbeat")
	}, watchdogLogs)

	// The operator returns: it re-creates the ServiceEntry with the current endpoints, and the
	// watchdog, seeing the heartbeat renewed, leaves it.
	stopB, logsB := c.start("B", true)
	defer stopB()
	c.waitForEndpoints(1, logsB)
	c.waitFor("the watchdog notices the operator is back", func() bool {
		return strings.Contains(watchdogLogs.String(), "the operator renews its heartbeat again")
	}, watchdogLogs)
	n := strings.Count(watchdogLogs.String(), "heartbeat fresh")
	c.waitFor("a few more checks", func() bool { return strings.Count(watchdogLogs.String(), "heartbeat fresh") >= n+10 }, watchdogLogs)
	if c.serviceEntryGone() {
		t.Fatalf("the watchdog deleted the ServiceEntry after the operator came back:\n%s", watchdogLogs)
	}
}

// The chart's uninstall hook: once the operator has let go of its lease (its pods stopped
// gracefully), every managed ServiceEntry is deleted and the command exits.
func TestFailsafe_UninstallDeletesTheServiceEntriesOnceTheOperatorIsGone(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(2)
	c.createALB()
	stop, logs := c.start("A", true)
	c.waitForEndpoints(2, logs)
	stop() // graceful: the lease is released
	stopHook, hookLogs := c.startFailsafe("--uninstall", "--check-interval", "200ms")
	defer stopHook()
	c.waitFor("the hook deletes the ServiceEntry", c.serviceEntryGone, hookLogs)
	c.waitFor("the hook exits", func() bool { return strings.Contains(hookLogs.String(), "deleted the managed ServiceEntries") }, hookLogs)
	if strings.Contains(hookLogs.String(), "failsafe stopped") {
		t.Fatalf("the hook failed:\n%s", hookLogs)
	}
}

// BenchmarkFailsafeFallback measures the time from the last operator replica's crash to the
// deletion of its stale ServiceEntry by the watchdog (--stale-after 30s, --check-interval 5s):
// the lease's last renewal precedes the crash by up to the retry period.
//
//	make envtest-assets && eval "$(make -s test-env)" && go test -run '^$' -bench FailsafeFallback -benchtime 1x ./cmd/adaptive-lb/
func BenchmarkFailsafeFallback(b *testing.B) {
	c := newOpsCluster(b)
	c.setReady(3)
	c.createALB()
	for b.Loop() {
		stopA, logsA := c.start("A", false)
		c.waitForEndpoints(3, logsA)
		stopWatchdog, watchdogLogs := c.startFailsafe("--stale-after", "30s", "--check-interval", "5s")
		time.Sleep(6 * time.Second) // the watchdog has seen the lease renewed
		t0 := time.Now()
		stopA()
		c.waitFor("fallback", c.serviceEntryGone, watchdogLogs)
		fallback := time.Since(t0)
		stopB, logsB := c.start("B", true)
		t1 := time.Now()
		c.waitForEndpoints(3, logsB)
		back := time.Since(t1)
		stopB()
		stopWatchdog()
		b.ReportMetric(fallback.Seconds(), "fallback_s")
		b.ReportMetric(back.Seconds(), "rebuilt_s")
	}
}

// The chart's watchdog Deployment and uninstall hook Job pass flags to `adaptive-lb failsafe`;
// each rendered argument list is parsed by the failsafe command's own flag set.
func TestDeployFlags_TheWatchdogAndHookFlagsExist(t *testing.T) {
	helm := os.Getenv("ADAPTIVELB_HELM_BIN")
	if helm == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("ADAPTIVELB_HELM_BIN is not set: run `make test`")
		}
		t.Skip("ADAPTIVELB_HELM_BIN is not set: run `make test`, which builds helm")
	}
	out, err := exec.Command(helm, "template", "lb", "../../charts/adaptive-lb", "--namespace", "adaptive-lb-system", "--kube-version", "1.36.3",
		"--set", "watchNamespaces={shop,web}").Output()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if u.GetKind() != "Deployment" && u.GetKind() != "Job" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			m := c.(map[string]any)
			if name := m["name"].(string); name == "failsafe" || name == "uninstall" {
				for _, v := range m["args"].([]any) {
					found[name] = append(found[name], v.(string))
				}
			}
		}
	}
	for _, name := range []string{"failsafe", "uninstall"} {
		args := found[name]
		if len(args) == 0 || args[0] != "failsafe" {
			t.Fatalf("%s container args %q do not start with the failsafe command", name, args)
		}
		cmd := newFailsafeCmd()
		if err := cmd.ParseFlags(args[1:]); err != nil {
			t.Fatalf("adaptive-lb failsafe rejects the %s container's args %q: %v", name, args, err)
		}
		for _, a := range args[1:] {
			if flag := strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0]; !cmd.Flags().Changed(flag) {
				t.Errorf("%s: flag %q was not parsed as set", name, flag)
			}
		}
	}
}

// A watchdog that starts while the operator is healthy must not take the renew time, written by
// the operator's clock, as a verdict: with the operator's node minutes behind, a fresh lease
// looks stale at the first reading. Only a record seen unchanged across checks counts; a lease
// left by an operator that is really down is still acted on, one check later.
func TestFailsafe_ClockSkewAtStartDoesNotDeleteALiveOperatorsServiceEntries(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	ctx := context.Background()
	now := time.Date(2026, 11, 23, 4, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	skew := 10 * time.Minute // the operator's node is this far behind
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: controller.HeartbeatLeaseName("adaptive-lb.adaptivelb.io"), Namespace: operatorNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("op-1"), LeaseDurationSeconds: ptr.To[int32](30),
			RenewTime: &metav1.MicroTime{Time: now.Add(-skew)}}}
	if err := admin.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: operatorNamespace,
		Labels: map[string]string{controller.ManagedByLabel: controller.ManagedByValue}}}
	se.Spec.Hosts = []string{"web.example.internal"}
	// Its Service exists: the watchdog deletes a ServiceEntry whose Service is gone at once.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: operatorNamespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	for _, o := range []client.Object{svc, se} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	present := func() bool {
		err := admin.Get(ctx, types.NamespacedName{Namespace: operatorNamespace, Name: "web"}, &networkingv1.ServiceEntry{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	watched := startWatchedMetadata(t, env)
	w := &watchdog{client: admin, clock: clk, logger: logr.Discard(), staleAfter: 3 * time.Minute, watched: watched,
		lease:     types.NamespacedName{Namespace: operatorNamespace, Name: "adaptive-lb.adaptivelb.io"},
		heartbeat: types.NamespacedName{Namespace: operatorNamespace, Name: lease.Name}}

	w.check(ctx)
	if !present() {
		t.Fatal("the first check deleted the ServiceEntry of an operator whose only fault is its clock")
	}
	// The operator renews (by its own clock) before the next check.
	clk.SetTime(now.Add(15 * time.Second))
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(-skew + 14*time.Second)}
	if err := admin.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	w.check(ctx)
	if !present() {
		t.Fatal("the watchdog deleted the ServiceEntry of an operator that renews its lease")
	}

	// A watchdog that starts after the operator died: the record stays as it is, and the next
	// check deletes.
	w2 := &watchdog{client: admin, clock: clk, logger: logr.Discard(), staleAfter: 3 * time.Minute, watched: watched,
		lease:     types.NamespacedName{Namespace: operatorNamespace, Name: "adaptive-lb.adaptivelb.io"},
		heartbeat: types.NamespacedName{Namespace: operatorNamespace, Name: lease.Name}}
	w2.check(ctx)
	clk.SetTime(now.Add(30 * time.Second))
	w2.check(ctx)
	if present() {
		t.Fatal("the watchdog kept the ServiceEntries of an operator that stopped renewing long ago")
	}
}

// Two installations of adaptive-lb in one cluster (each with its own Lease) each run a
// watchdog without --namespaces: the watchdog of the one whose operator is down deletes that
// installation's ServiceEntries, and those without an installation label (written before the
// label existed, see installSelectors), never the other installation's.
func TestFailsafe_DeletesOnlyItsOwnInstallationsServiceEntries(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	ctx := context.Background()
	now := time.Date(2026, 11, 23, 4, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	const leaseName = "adaptive-lb.adaptivelb.io"
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: controller.HeartbeatLeaseName(leaseName), Namespace: operatorNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("op-1"), LeaseDurationSeconds: ptr.To[int32](30),
			RenewTime: &metav1.MicroTime{Time: now.Add(-time.Hour)}}}
	if err := admin.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"shop", "web"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// Each with its Service: the heartbeat, not a Service gone, is what deletes them here.
	serviceEntry := func(ns, name string, labels map[string]string) types.NamespacedName {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}}
		se.Spec.Hosts = []string{name + "." + ns + ".svc.cluster.local"}
		for _, o := range []client.Object{svc, se} {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		return client.ObjectKeyFromObject(se)
	}
	managed := func(install string) map[string]string {
		l := map[string]string{controller.ManagedByLabel: controller.ManagedByValue}
		if install != "" {
			l[controller.InstallLabel] = install
		}
		return l
	}
	ours := controller.InstallID(operatorNamespace, leaseName)
	theirs := controller.InstallID("team-b-adaptive-lb", leaseName)
	gone := []types.NamespacedName{
		serviceEntry("shop", "cart", managed(ours)),
		serviceEntry("web", "front", managed(ours)),
		serviceEntry("web", "legacy", managed("")),
	}
	kept := []types.NamespacedName{
		serviceEntry("shop", "other-install", managed(theirs)),
		serviceEntry("web", "other-install", managed(theirs)),
		serviceEntry("web", "not-managed", map[string]string{"team": "web"}),
	}

	w := &watchdog{client: admin, clock: clk, logger: logr.Discard(), staleAfter: 3 * time.Minute, watched: startWatchedMetadata(t, env),
		lease:     types.NamespacedName{Namespace: operatorNamespace, Name: leaseName},
		heartbeat: types.NamespacedName{Namespace: operatorNamespace, Name: lease.Name}}
	w.check(ctx)
	for _, key := range gone {
		if err := admin.Get(ctx, key, &networkingv1.ServiceEntry{}); err != nil {
			t.Fatalf("ServiceEntry %s was deleted at the first reading of the heartbeat, whose staleness is not confirmed yet: %v", key, err)
		}
	}
	clk.SetTime(now.Add(15 * time.Second))
	w.check(ctx) // the second reading confirms the stale record: the watchdog deletes
	for _, key := range gone {
		if err := admin.Get(ctx, key, &networkingv1.ServiceEntry{}); !apierrors.IsNotFound(err) {
			t.Errorf("ServiceEntry %s of the installation whose operator is down is still there (%v)", key, err)
		}
	}
	for _, key := range kept {
		if err := admin.Get(ctx, key, &networkingv1.ServiceEntry{}); err != nil {
			t.Errorf("ServiceEntry %s, not this installation's, was deleted: %v", key, err)
		}
	}
}

func TestInstallID_IsAValidLabelValueNamingTheLease(t *testing.T) {
	if got := controller.InstallID("adaptive-lb-system", "adaptive-lb.adaptivelb.io"); got != "adaptive-lb-system.adaptive-lb.adaptivelb.io" {
		t.Errorf("InstallID = %q", got)
	}
	long := strings.Repeat("n", 63)
	a, b := controller.InstallID(long, "adaptive-lb.adaptivelb.io"), controller.InstallID(long, "adaptive-lb.other.io")
	for _, id := range []string{a, b} {
		if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
			t.Errorf("InstallID %q is no label value: %v", id, errs)
		}
	}
	if a == b {
		t.Errorf("two Leases with long names share the InstallID %q", a)
	}
}

// A managed ServiceEntry left without an owner while no operator ran (its AdaptiveLoadBalancer
// deleted with --cascade=orphan, say) is deleted when an operator starts, running as its own
// least-privilege ServiceAccount.
func TestRun_DeletesOrphanedServiceEntriesAtStart(t *testing.T) {
	c := newOpsCluster(t)
	orphan := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "left-over", Namespace: opsApp,
		Labels: map[string]string{controller.ManagedByLabel: controller.ManagedByValue, controller.ServiceEntryOwnerLabel: "gone"}}}
	orphan.Spec.Hosts = []string{"left-over." + opsApp + ".svc.cluster.local"}
	c.create(orphan)
	stop, logs := c.start("A", true)
	defer stop()
	c.waitFor("the orphaned ServiceEntry is deleted at start", func() bool {
		err := c.admin.Get(c.ctx, client.ObjectKeyFromObject(orphan), &networkingv1.ServiceEntry{})
		return apierrors.IsNotFound(err)
	}, logs)
}

// A ServiceEntry never outlives its Service: with no operator running and the heartbeat far from
// stale, the watchdog deletes the ServiceEntry of a Service that is gone (without it, istiod
// would keep the ServiceEntry as the host's only service), and leaves it while the Service is
// there.
func TestFailsafe_DeletesAServiceEntryWhoseServiceIsGone(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(2)
	c.createALB()
	stopA, logsA := c.start("A", false)
	c.waitForEndpoints(2, logsA)
	stopA() // a crash: the heartbeat stays, unrenewed, far from stale below
	// A further slice of the Service's ServiceEntry, named web.1, labelled as the operator labels
	// its slices: no Service is named web.1, but its Service (its ServiceLabel) is there.
	first := &networkingv1.ServiceEntry{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, first); err != nil {
		t.Fatal(err)
	}
	if first.Labels[controller.ServiceLabel] != "web" {
		t.Fatalf("the ServiceEntry's labels %v lack %s=web", first.Labels, controller.ServiceLabel)
	}
	slice := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: opsApp, Name: "web.1", Labels: first.Labels, OwnerReferences: first.OwnerReferences}}
	first.Spec.DeepCopyInto(&slice.Spec)
	if err := c.admin.Create(c.ctx, slice); err != nil {
		t.Fatal(err)
	}
	sliceGone := func() bool {
		return apierrors.IsNotFound(c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web.1"}, &networkingv1.ServiceEntry{}))
	}
	stopWatchdog, logs := c.startFailsafe("--stale-after", "10m", "--check-interval", "200ms", "--log-level", "debug")
	defer stopWatchdog()
	c.waitFor("a few checks", func() bool { return strings.Count(logs.String(), "heartbeat fresh") >= 5 }, logs)
	if c.serviceEntryGone() || sliceGone() {
		t.Fatalf("the watchdog deleted a ServiceEntry slice of an existing Service (web gone: %v, web.1 gone: %v):\n%s", c.serviceEntryGone(), sliceGone(), logs)
	}
	if err := c.admin.Delete(c.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: opsApp, Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the watchdog deletes the ServiceEntry whose Service is gone", c.serviceEntryGone, logs)
	c.waitFor("the watchdog deletes its further slice too", sliceGone, logs)
	c.waitFor("the deletion is logged", func() bool {
		return strings.Contains(logs.String(), "deleted a ServiceEntry whose Service is gone")
	}, logs)
	c.waitFor("the status no longer claims the ServiceEntry", func() bool {
		mirrored, ready := c.condition(adlbv1.ConditionEndpointsMirrored), c.condition(adlbv1.ConditionReady)
		return mirrored != nil && mirrored.Reason == adlbv1.ReasonTargetNotFound && ready != nil && ready.Status == metav1.ConditionFalse
	}, logs)
}
