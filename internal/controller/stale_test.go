package controller

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// suiteStaleTimeout is the suite operator's --stale-serviceentry-timeout: short enough for a
// test to wait out, longer than any test keeps writes failing on purpose otherwise.
const suiteStaleTimeout = 10 * time.Second

// refuseServiceEntryWrites installs a ValidatingAdmissionPolicy and its binding that make the
// real API server refuse (422 Invalid) every create and update of a ServiceEntry in the
// fixture's namespace, as a policy or webhook a cluster admin adds would, and the extra
// operations (DELETE) too; deletes pass otherwise. It returns once the API server enforces it,
// and a function that lifts it.
func (f *fixture) refuseServiceEntryWrites(extra ...admissionv1.OperationType) (lift func()) {
	f.t.Helper()
	return f.admissionPolicy("refuse-se-writes-"+f.ns, append([]admissionv1.OperationType{admissionv1.Create, admissionv1.Update}, extra...), func() error {
		se, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		se.Labels["probe"] = "x"
		err = k8s.Update(f.ctx, se, client.DryRunAll)
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "test policy") {
			return nil
		}
		return fmt.Errorf("a dry-run update returned %v", err)
	})
}

// admissionPolicy installs a policy named name that refuses the operations on ServiceEntries in
// the fixture's namespace, waits until enforced (a probe of the caller's) says the API server
// applies it (it loads policies asynchronously), and returns a function that lifts it.
func (f *fixture) admissionPolicy(name string, ops []admissionv1.OperationType, enforced func() error) (lift func()) {
	f.t.Helper()
	return f.admissionPolicyRefusing(name, ops, "false", enforced)
}

// admissionPolicyRefusing is admissionPolicy for the writes whose object fails the CEL
// expression allowed.
func (f *fixture) admissionPolicyRefusing(name string, ops []admissionv1.OperationType, allowed string, enforced func() error) (lift func()) {
	f.t.Helper()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: ops,
					Rule:       admissionv1.Rule{APIGroups: []string{"networking.istio.io"}, APIVersions: []string{"*"}, Resources: []string{"serviceentries"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: allowed,
				Message:    "ServiceEntry writes are refused by a test policy",
				Reason:     ptr.To(metav1.StatusReasonInvalid),
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: f.ns}}},
		},
	}
	f.create(policy)
	f.create(binding)
	f.eventually("the API server enforces the policy", enforced)
	return func() {
		f.t.Helper()
		for _, o := range []client.Object{binding, policy} {
			if err := k8s.Delete(f.ctx, o); err != nil && !apierrors.IsNotFound(err) {
				f.t.Fatal(err)
			}
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// warningEvents returns the messages of the Warning events with reason on the fixture's objects.
func (f *fixture) warningEvents(reason string) []string {
	f.t.Helper()
	var list corev1.EventList
	if err := f.c.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// A mirror that keeps failing (here the API server refuses every write of the ServiceEntry with
// 422, from an admission policy) does not leave the last written ServiceEntry in place forever:
// it lists a pod that is gone and misses the new one, and Envoy prefers that copy. After the
// stale timeout it is deleted (clients use the Kubernetes endpoints), reported in the
// conditions, an event and a counter, and re-created with the current endpoints once writes
// succeed again.
func TestMirror_AServiceEntryThatCannotBeUpdatedIsDeletedOnceStale(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.31.0.1")
	f.pod("web", "web-2", "10.31.0.2")
	f.slice("web", "web-x", ready("web-1", "10.31.0.1"), ready("web-2", "10.31.0.2"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.31.0.1", "10.31.0.2")
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	deletions := testutil.ToFloat64(testMetrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionDeleted))

	lift := f.refuseServiceEntryWrites()
	defer lift()
	// web-2 is replaced by web-3: the ServiceEntry cannot follow.
	f.pod("web", "web-3", "10.31.0.3")
	f.slice("web", "web-x", ready("web-1", "10.31.0.1"), ready("web-3", "10.31.0.3"))
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)

	// Past the timeout the ServiceEntry is gone, and the status says why.
	deadline := time.Now().Add(suiteStaleTimeout + 2*time.Minute)
	for {
		_, err := f.serviceEntry("web")
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ServiceEntry still exists %v after its mirror began failing; want it deleted after the stale timeout (%v)", suiteStaleTimeout+2*time.Minute, suiteStaleTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, cond := range []string{adlbv1.ConditionEndpointsMirrored, adlbv1.ConditionReady} {
		c := f.waitForCondition("web", cond, metav1.ConditionFalse, adlbv1.ReasonStaleServiceEntryRemoved)
		if !strings.Contains(c.Message, "test policy") || !strings.Contains(c.Message, "Kubernetes endpoints") {
			t.Errorf("%s should name the failure and the fallback, got %q", cond, c.Message)
		}
	}
	f.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)
	f.eventually("a StaleServiceEntryRemoved event", func() error {
		if len(f.warningEvents(EventStaleServiceEntryRemoved)) == 0 {
			return errNotYet
		}
		return nil
	})
	if got := testutil.ToFloat64(testMetrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionDeleted)); got < deletions+1 {
		t.Errorf("adaptivelb_stale_serviceentry_deletions_total{result=deleted} = %v, want at least %v", got, deletions+1)
	}

	// Writes succeed again: the next retry re-creates it with the current endpoints, without
	// any further change to trigger it.
	lift()
	recreated := time.Now().Add(3 * time.Minute) // the back-off reached by then is below a minute
	for {
		se, err := f.serviceEntry("web")
		if err == nil && strings.Join(addresses(se), ",") == "10.31.0.1,10.31.0.3" {
			break
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if time.Now().After(recreated) {
			t.Fatalf("the ServiceEntry was not re-created with the current endpoints after writes succeed again (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// managedServiceEntry returns a ServiceEntry labelled as the operator's, controlled by owner
// (nil: no owner reference).
func (f *fixture) managedServiceEntry(name string, owner *metav1.OwnerReference) *networkingv1.ServiceEntry {
	f.t.Helper()
	se := sizedServiceEntry(f.ns, name, 1)
	if owner != nil {
		se.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	f.create(se)
	return se
}

// A managed ServiceEntry whose AdaptiveLoadBalancer is gone (deleted with --cascade=orphan, its
// owner reference removed, or its owner re-created as another object) would never be updated
// again. It is deleted; a properly owned one is kept. The garbage collector (kube-controller-
// manager runs beside the suite) deletes those whose owner reference dangles as well, so the
// OrphanDeleted event is checked on the one without an owner reference, which only the operator
// removes.
func TestMirror_DeletesManagedServiceEntriesWithoutALiveOwner(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.32.0.1")
	f.slice("web", "web-x", ready("web-1", "10.32.0.1"))
	alb := f.alb("web", "web")
	owned := f.waitForAddresses("web", "10.32.0.1")
	// A change of the owned one passes through the orphan check too.
	owned.Labels["touched"] = "yes"
	if err := k8s.Update(f.ctx, owned); err != nil {
		t.Fatal(err)
	}

	ref := func(name string, uid types.UID) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer", Name: name, UID: uid,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	}
	orphans := []*networkingv1.ServiceEntry{
		f.managedServiceEntry("no-owner", nil),
		f.managedServiceEntry("owner-gone", ref("gone", "5b7a3c9e-0000-4000-8000-000000000001")),
		f.managedServiceEntry("owner-recreated", ref("web", "5b7a3c9e-0000-4000-8000-000000000002")),
	}
	// Not the operator's: never touched, whoever owns it.
	foreign := sizedServiceEntry(f.ns, "foreign", 1)
	foreign.Labels = map[string]string{"team": "shop"}
	f.create(foreign)

	for _, se := range orphans {
		f.eventually("orphaned ServiceEntry "+se.Name+" deleted", func() error {
			if _, err := f.serviceEntry(se.Name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	f.eventually("an OrphanDeleted event", func() error {
		var list corev1.EventList
		if err := k8s.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == EventOrphanDeleted && e.InvolvedObject.Name == "no-owner" && strings.Contains(e.Message, "no AdaptiveLoadBalancer is its controller") {
				return nil
			}
		}
		return errNotYet
	})
	if se, err := f.serviceEntry("web"); err != nil || se.UID != owned.UID {
		t.Fatalf("the ServiceEntry AdaptiveLoadBalancer %s owns was deleted (now: %v, %v)", alb.Name, se.UID, err)
	}
	if _, err := f.serviceEntry("foreign"); err != nil {
		t.Fatalf("a ServiceEntry without adaptive-lb's label was touched: %v", err)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// suiteInstallID is the suite operator's installation (its leader Lease, were it elected).
const suiteInstallID = "adaptive-lb-test.adaptive-lb.adaptivelb.io"

// Every ServiceEntry names the installation that wrote it, which scopes the fail-open
// watchdog to its own. One labelled as another installation's (the Lease renamed) is restamped
// at the next reconcile; one written before the label existed (here: the label removed) gets it
// with its next write, an endpoint change.
func TestMirror_StampsItsInstallationOnEveryServiceEntry(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.33.0.1")
	f.slice("web", "web-x", ready("web-1", "10.33.0.1"))
	f.alb("web", "web")
	se := f.waitForAddresses("web", "10.33.0.1")
	if got := se.Labels[InstallLabel]; got != suiteInstallID {
		t.Fatalf("a new ServiceEntry has %s=%q, want %q", InstallLabel, got, suiteInstallID)
	}
	hasInstallLabel := func(what string) {
		f.eventually(what, func() error {
			got, err := f.serviceEntry("web")
			if err != nil {
				return err
			}
			if got.Labels[InstallLabel] != suiteInstallID {
				return fmt.Errorf("labels %v", got.Labels)
			}
			return nil
		})
	}
	se.Labels[InstallLabel] = "other-namespace.other-lease"
	if err := k8s.Update(f.ctx, se); err != nil {
		t.Fatal(err)
	}
	hasInstallLabel("the installation label replaces another installation's")

	se, err := f.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}
	delete(se.Labels, InstallLabel)
	if err := k8s.Update(f.ctx, se); err != nil {
		t.Fatal(err)
	}
	f.pod("web", "web-2", "10.33.0.2")
	f.slice("web", "web-x", ready("web-1", "10.33.0.1"), ready("web-2", "10.33.0.2"))
	f.waitForAddresses("web", "10.33.0.1", "10.33.0.2")
	hasInstallLabel("the installation label is stamped with the next write of a ServiceEntry without it")
}

// An upgrade from an operator older than the installation label does not rewrite every
// ServiceEntry for the label alone (10,000 writes and istiod pushes at once at 10,000
// Services): one without it is up to date until its next write. One naming another
// installation is not, since this installation's watchdog would never delete it.
func TestUpToDate_AMissingInstallationLabelWaitsForTheNextWrite(t *testing.T) {
	r := &AdaptiveLoadBalancerReconciler{InstallID: suiteInstallID}
	withLabels := func(labels map[string]string) *networkingv1.ServiceEntry {
		se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
		se.Spec.Hosts = []string{"web.default.svc.cluster.local"}
		return se
	}
	desired := desiredServiceEntry{owner: "web", service: "web", spec: withLabels(nil).Spec.DeepCopy()}
	own := map[string]string{ServiceEntryOwnerLabel: "web", ServiceLabel: "web"}
	with := func(labels map[string]string) map[string]string {
		out := maps.Clone(own)
		maps.Copy(out, labels)
		return out
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"this installation's", with(map[string]string{ManagedByLabel: ManagedByValue, InstallLabel: suiteInstallID}), true},
		{"without the installation label", with(map[string]string{ManagedByLabel: ManagedByValue}), true},
		{"another installation's", with(map[string]string{ManagedByLabel: ManagedByValue, InstallLabel: "other.lease"}), false},
		{"without the managed-by label", with(map[string]string{InstallLabel: suiteInstallID}), false},
		{"without the owner label", map[string]string{ManagedByLabel: ManagedByValue, InstallLabel: suiteInstallID, ServiceLabel: "web"}, false},
		{"without the Service label", map[string]string{ManagedByLabel: ManagedByValue, InstallLabel: suiteInstallID, ServiceEntryOwnerLabel: "web"}, false},
	} {
		if got := r.upToDate(withLabels(c.labels), desired); got != c.want {
			t.Errorf("%s: upToDate = %v, want %v", c.name, got, c.want)
		}
	}
}

// When the stale ServiceEntry cannot be deleted either (a policy refuses that too), the failure
// is reported (WriteFailed saying so, a StaleServiceEntryNotRemoved event, the failed counter)
// and the deletion retried; once the API server accepts writes again the mirror converges.
func TestMirror_AStaleServiceEntryThatCannotBeDeletedIsReported(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.34.0.1")
	f.pod("web", "web-2", "10.34.0.2")
	f.slice("web", "web-x", ready("web-1", "10.34.0.1"), ready("web-2", "10.34.0.2"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.34.0.1", "10.34.0.2")
	failed := testutil.ToFloat64(testMetrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionFailed))

	lift := f.refuseServiceEntryWrites(admissionv1.Delete)
	defer lift()
	f.pod("web", "web-3", "10.34.0.3")
	f.slice("web", "web-x", ready("web-1", "10.34.0.1"), ready("web-3", "10.34.0.3"))

	deadline := time.Now().Add(suiteStaleTimeout + 2*time.Minute)
	for len(f.warningEvents(EventStaleServiceEntryNotRemoved)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %s event %v after the mirror began failing (stale timeout %v)", EventStaleServiceEntryNotRemoved, suiteStaleTimeout+2*time.Minute, suiteStaleTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
	if !strings.Contains(c.Message, "deleting the ServiceEntry") || !strings.Contains(c.Message, "failed too") {
		t.Errorf("EndpointsMirrored should say that the stale ServiceEntry could not be deleted, got %q", c.Message)
	}
	if got := testutil.ToFloat64(testMetrics.StaleServiceEntryDeletions.WithLabelValues(StaleDeletionFailed)); got < failed+1 {
		t.Errorf("adaptivelb_stale_serviceentry_deletions_total{result=failed} = %v, want at least %v", got, failed+1)
	}

	lift()
	converged := time.Now().Add(3 * time.Minute)
	for {
		se, err := f.serviceEntry("web")
		if err == nil && strings.Join(addresses(se), ",") == "10.34.0.1,10.34.0.3" {
			break
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if time.Now().After(converged) {
			t.Fatalf("the ServiceEntry does not list the current endpoints after writes succeed again (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}
