package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// These tests delete owners with the real garbage collector and namespace controller running
// (kube-controller-manager beside the suite's API server), and check what becomes of the
// ServiceEntries and that the operator does not bring one back.

// mirroredService creates Service web with a ready pod web-1, web-2, … at each of ips (the real
// EndpointSlice controller writes its slices) and an AdaptiveLoadBalancer for it, and waits for
// its ServiceEntry.
func (f *fixture) mirroredService(ips ...string) *adlbv1.AdaptiveLoadBalancer {
	f.t.Helper()
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web", slicesByController)
	for i, ip := range ips {
		f.pod("web", fmt.Sprintf("web-%d", i+1), ip)
	}
	alb := f.alb("web", "web")
	f.waitForAddresses("web", ips...)
	return alb
}

// barrier waits until the operator has mirrored a Service created after everything the test did
// so far: the events before it have been handled.
func (f *fixture) barrier(name string) {
	f.t.Helper()
	f.service(name)
	f.alb(name, name)
	f.eventually(name+" mirrored", func() error { _, err := f.serviceEntry(name); return err })
}

func (f *fixture) waitGone(what string, get func() error) {
	f.t.Helper()
	f.eventually(what+" gone", func() error {
		if err := get(); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
}

// Deleting an AdaptiveLoadBalancer (background propagation, kubectl's default) deletes its
// ServiceEntry, which carries a controller reference with blockOwnerDeletion; a later change of
// the Service's pods does not bring it back.
func TestDeletion_ADeletedAdaptiveLoadBalancersServiceEntryGoesAndStaysGone(t *testing.T) {
	requireControllerManager(t)
	f := newFixture(t)
	alb := f.mirroredService("10.7.0.1")
	se, err := f.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(se); ref == nil || ref.UID != alb.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Fatalf("owner reference %+v: want the AdaptiveLoadBalancer as controller, blocking its deletion", ref)
	}
	if err := k8s.Delete(f.ctx, alb); err != nil {
		t.Fatal(err)
	}
	f.waitGone("ServiceEntry", func() error { _, err := f.serviceEntry("web"); return err })
	f.pod("web", "web-2", "10.7.0.2")
	f.barrier("canary")
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry of a deleted AdaptiveLoadBalancer came back (err %v)", err)
	}
}

// With foreground deletion the garbage collector deletes the ServiceEntry first, while the
// AdaptiveLoadBalancer waits marked for deletion; a finalizer of the test's holds it there after
// that. Meanwhile the operator must not re-create the ServiceEntry, also when the Service's pods
// change, and it drops its per-endpoint weight series.
func TestDeletion_ForegroundDeletionDoesNotRecreateTheServiceEntry(t *testing.T) {
	requireControllerManager(t)
	f := newFixture(t)
	alb := f.mirroredService("10.33.0.1")
	f.eventually("weight series published", func() error {
		if n := endpointWeightSeries(t, f.ns, "web"); n != 1 {
			return fmt.Errorf("%d series", n)
		}
		return nil
	})
	const hold = "test.adaptivelb.io/hold"
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the operator writes the status meanwhile
		if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(alb), alb); err != nil {
			return err
		}
		alb.Finalizers = append(alb.Finalizers, hold)
		return k8s.Update(f.ctx, alb)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(f.ctx, alb, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	f.waitGone("ServiceEntry", func() error { _, err := f.serviceEntry("web"); return err })
	f.eventually("the garbage collector is done: only the test's finalizer is left", func() error {
		marked := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(alb), marked); err != nil {
			return err
		}
		if marked.DeletionTimestamp.IsZero() || strings.Join(marked.Finalizers, ",") != hold {
			return fmt.Errorf("deletionTimestamp %v, finalizers %v", marked.DeletionTimestamp, marked.Finalizers)
		}
		return nil
	})
	f.eventually("weight series dropped", func() error {
		if n := endpointWeightSeries(t, f.ns, "web"); n != 0 {
			return fmt.Errorf("%d series", n)
		}
		return nil
	})
	f.pod("web", "web-2", "10.33.0.2")
	f.barrier("canary")
	time.Sleep(500 * time.Millisecond) // the pod's and its slice's events have long been handled
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry came back while its owner was being deleted (err %v)", err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		marked := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(alb), marked); err != nil {
			return err
		}
		marked.Finalizers = nil
		return k8s.Update(f.ctx, marked)
	})
	if err != nil {
		t.Fatal(err)
	}
	f.waitGone("AdaptiveLoadBalancer", func() error {
		return k8s.Get(f.ctx, client.ObjectKeyFromObject(alb), &adlbv1.AdaptiveLoadBalancer{})
	})
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ServiceEntry appeared after the deletion (err %v)", err)
	}
}

// `kubectl delete adaptiveloadbalancer --cascade=orphan`: the garbage collector removes the owner
// reference from the ServiceEntry and keeps it. Nothing would update it again, so the operator
// deletes it (OrphanDeleted).
func TestDeletion_AnOrphanedServiceEntryIsDeleted(t *testing.T) {
	requireControllerManager(t)
	f := newFixture(t)
	alb := f.mirroredService("10.36.0.1")
	if err := k8s.Delete(f.ctx, alb, client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
		t.Fatal(err)
	}
	f.waitGone("ServiceEntry", func() error { _, err := f.serviceEntry("web"); return err })
	f.eventually("an OrphanDeleted event", func() error {
		var list corev1.EventList
		if err := k8s.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == EventOrphanDeleted && e.InvolvedObject.Name == "web" {
				return nil
			}
		}
		return errNotYet
	})
}

// Deleting the namespace: the namespace controller deletes the AdaptiveLoadBalancer, the
// ServiceEntry and the pods, and the namespace goes; the operator neither re-creates anything nor
// holds the deletion up.
func TestDeletion_DeletingTheNamespaceRemovesEverything(t *testing.T) {
	requireControllerManager(t)
	f := newFixture(t)
	f.mirroredService("10.37.0.1")
	if err := k8s.Delete(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}); err != nil {
		t.Fatal(err)
	}
	// The kubelet's part: once the namespace controller has deleted the pod, its containers
	// stop and the pod goes (here no kubelet runs, so the test removes it).
	f.eventually("the namespace controller deletes the pod", func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web-1"}, p); err != nil {
			return client.IgnoreNotFound(err)
		}
		if p.DeletionTimestamp.IsZero() {
			return errNotYet
		}
		return nil
	})
	f.forceDeletePod("web-1")
	deadline := time.Now().Add(2 * time.Minute) // the namespace controller's discovery and deletes, on a busy machine
	for {
		ns := &corev1.Namespace{}
		err := k8s.Get(f.ctx, types.NamespacedName{Name: f.ns}, ns)
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s still exists (err %v): %+v", f.ns, err, ns.Status.Conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// refuseServiceEntryDeletes makes the real API server refuse every DELETE of a ServiceEntry in the
// fixture's namespace (a policy, as an admin could add), so that neither the garbage collector nor
// the operator can remove one; it returns a function that lifts it.
func (f *fixture) refuseServiceEntryDeletes() (lift func()) {
	f.t.Helper()
	return f.admissionPolicy("refuse-se-deletes-"+f.ns, []admissionv1.OperationType{admissionv1.Delete}, func() error {
		se, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		err = k8s.Delete(f.ctx, se, client.DryRunAll)
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "test policy") {
			return nil
		}
		return fmt.Errorf("a dry-run delete returned %v", err)
	})
}

// An AdaptiveLoadBalancer deleted and re-created under the same name (kubectl replace --force,
// an uninstall and reinstall) finds the ServiceEntry of its previous incarnation when that one
// outlives it: here a policy keeps the garbage collector (and the operator's orphan check) from
// deleting it; elsewhere the collector can be slow or down. The new one takes it over (one write,
// no moment without weighted endpoints) instead of reporting ServiceEntryNotOwned for an object
// that only adaptive-lb wrote.
func TestDeletion_AnAdaptiveLoadBalancerRecreatedUnderTheSameNameTakesOverItsServiceEntry(t *testing.T) {
	requireControllerManager(t)
	f := newFixture(t)
	old := f.mirroredService("10.38.0.1")
	se, err := f.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}
	lift := f.refuseServiceEntryDeletes()
	defer lift()
	if err := k8s.Delete(f.ctx, old); err != nil {
		t.Fatal(err)
	}
	f.waitGone("old AdaptiveLoadBalancer", func() error {
		return k8s.Get(f.ctx, client.ObjectKeyFromObject(old), &adlbv1.AdaptiveLoadBalancer{})
	})
	f.pod("web", "web-2", "10.38.0.2")
	recreated := f.alb("web", "web")
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	now := f.waitForAddresses("web", "10.38.0.1", "10.38.0.2")
	if now.UID != se.UID {
		t.Errorf("the ServiceEntry was replaced (UID %s, was %s); with deletes refused it must have been taken over", now.UID, se.UID)
	}
	if ref := metav1.GetControllerOf(now); ref == nil || ref.UID != recreated.UID {
		t.Fatalf("ServiceEntry controlled by %+v, want the re-created AdaptiveLoadBalancer %s", ref, recreated.UID)
	}
	for _, e := range f.warningEvents(EventNotOwned) {
		t.Errorf("a ServiceEntryNotOwned warning for adaptive-lb's own ServiceEntry: %s", e)
	}
	// Deletes work again: the collector, seeing a live owner, keeps it.
	lift()
	f.barrier("canary")
	if got, err := f.serviceEntry("web"); err != nil || got.UID != se.UID {
		t.Fatalf("after the policy was lifted the ServiceEntry is %v (err %v)", got.UID, err)
	}
}
