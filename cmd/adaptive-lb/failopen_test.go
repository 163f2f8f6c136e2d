package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// The operator's user and the ClusterRole config/rbac gives it.
const (
	operatorSA   = "system:serviceaccount:" + operatorNamespace + ":adaptive-lb"
	operatorRole = "adaptive-lb"
)

// newE2ECluster is a real API server with kube-controller-manager beside it (its EndpointSlice
// controller writes the application's slices, its garbage collector runs), the operator's RBAC,
// and Service shop/web with three ready pods. The operator reaches the API server through a
// proxy that can reset its connections.
func newE2ECluster(t *testing.T) (*opsCluster, *testtools.Proxy) {
	t.Helper()
	admin, kubeconfig, env := operatorEnv(t, nil)
	testtools.RunControllerManager(t, env)
	apiServer, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testtools.StartProxy(t, apiServer.Host)
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cluster := range kc.Clusters {
		cluster.Server = "https://" + proxy.Addr()
	}
	proxied := filepath.Join(t.TempDir(), "operator-through-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, proxied); err != nil {
		t.Fatal(err)
	}
	c := &opsCluster{t: t, ctx: context.Background(), admin: admin, kubeconfig: proxied, env: env}
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opsApp}})
	// The EndpointSlice controller leaves out the pods of a node it does not know.
	c.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "eu-west-1a"}}})
	c.create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: opsApp}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "web"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}})
	for i := 1; i <= 3; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i), Namespace: opsApp, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
		c.create(p)
		ip := fmt.Sprintf("10.9.0.%d", i)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if err := admin.Status().Update(c.ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	return c, proxy
}

// setPodReady sets a pod's Ready condition, as its kubelet would.
func (c *opsCluster) setPodReady(name string, ready bool) {
	c.t.Helper()
	if err := testtools.SetPodReady(c.ctx, c.admin, types.NamespacedName{Namespace: opsApp, Name: name}, ready); err != nil {
		c.t.Fatal(err)
	}
}

// revoke removes from the operator's ClusterRole every rule on resources, or only the verbs if
// given, and waits until the API server's authorizer refuses the first of them; it returns a
// function that restores the role and waits until the authorizer allows it again.
func (c *opsCluster) revoke(group, resource string, verbs ...string) (restore func()) {
	c.t.Helper()
	role := &rbacv1.ClusterRole{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Name: operatorRole}, role); err != nil {
		c.t.Fatal(err)
	}
	original := role.DeepCopy()
	probe := "list"
	for i := range role.Rules {
		r := &role.Rules[i]
		if !slices.Contains(r.APIGroups, group) || !slices.Contains(r.Resources, resource) {
			continue
		}
		if len(verbs) == 0 {
			r.Resources = slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == resource })
		} else {
			probe = verbs[0]
			r.Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return slices.Contains(verbs, v) })
		}
	}
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return len(r.Resources) == 0 && len(r.NonResourceURLs) == 0 })
	if err := c.admin.Update(c.ctx, role); err != nil {
		c.t.Fatal(err)
	}
	c.waitAuthorized(group, resource, probe, false)
	return func() {
		c.t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			current := &rbacv1.ClusterRole{}
			if err := c.admin.Get(c.ctx, types.NamespacedName{Name: operatorRole}, current); err != nil {
				return err
			}
			current.Rules = original.Rules
			return c.admin.Update(c.ctx, current)
		})
		if err != nil {
			c.t.Fatal(err)
		}
		c.waitAuthorized(group, resource, probe, true)
	}
}

// waitAuthorized asks the API server's authorizer (SubjectAccessReview) until the operator may, or
// may not, use verb on the resource: it sees RBAC changes through an informer, moments later.
func (c *opsCluster) waitAuthorized(group, resource, verb string, want bool) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("the authorizer says %v to %s %s.%s", want, verb, resource, group), func() bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: operatorSA,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: group, Resource: resource, Verb: verb, Namespace: opsApp}}}
		if err := c.admin.Create(c.ctx, sar); err != nil {
			c.t.Fatal(err)
		}
		return sar.Status.Allowed == want
	})
}

// condition returns the AdaptiveLoadBalancer's condition of type (nil when absent).
func (c *opsCluster) condition(condType string) *metav1.Condition {
	c.t.Helper()
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, alb); err != nil {
		c.t.Fatal(err)
	}
	return meta.FindStatusCondition(alb.Status.Conditions, condType)
}

// leaseRenewed reads a Lease's renew time in the operator's namespace.
func (c *opsCluster) leaseRenewed(name string) time.Time {
	c.t.Helper()
	renewed, err := testtools.LeaseRenewTime(c.ctx, c.admin, types.NamespacedName{Namespace: operatorNamespace, Name: name})
	if err != nil {
		c.t.Fatal(err)
	}
	return renewed
}

// waitWithin polls cond until it holds or within has passed since from, and fails the test then:
// a bound on a documented time, not a measure of it.
func (c *opsCluster) waitWithin(what string, from time.Time, within time.Duration, cond func() bool, logs ...fmt.Stringer) {
	c.t.Helper()
	for !cond() {
		if time.Since(from) > within {
			var all []string
			for _, l := range logs {
				all = append(all, l.String())
			}
			c.t.Fatalf("%s: not within %v; logs:\n%s", what, within, strings.Join(all, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const e2eStaleTimeout = 10 * time.Second

// An operator that keeps running but can no longer see EndpointSlices (its Role loses the verbs
// after its caches synced, and its watch ends, as it does at the latest when the API server
// times it out, here at once by a connection reset) would keep pods that leave in its
// ServiceEntry for good, while it renews its leader Lease. With kube-controller-manager writing the
// real slices:
//   - the operator stops mirroring from the frozen cache (CacheStale) and deletes the
//     ServiceEntry once --stale-serviceentry-timeout has passed since its list was first refused:
//     the cluster falls back to the Kubernetes endpoints;
//   - when it cannot delete either, it withholds its heartbeat while its leader Lease is still
//     renewed, and the fail-open watchdog, which reads the heartbeat, deletes it;
//   - once the verbs are back, the operator re-creates it with the current endpoints.
func TestOperations_AnOperatorThatCanNoLongerWatchEndpointSlicesFallsBack(t *testing.T) {
	c, proxy := newE2ECluster(t)
	stop, logs := c.start("A", true, "--stale-serviceentry-timeout", e2eStaleTimeout.String())
	defer stop()
	c.createALB()
	c.waitForEndpoints(3, logs)
	stopWatchdog, watchdogLogs := c.startFailsafe("--stale-after", "15s", "--check-interval", "500ms", "--log-level", "debug")
	defer stopWatchdog()
	c.waitFor("the watchdog sees the heartbeat renewed", func() bool {
		return strings.Count(watchdogLogs.String(), "heartbeat fresh") >= 3
	}, watchdogLogs)

	// 1. The operator's Role loses get, list and watch on EndpointSlices; its watch ends.
	restore := c.revoke("discovery.k8s.io", "endpointslices")
	proxy.Reset()
	revoked := time.Now()
	c.setPodReady("web-3", false) // the Kubernetes endpoints change; the operator cannot see it
	// Documented: the stale timeout after the first refused list, plus the 5 s in which the
	// informer's retries may repair it (and slack for a loaded machine).
	c.waitWithin("the operator deletes its ServiceEntry", revoked, e2eStaleTimeout+5*time.Second+30*time.Second, c.serviceEntryGone, logs)
	c.waitFor("Ready says StaleServiceEntryRemoved (the status follows the deletion)", func() bool {
		cond := c.condition(adlbv1.ConditionReady)
		return cond != nil && cond.Reason == adlbv1.ReasonStaleServiceEntryRemoved
	}, logs)
	if cond := c.condition(adlbv1.ConditionReady); !strings.Contains(cond.Message, "endpointslices") || !strings.Contains(cond.Message, "forbidden") {
		t.Fatalf("Ready's message %q does not name the EndpointSlice informer's refused list", cond.Message)
	}
	restore()
	c.waitFor("the operator re-creates the ServiceEntry with the current endpoints", func() bool {
		se := &networkingv1.ServiceEntry{}
		err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, se)
		return err == nil && len(se.Spec.Endpoints) == 2
	}, logs)

	// 2. It loses the EndpointSlice verbs and delete on ServiceEntries: it cannot remove the
	// ServiceEntry itself, and still renews its leader Lease.
	restoreSlices := c.revoke("discovery.k8s.io", "endpointslices")
	restoreDelete := c.revoke("networking.istio.io", "serviceentries", "delete")
	proxy.Reset()
	revoked = time.Now()
	c.setPodReady("web-2", false)
	leader := c.leaseRenewed("adaptive-lb.adaptivelb.io")
	// Documented: the watchdog's --stale-after after the heartbeat stopped, plus one check.
	c.waitWithin("the watchdog deletes the ServiceEntry", revoked, 5*time.Second+15*time.Second+30*time.Second, c.serviceEntryGone, logs, watchdogLogs)
	// The log line follows the deletions and the status writes that say why on each
	// AdaptiveLoadBalancer.
	c.waitFor("the watchdog logs why it deleted", func() bool {
		return strings.Contains(watchdogLogs.String(), "no operator has renewed its heartbeat")
	}, watchdogLogs)
	// Alive all along: it keeps renewing its leader Lease. The watchdog may act within one
	// renewal period (the heartbeat can still be stale from part 1), so wait for the next one.
	c.waitFor("the leader Lease renewed while the operator is blind (this test must show a live but blind operator)", func() bool {
		return c.leaseRenewed("adaptive-lb.adaptivelb.io").After(leader)
	}, logs)
	if !strings.Contains(logs.String(), "heartbeat withheld") {
		t.Errorf("the operator did not log that it withholds its heartbeat:\n%s", logs)
	}
	restoreDelete()
	restoreSlices()
	c.waitFor("the operator re-creates the ServiceEntry with the current endpoint", func() bool {
		se := &networkingv1.ServiceEntry{}
		err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, se)
		return err == nil && len(se.Spec.Endpoints) == 1
	}, logs)
	c.waitFor("the watchdog sees the heartbeat again", func() bool {
		return strings.Contains(watchdogLogs.String(), "the operator renews its heartbeat again")
	}, watchdogLogs)
}

// Uninstalling after the AdaptiveLoadBalancer CRD was deleted (kubectl delete -f crds/, then helm
// uninstall), with kube-controller-manager running: the CRD's deletion takes every
// AdaptiveLoadBalancer and its ServiceEntry with it; the operator, blind to its own kind, keeps
// running without writing and withholds its heartbeat; the uninstall hook then finds nothing to
// delete and exits. No managed ServiceEntry is left in the cluster.
func TestOperations_UninstallWithTheCRDDeleted(t *testing.T) {
	c, _ := newE2ECluster(t)
	stop, logs := c.start("A", true)
	c.createALB()
	c.waitForEndpoints(3, logs)

	deleteOwnCRD(t, c.admin)
	c.waitFor("the ServiceEntry goes with its AdaptiveLoadBalancer", c.serviceEntryGone, logs)
	c.waitFor("the operator withholds its heartbeat", func() bool { return strings.Contains(logs.String(), "heartbeat withheld") }, logs)
	if strings.Contains(logs.String(), "the process exited") {
		t.Fatalf("the operator exited when its CRD was deleted:\n%s", logs)
	}

	stop() // helm uninstall deletes the Deployment: the pods stop gracefully
	stopHook, hookLogs := c.startFailsafe("--uninstall", "--check-interval", "200ms")
	defer stopHook()
	c.waitFor("the hook exits", func() bool { return strings.Contains(hookLogs.String(), "deleted the managed ServiceEntries") }, hookLogs)
	if strings.Contains(hookLogs.String(), "failsafe stopped") {
		t.Fatalf("the hook failed:\n%s", hookLogs)
	}
	var left networkingv1.ServiceEntryList
	if err := c.admin.List(c.ctx, &left, client.MatchingLabels{controller.ManagedByLabel: controller.ManagedByValue}); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) > 0 {
		t.Fatalf("%d managed ServiceEntries left after the uninstall", len(left.Items))
	}
}

// refuseServiceEntryWrites makes the API server refuse every create and update of a
// ServiceEntry (an admission policy, as a cluster admin could add) and waits until it does.
func (c *opsCluster) refuseServiceEntryWrites() {
	c.t.Helper()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "refuse-se-writes"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"networking.istio.io"}, APIVersions: []string{"*"}, Resources: []string{"serviceentries"}},
				}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "ServiceEntry writes are refused by a test policy"}},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "refuse-se-writes"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	c.create(policy)
	c.create(binding)
	c.waitFor("the API server enforces the policy", func() bool {
		se := &networkingv1.ServiceEntry{}
		if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, se); err != nil {
			return false
		}
		se.Labels["probe"] = "x"
		err := c.admin.Update(c.ctx, se, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "test policy")
	})
}

// The stale deadline is a fact about the ServiceEntry, not about one leader's memory. Its mirror
// starts failing (writes refused by a policy), and leadership then moves twice within the stale
// timeout, as it does under an API brownout: the ServiceEntry is deleted as the first failure's
// deadline says, and the StaleServiceEntryRemoved condition gives the failures' start as the
// first leader saw it (EndpointsMirrored's lastTransitionTime), not a later leader's first look.
func TestOperations_TheStaleDeadlineSurvivesLeaderChanges(t *testing.T) {
	c := newOpsCluster(t)
	timeout := []string{"--stale-serviceentry-timeout", e2eStaleTimeout.String()}
	c.setReady(3)
	c.createALB()
	stopA, logsA := c.start("A", true, timeout...)
	c.waitForEndpoints(3, logsA)
	stopB, logsB := c.start("B", true, timeout...)
	defer stopB()
	c.refuseServiceEntryWrites()

	c.setReady(2) // A cannot write it
	var failing *metav1.Condition
	c.waitFor("A reports the failed write", func() bool {
		failing = c.condition(adlbv1.ConditionEndpointsMirrored)
		return failing != nil && failing.Reason == adlbv1.ReasonWriteFailed
	}, logsA)
	began := failing.LastTransitionTime.UTC().Format(time.RFC3339)

	// Two graceful handovers: A to B, then B to C, each a new leader with an empty memory
	// (normally both within the 10 s timeout; on a slow machine B may delete first, which the
	// check below judges the same way).
	a := c.holder()
	stopA()
	c.waitFor("B leads", func() bool { h := c.holder(); return h != "" && h != a }, logsB)
	b := c.holder()
	stopC, logsC := c.start("C", true, timeout...)
	defer stopC()
	time.Sleep(2 * time.Second) // C's caches sync as a standby
	stopB()
	c.waitFor("C leads", func() bool { h := c.holder(); return h != "" && h != b }, logsC)

	c.waitFor("the stale ServiceEntry is deleted", c.serviceEntryGone, logsB, logsC)
	c.waitFor("StaleServiceEntryRemoved", func() bool {
		cond := c.condition(adlbv1.ConditionEndpointsMirrored)
		return cond != nil && cond.Reason == adlbv1.ReasonStaleServiceEntryRemoved
	}, logsC)
	if cond := c.condition(adlbv1.ConditionEndpointsMirrored); !strings.Contains(cond.Message, "(since "+began+")") {
		t.Fatalf("the failures began at %s, when A saw them; the condition says %q", began, cond.Message)
	}
}
