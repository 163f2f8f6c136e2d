package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

// failsafeUser is the ServiceAccount startFailsafe runs the watchdog as.
const failsafeUser = "system:serviceaccount:" + operatorNamespace + ":adaptive-lb-failsafe"

// startWatchedMetadata runs the watchdog's watches against the test's API server until the test
// ends, and waits for them to sync.
func startWatchedMetadata(t *testing.T, env *envtest.Environment) *watchedMetadata {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	watched := newWatchedMetadata(env.Config, nil, logr.Discard())
	watched.start(ctx)
	if !watched.waitForSync(ctx, time.Minute) {
		t.Fatal("the watchdog's watches did not sync in a minute")
	}
	return watched
}

// auditLogFlags are kube-apiserver flags that record every request's metadata (who, verb,
// resource) as JSON lines in the returned file.
func auditLogFlags(t testing.TB) (map[string]string, string) {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "audit.log")
	return map[string]string{"audit-policy-file": policy, "audit-log-path": log, "audit-log-format": "json"}, log
}

// managedServiceEntry is a ServiceEntry of the default installation's operator for Service
// name in ns.
func managedServiceEntry(ns, name string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
		controller.ManagedByLabel: controller.ManagedByValue,
		controller.InstallLabel:   controller.InstallID(operatorNamespace, "adaptive-lb.adaptivelb.io"),
		controller.ServiceLabel:   name,
	}}}
	se.Spec.Hosts = []string{name + "." + ns + ".svc.cluster.local"}
	return se
}

// Issue 31: after start-up the watchdog lists nothing. It follows the Services and the managed
// ServiceEntries by watches; at each check it reads only the heartbeat Lease. The API server's
// audit log, which records each of the watchdog's requests, shows no list of Services or
// ServiceEntries during ten checks (before the watches, each check listed the ServiceEntries
// twice and the Services once), and, once the Service is deleted, the ServiceEntry goes with
// one GET of the Service and still no list.
func TestFailsafe_ListsNoServicesOrServiceEntriesAfterStartUp(t *testing.T) {
	flags, auditLog := auditLogFlags(t)
	c := newOpsClusterWith(t, flags)
	// With a managed ServiceEntry of its installation, whose Service exists: before the watches,
	// the watchdog then listed the Services at every check.
	c.create(managedServiceEntry(opsApp, "web"))
	stop, logs := c.startFailsafe("--stale-after", "10m", "--check-interval", "200ms", "--log-level", "debug")
	defer stop()
	checks := func() int { return strings.Count(logs.String(), "heartbeat fresh") }
	// A check or two after the sync: the initial list (if the watches made one) is in the audit
	// log by then.
	c.waitFor("the watches sync and the checks begin", func() bool {
		return strings.Contains(logs.String(), "have synced") && checks() >= 2
	}, logs)

	before, first := auditCounts(t, auditLog, failsafeUser), checks()
	c.waitFor("ten more checks", func() bool { return checks() >= first+10 }, logs)
	during := auditCounts(t, auditLog, failsafeUser).minus(before)
	t.Logf("the watchdog's requests during ten checks: %v", during.detail)
	if during.detail["get leases"] < 10 {
		t.Fatalf("the audit log shows %d reads of the heartbeat Lease in ten checks: it does not record the watchdog's requests (%v)", during.detail["get leases"], during.detail)
	}
	for _, resource := range []string{"services", "serviceentries"} {
		if n := during.detail["list "+resource]; n > 0 {
			t.Errorf("the watchdog listed %s %d times in ten checks after start-up; want none (its requests: %v)", resource, n, during.detail)
		}
	}
	if c.serviceEntryGone() {
		t.Fatalf("the watchdog deleted the ServiceEntry of an existing Service:\n%s", logs)
	}

	before = auditCounts(t, auditLog, failsafeUser)
	if err := c.admin.Delete(c.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: opsApp, Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the watchdog deletes the ServiceEntry whose Service is gone", c.serviceEntryGone, logs)
	deletion := auditCounts(t, auditLog, failsafeUser).minus(before)
	if deletion.detail["get services"] < 1 {
		t.Errorf("the watchdog deleted the ServiceEntry without confirming with a GET that its Service is gone (its requests: %v)", deletion.detail)
	}
	for _, resource := range []string{"services", "serviceentries"} {
		if n := deletion.detail["list "+resource]; n > 0 {
			t.Errorf("the watchdog listed %s %d times to delete a ServiceEntry whose Service is gone; want none (its requests: %v)", resource, n, deletion.detail)
		}
	}
}

// Until its watches have synced, a Service missing from them may only not be delivered yet: the
// watchdog deletes no ServiceEntry for its Service then, and does once they have synced.
func TestFailsafe_DeletesNothingForAGoneServiceUntilTheWatchesSync(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	ctx := context.Background()
	se := managedServiceEntry(operatorNamespace, "web") // no Service web
	if err := admin.Create(ctx, se); err != nil {
		t.Fatal(err)
	}
	watched := newWatchedMetadata(env.Config, nil, logr.Discard())
	w := &watchdog{client: admin, clock: clocktesting.NewFakePassiveClock(time.Now()), logger: logr.Discard(), staleAfter: 3 * time.Minute, watched: watched,
		lease:     types.NamespacedName{Namespace: operatorNamespace, Name: "adaptive-lb.adaptivelb.io"},
		heartbeat: types.NamespacedName{Namespace: operatorNamespace, Name: controller.HeartbeatLeaseName("adaptive-lb.adaptivelb.io")}}
	w.check(ctx)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{}); err != nil {
		t.Fatalf("the watchdog deleted a ServiceEntry for its Service before its watches synced: %v", err)
	}

	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched.start(watchCtx)
	if !watched.waitForSync(watchCtx, time.Minute) {
		t.Fatal("the watches did not sync in a minute")
	}
	w.check(ctx)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry of a Service that never existed is still there once the watches synced (%v)", err)
	}
}

// A watch lags behind the API server. A Service the watch has not seen, but the API server has,
// keeps its ServiceEntry: the watchdog deletes only once a GET confirms the Service is gone. The
// lagging watch here is the real one, stopped after its sync (what it holds stays as it was).
func TestFailsafe_ALaggingWatchDoesNotDeleteTheServiceEntryOfALiveService(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	ctx := context.Background()
	se := managedServiceEntry(operatorNamespace, "web")
	if err := admin.Create(ctx, se); err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	watched := newWatchedMetadata(env.Config, nil, logr.Discard())
	watched.start(watchCtx)
	if !watched.waitForSync(watchCtx, time.Minute) {
		t.Fatal("the watches did not sync in a minute")
	}
	stopWatching()
	<-watched.stopped
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: operatorNamespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if err := admin.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := watched.reader.Get(ctx, client.ObjectKeyFromObject(svc), metadataOf(serviceGVK)); !apierrors.IsNotFound(err) {
		t.Fatalf("the stopped watch has the Service created after it stopped (%v): it does not lag", err)
	}
	w := &watchdog{client: admin, clock: clocktesting.NewFakePassiveClock(time.Now()), logger: logr.Discard(), staleAfter: 3 * time.Minute, watched: watched,
		lease:     types.NamespacedName{Namespace: operatorNamespace, Name: "adaptive-lb.adaptivelb.io"},
		heartbeat: types.NamespacedName{Namespace: operatorNamespace, Name: controller.HeartbeatLeaseName("adaptive-lb.adaptivelb.io")}}
	w.check(ctx)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{}); err != nil {
		t.Fatalf("the watchdog deleted the ServiceEntry of a Service its watch had not seen yet: %v", err)
	}

	if err := admin.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	w.check(ctx)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry is still there after the API server confirmed its Service gone (%v)", err)
	}
}
