package controller

import (
	"context"
	"strings"
	"testing"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// laggingCache reads like an informer cache that has not yet seen any AdaptiveLoadBalancer:
// one created a moment ago, whose ServiceEntry the orphan check sees first.
type laggingCache struct{ client.Client }

func (l laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*adlbv1.AdaptiveLoadBalancer); ok {
		return apierrors.NewNotFound(adlbv1.GroupVersion.WithResource("adaptiveloadbalancers").GroupResource(), key.Name)
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// The orphan check never takes the cache's word that an owner is missing: a ServiceEntry whose
// AdaptiveLoadBalancer the cache has not seen yet, but the API server has, is kept. Only an
// owner missing on the API server, or there another object (another UID), makes it an orphan.
func TestOrphanCheck_AnOwnerTheCacheHasNotSeenYetIsConfirmedOnTheAPIServer(t *testing.T) {
	f := newFixture(t)
	alb := f.alb("web", "web")
	o := &orphanReconciler{&AdaptiveLoadBalancerReconciler{Client: laggingCache{k8s}, apiReader: k8s}}
	controlledBy := func(name string, uid types.UID) *networkingv1.ServiceEntry {
		se := sizedServiceEntry(f.ns, "web", 1)
		se.OwnerReferences = []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer",
			Name: name, UID: uid, Controller: ptr.To(true)}}
		return se
	}
	for _, c := range []struct {
		name    string
		se      *networkingv1.ServiceEntry
		wantWhy string // "" : kept
	}{
		{"owner live on the API server", controlledBy(alb.Name, alb.UID), ""},
		{"owner re-created as another object", controlledBy(alb.Name, "5b7a3c9e-0000-4000-8000-00000000000a"), "another object"},
		{"owner missing on the API server", controlledBy("gone", "5b7a3c9e-0000-4000-8000-00000000000b"), "does not exist"},
	} {
		why, err := o.orphaned(f.ctx, c.se)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.wantWhy == "" && why != "" {
			t.Errorf("%s: taken for an orphan (%s) on the cache's word", c.name, why)
		}
		if c.wantWhy != "" && !strings.Contains(why, c.wantWhy) {
			t.Errorf("%s: why = %q, want it to say %q", c.name, why, c.wantWhy)
		}
	}
}

// laggingServiceEntries reads like an informer cache that has not yet seen a ServiceEntry the
// operator created a moment ago.
type laggingServiceEntries struct{ client.Client }

func (l laggingServiceEntries) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*networkingv1.ServiceEntry); ok {
		return apierrors.NewNotFound(networkingv1.Resource("serviceentries"), key.Name)
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

func (l laggingServiceEntries) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*networkingv1.ServiceEntryList); ok {
		return nil // it has seen none of them
	}
	return l.Client.List(ctx, list, opts...)
}

// Issue 21.9: a ServiceEntry the mirror created moments before its Service became unsupported
// (an exportTo "~" landing right after) is deleted although the cache has not seen it yet: its own
// create event, the operator's write, triggers no other reconcile, so it would stay until an
// unrelated event.
func TestMirror_DeletesAServiceEntryItCreatedBeforeTheCacheSawIt(t *testing.T) {
	f := newFixture(t)
	// An owner the running operator does not serve (it is not in the API server), and a
	// ServiceEntry without the managed-by label (the orphan check leaves it): only the
	// reconciler below acts on them.
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "web", UID: "5b7a3c9e-0000-4000-8000-0000000000c1"},
		Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}}
	se := sizedServiceEntry(f.ns, "web", 1)
	se.OwnerReferences = []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer", Name: alb.Name, UID: alb.UID, Controller: ptr.To(true)}}
	f.create(se)
	versions := &ServiceEntryVersions{}
	versions.remember(se) // the operator's own create
	r := &AdaptiveLoadBalancerReconciler{Client: laggingServiceEntries{k8s}, apiReader: k8s, Versions: versions, Recorder: record.NewFakeRecorder(10), Metrics: testMetrics}
	if err := r.deleteOwnedServiceEntry(f.ctx, alb, adlbv1.ReasonUnsupported); err != nil {
		t.Fatal(err)
	}
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry the cache has not seen yet survives its Service becoming unsupported (get: %v)", err)
	}
}
