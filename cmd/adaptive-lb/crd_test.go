package main

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// ownCRDName is the AdaptiveLoadBalancer CRD's name.
const ownCRDName = "adaptiveloadbalancers.adaptivelb.io"

// ownedServiceEntry creates a ServiceEntry as the operator writes one: labelled as adaptive-lb's,
// controlled by alb with blockOwnerDeletion.
func ownedServiceEntry(t testing.TB, admin client.Client, alb *adlbv1.AdaptiveLoadBalancer, name string) *networkingv1.ServiceEntry {
	t.Helper()
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: alb.Namespace,
		Labels: map[string]string{controller.ManagedByLabel: controller.ManagedByValue, controller.ServiceEntryOwnerLabel: alb.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer", Name: alb.Name, UID: alb.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}}}
	se.Spec.Hosts = []string{name + "." + alb.Namespace + ".svc.cluster.local"}
	if err := admin.Create(context.Background(), se); err != nil {
		t.Fatal(err)
	}
	return se
}

// deleteOwnCRD deletes the AdaptiveLoadBalancer CRD and waits until the API server has removed
// it (after deleting every AdaptiveLoadBalancer).
func deleteOwnCRD(t testing.TB, admin client.Client) {
	t.Helper()
	ctx := context.Background()
	crd := func() *metav1.PartialObjectMetadata {
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: ownCRDName}}
		m.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		return m
	}
	if err := admin.Delete(ctx, crd()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := admin.Get(ctx, types.NamespacedName{Name: ownCRDName}, crd())
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CRD is still there a minute after its deletion (err %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What the real garbage collector does with the ServiceEntries of AdaptiveLoadBalancers that go
// because their CRD is deleted, with no operator running (docs/operations.md records it): the
// API server deletes every AdaptiveLoadBalancer before it removes the CRD, and the collector, which
// watches them, deletes their dependents. It keeps its REST mapping of the kind until its next
// discovery sync (every 30 s), after the CRD is gone, so the owners' deletions are still resolved.
func TestGarbageCollector_DeletesTheServiceEntriesOfADeletedCRDsObjects(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	testtools.RunControllerManager(t, env)
	ctx := context.Background()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	newALB := func(name string) *adlbv1.AdaptiveLoadBalancer {
		alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
			Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: name}}}
		if err := admin.Create(ctx, alb); err != nil {
			t.Fatal(err)
		}
		return alb
	}
	gone := func(se *networkingv1.ServiceEntry) bool {
		err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return apierrors.IsNotFound(err)
	}
	waitGone := func(what string, se *networkingv1.ServiceEntry, within time.Duration) bool {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if gone(se) {
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return false
	}
	// First make sure the collector has a monitor for the kind: a probe's dependent goes.
	probe := newALB("probe")
	probeSE := ownedServiceEntry(t, admin, probe, "probe")
	if err := admin.Delete(ctx, probe); err != nil {
		t.Fatal(err)
	}
	if !waitGone("probe", probeSE, 90*time.Second) {
		t.Fatal("the garbage collector never deleted the dependent of a deleted AdaptiveLoadBalancer")
	}

	ses := []*networkingv1.ServiceEntry{ownedServiceEntry(t, admin, newALB("web"), "web"), ownedServiceEntry(t, admin, newALB("api"), "api")}
	deleteOwnCRD(t, admin)
	crdGone := time.Now()
	for _, se := range ses {
		if !waitGone(se.Name, se, time.Minute) {
			t.Fatalf("ServiceEntry %s outlived its owner's CRD by a minute: the garbage collector did not delete it", se.Name)
		}
	}
	t.Logf("the garbage collector deleted the dependents %v after the CRD was gone", time.Since(crdGone).Round(time.Millisecond))
}

// Without a garbage collector (it may be down, behind, or not yet know the kind), deleting the
// AdaptiveLoadBalancer CRD while the operator runs: the API server deletes every
// AdaptiveLoadBalancer first, and the operator, seeing each deletion, deletes the ServiceEntry it
// controlled, confirming on the API server that the owner is gone.
func TestRun_DeletingTheCRDDeletesTheServiceEntriesWithoutAGarbageCollector(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(2)
	c.createALB()
	stop, logs := c.start("A", true)
	defer stop()
	c.waitForEndpoints(2, logs)
	deleteOwnCRD(t, c.admin)
	c.waitFor("the operator deletes the ServiceEntry of the deleted AdaptiveLoadBalancer", c.serviceEntryGone, logs)
}

// An operator started while its CRD is missing waits for it; once it has stayed missing for
// goneAfter (the operator's is a minute) it deletes its installation's ServiceEntries, which no
// AdaptiveLoadBalancer can own any more (another installation's stay), and when the CRD comes
// back it carries on.
func TestWaitForOwnCRD_DeletesTheInstallationsServiceEntriesOnceItStaysMissing(t *testing.T) {
	admin, _, env := operatorEnv(t, nil)
	ctx := context.Background()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}}
	if err := admin.Create(ctx, alb); err != nil {
		t.Fatal(err)
	}
	install := controller.InstallID(operatorNamespace, "adaptive-lb.adaptivelb.io")
	mine := ownedServiceEntry(t, admin, alb, "web")
	theirs := ownedServiceEntry(t, admin, alb, "other-install")
	for _, se := range []*networkingv1.ServiceEntry{mine, theirs} {
		se.Labels[controller.InstallLabel] = install
		if se == theirs {
			se.Labels[controller.InstallLabel] = controller.InstallID("team-b", "adaptive-lb.adaptivelb.io")
		}
		if err := admin.Update(ctx, se); err != nil {
			t.Fatal(err)
		}
	}
	deleteOwnCRD(t, admin) // no garbage collector runs: both ServiceEntries stay

	httpClient, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(env.Config, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	sweep := func(ctx context.Context) (int, error) {
		return deleteInstallationServiceEntries(ctx, admin, install, nil, nil)
	}
	done := make(chan error, 1)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- waitForOwnCRD(waitCtx, mapper, logr.Discard(), 2*time.Second, sweep) }()

	gone := func(se *networkingv1.ServiceEntry) bool {
		err := admin.Get(ctx, client.ObjectKeyFromObject(se), &networkingv1.ServiceEntry{})
		return apierrors.IsNotFound(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !gone(mine) {
		if time.Now().After(deadline) {
			t.Fatal("this installation's ServiceEntry outlived its CRD's absence")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if gone(theirs) {
		t.Fatal("another installation's ServiceEntry was deleted")
	}
	applyDir(t, admin, ownCRDPath, nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("waitForOwnCRD: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("waitForOwnCRD did not return once the CRD was back")
	}
}
