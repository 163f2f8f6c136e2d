package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

func TestMirror_ServiceEntryMatchesTheServiceExactly(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.1.0.1")
	f.pod("web", "web-2", "10.1.0.2")
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"), ready("web-2", "10.1.0.2"))
	alb := f.alb("web", "web")

	se := f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	spec := &se.Spec
	if got := spec.Hosts; len(got) != 1 || got[0] != "web."+f.ns+".svc.cluster.local" {
		t.Fatalf("hosts %v", got)
	}
	svc := &corev1.Service{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	if got := spec.Addresses; len(got) != 1 || got[0] != svc.Spec.ClusterIP {
		t.Fatalf("addresses %v, want the Service's ClusterIP %s", got, svc.Spec.ClusterIP)
	}
	if spec.Location != apinetworkingv1.ServiceEntry_MESH_INTERNAL || spec.Resolution != apinetworkingv1.ServiceEntry_STATIC {
		t.Fatalf("location %v resolution %v", spec.Location, spec.Resolution)
	}
	if len(spec.Ports) != 2 || spec.Ports[0].Name != "http-web" || spec.Ports[0].Number != 80 || spec.Ports[0].Protocol != "HTTP" ||
		spec.Ports[1].Name != "grpc" || spec.Ports[1].Number != 9090 || spec.Ports[1].Protocol != "GRPC" || spec.Ports[1].TargetPort != 9091 {
		t.Fatalf("ports %v", spec.Ports)
	}
	for _, e := range spec.Endpoints {
		if e.Ports["http-web"] != 8080 || e.Ports["grpc"] != 9091 {
			t.Errorf("%s target ports %v, want http-web→8080 grpc→9091", e.Address, e.Ports)
		}
		if e.Labels["app"] != "web" || e.Labels["version"] != "v1" || e.Labels["security.istio.io/tlsMode"] != "istio" {
			t.Errorf("%s labels %v", e.Address, e.Labels)
		}
		if e.ServiceAccount != "web-sa" || e.Locality != "eu-west/eu-west-1a/" || e.Weight != 100 {
			t.Errorf("%s serviceAccount %q locality %q weight %d", e.Address, e.ServiceAccount, e.Locality, e.Weight)
		}
	}
	owner := metav1.GetControllerOf(se)
	if owner == nil || owner.UID != alb.UID || owner.Kind != "AdaptiveLoadBalancer" || !ptr.Deref(owner.BlockOwnerDeletion, false) {
		t.Fatalf("controller owner %+v: deleting the AdaptiveLoadBalancer must garbage-collect the ServiceEntry", owner)
	}
	if se.Labels[ManagedByLabel] != ManagedByValue {
		t.Fatalf("labels %v", se.Labels)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	f.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics)
	f.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonEqualWeights)
	f.eventually("status lists both endpoints", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(alb), a); err != nil {
			return err
		}
		if a.Status.EndpointCount != 2 || len(a.Status.Endpoints) != 2 || a.Status.Endpoints[0].Pod != "web-1" ||
			a.Status.Endpoints[0].Zone != "eu-west-1a" || a.Status.Endpoints[0].Weight != 100 || a.Status.ServiceEntry != "web" {
			return fmt.Errorf("status %+v", a.Status)
		}
		return nil
	})
}

func TestMirror_PodLeavesAtEachStepOfItsShutdown(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	for i := 1; i <= 3; i++ {
		f.pod("web", fmt.Sprintf("web-%d", i), fmt.Sprintf("10.2.0.%d", i))
	}
	all := []sliceEndpoint{ready("web-1", "10.2.0.1"), ready("web-2", "10.2.0.2"), ready("web-3", "10.2.0.3")}
	f.slice("web", "web-x", all...)
	f.alb("web", "web")
	f.waitForAddresses("web", "10.2.0.1", "10.2.0.2", "10.2.0.3")

	// web-1 fails its readiness probe.
	f.slice("web", "web-x", sliceEndpoint{pod: "web-1", ip: "10.2.0.1"}, all[1], all[2])
	f.waitForAddresses("web", "10.2.0.2", "10.2.0.3")
	// web-2 starts terminating while still serving its in-flight requests.
	f.slice("web", "web-x", sliceEndpoint{pod: "web-1", ip: "10.2.0.1"}, sliceEndpoint{pod: "web-2", ip: "10.2.0.2", serving: true, terminating: true}, all[2])
	f.waitForAddresses("web", "10.2.0.3")
	// web-1 comes back.
	f.slice("web", "web-x", all[0], sliceEndpoint{pod: "web-2", ip: "10.2.0.2", serving: true, terminating: true}, all[2])
	f.waitForAddresses("web", "10.2.0.1", "10.2.0.3")
	// web-3 is deleted: the pod event alone removes it, before its slice is updated.
	if err := k8s.Delete(f.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-3", Namespace: f.ns}}); err != nil {
		t.Fatal(err)
	}
	f.waitForAddresses("web", "10.2.0.1")
}

func TestMirror_ScaleFromZeroToFiftyAndBack(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.slice("web", "web-x")
	f.alb("web", "web")
	f.eventually("empty ServiceEntry", func() error {
		se, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		if len(se.Spec.Endpoints) != 0 {
			return fmt.Errorf("%d endpoints", len(se.Spec.Endpoints))
		}
		return nil
	})
	var eps []sliceEndpoint
	var ips []string
	for i := 0; i < 50; i++ {
		name, ip := fmt.Sprintf("web-%02d", i), fmt.Sprintf("10.3.%d.%d", i/200, i%200+1)
		f.pod("web", name, ip)
		eps = append(eps, ready(name, ip))
		ips = append(ips, ip)
	}
	// The endpointslice controller caps slices at 100 endpoints; split 30/20 to exercise two slices.
	f.slice("web", "web-x", eps[:30]...)
	f.slice("web", "web-y", eps[30:]...)
	f.waitForAddresses("web", ips...)
	f.slice("web", "web-x")
	f.slice("web", "web-y")
	f.waitForAddresses("web")
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

func TestMirror_WritesNothingWhenNothingChanged(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.4.0.1")
	f.slice("web", "web-x", ready("web-1", "10.4.0.1"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.4.0.1")
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	before := seWrites.Load()
	// Events that reach the reconciler but change nothing in the ServiceEntry: a Service
	// annotation, a re-written identical slice, an unrelated pod annotation.
	svc := &corev1.Service{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{"touched": "yes"}
	if err := k8s.Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	f.slice("web", "web-x", ready("web-1", "10.4.0.1"))
	// A real change in another Service proves the operator kept working meanwhile.
	f.service("other")
	f.pod("other", "other-1", "10.4.1.1")
	f.slice("other", "other-x", ready("other-1", "10.4.1.1"))
	f.alb("other", "other")
	f.waitForAddresses("other", "10.4.1.1")
	// Exactly one write happened since: the creation of "other"'s ServiceEntry.
	if got := seWrites.Load() - before; got != 1 {
		t.Fatalf("%d ServiceEntry writes, want 1 (only the new Service's create)", got)
	}
}

func TestMirror_RevertsAForeignEditAndKeepsWeights(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.5.0.1")
	f.pod("web", "web-2", "10.5.0.2")
	f.slice("web", "web-x", ready("web-1", "10.5.0.1"), ready("web-2", "10.5.0.2"))
	f.alb("web", "web")
	se := f.waitForAddresses("web", "10.5.0.1", "10.5.0.2")

	// Someone edits the owned ServiceEntry: drops an endpoint and changes a label.
	se.Spec.Endpoints = se.Spec.Endpoints[:1]
	se.Spec.Endpoints[0].Labels["app"] = "hacked"
	if err := k8s.Update(f.ctx, se); err != nil {
		t.Fatal(err)
	}
	f.eventually("the edit is reverted", func() error {
		got, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		if len(got.Spec.Endpoints) != 2 || got.Spec.Endpoints[0].Labels["app"] != "web" {
			return fmt.Errorf("endpoints %v", got.Spec.Endpoints)
		}
		return nil
	})

	// Weights the weight cycle writes survive a membership change, and a new pod gets the median
	// of the applied weights.
	f.writeWeightsAsTheCycle("web", map[string]int{"10.5.0.1": 300, "10.5.0.2": 50}, map[string]string{"10.5.0.1": "web-1", "10.5.0.2": "web-2"})
	f.pod("web", "web-3", "10.5.0.3")
	f.slice("web", "web-x", ready("web-1", "10.5.0.1"), ready("web-2", "10.5.0.2"), ready("web-3", "10.5.0.3"))
	se = f.waitForAddresses("web", "10.5.0.1", "10.5.0.2", "10.5.0.3")
	weightsOf := func(se *networkingv1.ServiceEntry) map[string]uint32 {
		out := map[string]uint32{}
		for _, e := range se.Spec.Endpoints {
			out[e.Address] = e.Weight
		}
		return out
	}
	if w := weightsOf(se); w["10.5.0.1"] != 300 || w["10.5.0.2"] != 50 || w["10.5.0.3"] != 300 {
		t.Fatalf("weights %v: want the applied 300 and 50 kept and the new pod at their median 300", w)
	}

	// A weight someone else edits is not the operator's: it is put back.
	for _, e := range se.Spec.Endpoints {
		if e.Address == "10.5.0.2" {
			e.Weight = 999
		}
	}
	if err := k8s.Update(f.ctx, se); err != nil {
		t.Fatal(err)
	}
	f.eventually("the foreign weight is reverted", func() error {
		got, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		if w := weightsOf(got); w["10.5.0.2"] != 50 {
			return fmt.Errorf("weights %v", w)
		}
		return nil
	})
}

func TestMirror_ConditionsInsteadOfCrashes(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")

	// The Service does not exist yet, then appears, then is deleted and re-created.
	f.alb("late", "late")
	c := f.waitForCondition("late", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonTargetNotFound)
	if !strings.Contains(c.Message, "Service "+f.ns+"/late not found") {
		t.Fatalf("message %q", c.Message)
	}
	// No ServiceEntry, so no weights: not "EqualWeights" (issue 15, "What the user sees").
	f.waitForCondition("late", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)
	f.service("late")
	f.pod("late", "late-1", "10.6.0.1")
	f.slice("late", "late-x", ready("late-1", "10.6.0.1"))
	f.waitForAddresses("late", "10.6.0.1")
	f.waitForCondition("late", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	f.waitForCondition("late", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonEqualWeights)
	if err := k8s.Delete(f.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: f.ns}}); err != nil {
		t.Fatal(err)
	}
	f.waitForCondition("late", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonTargetNotFound)
	f.waitForCondition("late", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)
	f.eventually("ServiceEntry of a deleted Service removed", func() error {
		if _, err := f.serviceEntry("late"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	f.service("late")
	f.waitForAddresses("late", "10.6.0.1")

	// Unsupported Services.
	for name, mutate := range map[string]func(*corev1.Service){
		"headless":    func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone },
		"no-selector": func(s *corev1.Service) { s.Spec.Selector = nil },
		"external": func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "example.com"
			s.Spec.Selector = nil
		},
	} {
		f.service(name, mutate)
		f.alb(name, name)
		f.waitForCondition(name, adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonUnsupported)
		f.waitForCondition(name, adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)
		if _, err := f.serviceEntry(name); !apierrors.IsNotFound(err) {
			t.Fatalf("%s: a ServiceEntry was created for an unsupported Service (err %v)", name, err)
		}
	}

	// Two AdaptiveLoadBalancers on one Service: the older wins, the newer reports Conflict.
	f.service("shared")
	f.alb("first", "shared")
	f.waitForCondition("first", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	f.alb("second", "shared")
	c = f.waitForCondition("second", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonConflict)
	if !strings.Contains(c.Message, "AdaptiveLoadBalancer first already targets Service shared") {
		t.Fatalf("message %q", c.Message)
	}
	f.waitForCondition("first", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	// A user's own ServiceEntry with the name adaptive-lb would use is never overwritten.
	f.service("mine")
	users := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: f.ns}}
	users.Spec.Hosts = []string{"mine.example.com"}
	users.Spec.Resolution = apinetworkingv1.ServiceEntry_DNS
	f.create(users)
	f.alb("mine", "mine")
	f.waitForCondition("mine", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonServiceEntryNotOwned)
	got, err := f.serviceEntry("mine")
	if err != nil || got.Spec.Hosts[0] != "mine.example.com" || metav1.GetControllerOf(got) != nil {
		t.Fatalf("the user's ServiceEntry was modified: %v (err %v)", got.Spec.Hosts, err)
	}

	// Selecting ports the Service does not have.
	f.service("ports")
	f.alb("ports", "ports", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Ports = []int32{443} })
	f.waitForCondition("ports", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonNoPorts)
	f.waitForCondition("ports", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)
}

func TestMirror_DeletingTheAdaptiveLoadBalancerLeavesItToGarbageCollection(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.7.0.1")
	f.slice("web", "web-x", ready("web-1", "10.7.0.1"))
	alb := f.alb("web", "web")
	se := f.waitForAddresses("web", "10.7.0.1")
	// envtest runs no garbage collector; what the collector needs is the controller reference
	// with blockOwnerDeletion, asserted here, and the operator must not recreate the ServiceEntry
	// once its owner is gone.
	if ref := metav1.GetControllerOf(se); ref == nil || ref.UID != alb.UID {
		t.Fatalf("owner %v", ref)
	}
	if err := k8s.Delete(f.ctx, alb); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(f.ctx, se); err != nil { // what the garbage collector would do
		t.Fatal(err)
	}
	f.slice("web", "web-x", ready("web-1", "10.7.0.1"), sliceEndpoint{pod: "web-2", ip: "10.7.0.2"})
	f.service("canary") // a later event the operator processes
	f.alb("canary", "canary")
	f.eventually("canary mirrored", func() error { _, err := f.serviceEntry("canary"); return err })
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("the ServiceEntry of a deleted AdaptiveLoadBalancer came back (err %v)", err)
	}
}

func TestMirror_DualStackSlices(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.8.0.1")
	f.slice("web", "web-v4", ready("web-1", "10.8.0.1"))
	v6 := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-v6", Namespace: f.ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http-web"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00::1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "web-1", Namespace: f.ns}}},
	}
	f.create(v6)
	f.alb("web", "web")
	se := f.waitForAddresses("web", "10.8.0.1", "fd00::1")
	for _, e := range se.Spec.Endpoints {
		if e.Address == "fd00::1" && (len(e.Ports) != 1 || e.Ports["http-web"] != 8080) {
			t.Fatalf("IPv6 endpoint ports %v: only the ports its slice carries", e.Ports)
		}
	}
}

// A pod replaced in a rolling restart lands on the same kind of machine as its predecessor more
// often than not: it starts at the weight of its peers on that instance type, not at the fleet's
// median, which would overload a slow machine for a whole window.
func TestMirror_NewPodStartsAtItsInstanceTypesWeight(t *testing.T) {
	f := newFixture(t)
	for name, instanceType := range map[string]string{"fast-" + f.ns: "m7i.xlarge", "slow-" + f.ns: "m4.xlarge", "plain-" + f.ns: ""} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/zone": "eu-west-1a"}}}
		if instanceType != "" {
			n.Labels[InstanceTypeLabel] = instanceType
		}
		f.create(n)
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) })
	}
	on := func(node string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.NodeName = node + "-" + f.ns }
	}
	f.service("web")
	f.pod("web", "web-1", "10.6.0.1", on("fast"))
	f.pod("web", "web-2", "10.6.0.2", on("slow"))
	f.pod("web", "web-3", "10.6.0.3", on("fast"))
	f.slice("web", "web-x", ready("web-1", "10.6.0.1"), ready("web-2", "10.6.0.2"), ready("web-3", "10.6.0.3"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.6.0.1", "10.6.0.2", "10.6.0.3")

	// As a weight cycle leaves it: the fast machines at 300, the slow one at 40.
	f.writeWeightsAsTheCycle("web", map[string]int{"10.6.0.1": 300, "10.6.0.2": 40, "10.6.0.3": 300},
		map[string]string{"10.6.0.1": "web-1", "10.6.0.2": "web-2", "10.6.0.3": "web-3"})
	// web-2 is replaced by web-4 on another slow machine; web-5 lands on a node without the label.
	f.pod("web", "web-4", "10.6.0.4", on("slow"))
	f.pod("web", "web-5", "10.6.0.5", on("plain"))
	f.slice("web", "web-x", ready("web-1", "10.6.0.1"), ready("web-2", "10.6.0.2"), ready("web-3", "10.6.0.3"),
		ready("web-4", "10.6.0.4"), ready("web-5", "10.6.0.5"))
	se := f.waitForAddresses("web", "10.6.0.1", "10.6.0.2", "10.6.0.3", "10.6.0.4", "10.6.0.5")
	got := map[string]uint32{}
	for _, e := range se.Spec.Endpoints {
		got[e.Address] = e.Weight
	}
	if got["10.6.0.4"] != 40 {
		t.Errorf("the new pod on a slow machine got %d, want its instance type's 40 (weights %v)", got["10.6.0.4"], got)
	}
	if got["10.6.0.5"] != 300 {
		t.Errorf("the new pod on an unlabelled node got %d, want the median of all weights, 300 (weights %v)", got["10.6.0.5"], got)
	}
}

// The cache holds only ServiceEntries labelled as adaptive-lb's. An edit that removes the label
// takes the ServiceEntry out of the cache; the mirror must still notice and restore it.
func TestMirror_RestoresItsLabelAfterAForeignEdit(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.7.0.1")
	f.slice("web", "web-x", ready("web-1", "10.7.0.1"))
	f.alb("web", "web")
	se := f.waitForAddresses("web", "10.7.0.1")
	delete(se.Labels, ManagedByLabel)
	se.Spec.Endpoints[0].Weight = 7
	if err := k8s.Update(f.ctx, se); err != nil {
		t.Fatal(err)
	}
	f.eventually("the label and the mirror are restored", func() error {
		got, err := f.serviceEntry("web")
		if err != nil {
			return err
		}
		if got.Labels[ManagedByLabel] != ManagedByValue {
			return fmt.Errorf("labels %v", got.Labels)
		}
		return nil
	})
	// Still mirrored afterwards: a new endpoint shows up.
	f.pod("web", "web-2", "10.7.0.2")
	f.slice("web", "web-x", ready("web-1", "10.7.0.1"), ready("web-2", "10.7.0.2"))
	f.waitForAddresses("web", "10.7.0.1", "10.7.0.2")
}

// A ServiceEntry that can no longer follow its Service (a port selection that matches nothing,
// a port that lost its name) would freeze the old endpoints; it is removed instead, and comes
// back when the spec or the Service is fixed.
func TestMirror_NoPortsOrAnUnnamedPortRemovesTheServiceEntry(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.7.0.1")
	f.slice("web", "web-x", ready("web-1", "10.7.0.1"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.7.0.1")
	gone := func(what string) {
		t.Helper()
		f.eventually(what, func() error {
			if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
				return fmt.Errorf("the ServiceEntry is still there (err %v)", err)
			}
			return nil
		})
	}

	setPorts := func(ports []int32) {
		t.Helper()
		// The operator writes the status meanwhile: a user's edit retries on a conflict too.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			a := &adlbv1.AdaptiveLoadBalancer{}
			if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, a); err != nil {
				return err
			}
			a.Spec.Ports = ports
			return k8s.Update(f.ctx, a)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setPorts([]int32{12345})
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonNoPorts)
	gone("a port selection that matches none of the Service's ports removes the ServiceEntry")
	setPorts(nil)
	f.waitForAddresses("web", "10.7.0.1")

	svc := &corev1.Service{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = svc.Spec.Ports[:1]
	svc.Spec.Ports[0].Name = ""
	if err := k8s.Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonUnsupported)
	gone("a Service port without a name removes the ServiceEntry")
}

// A Service that changes into a shape Build refuses (here: an exportTo annotation that shares no
// namespace with the AdaptiveLoadBalancer's spec.exportTo) loses its ServiceEntry: the copy
// written for the old shape would keep weighting a Service it no longer describes.
func TestMirror_AServiceThatBecomesUnsupportedLosesItsServiceEntry(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	svc := f.service("web")
	f.pod("web", "web-1", "10.8.0.1")
	f.slice("web", "web-x", ready("web-1", "10.8.0.1"))
	f.alb("web", "web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.ExportTo = []string{"other"} })
	f.waitForAddresses("web", "10.8.0.1")

	if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{"networking.istio.io/exportTo": "."}
	if err := k8s.Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	c := f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonUnsupported)
	if !strings.Contains(c.Message, "shares no namespace") {
		t.Fatalf("message %q does not say why", c.Message)
	}
	f.eventually("ServiceEntry of the now unsupported Service removed", func() error {
		if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
}

// An AdaptiveLoadBalancer that loses a Conflict while it owns the Service's ServiceEntry (both
// created in the same second, the tie going by name, or the newer one reconciled before the
// cache listed the older) must remove that ServiceEntry: nothing else updates it while the
// conflict lasts, so it would route to the endpoints of the moment it lost, and the winner
// would stay blocked on ServiceEntryNotOwned.
func TestMirror_TheLoserOfAConflictRemovesTheServiceEntryItOwns(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.alb("first", "shared")
	f.waitForCondition("first", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonTargetNotFound)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	loser := f.alb("second", "shared")
	f.waitForCondition("second", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonConflict)

	// The state the race leaves: the newer AdaptiveLoadBalancer controls the ServiceEntry.
	frozen := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: f.ns,
		Labels: map[string]string{ManagedByLabel: ManagedByValue, ServiceEntryOwnerLabel: loser.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer",
			Name: loser.Name, UID: loser.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}}}
	frozen.Spec.Hosts = []string{"shared." + f.ns + ".svc.cluster.local"}
	frozen.Spec.Location = apinetworkingv1.ServiceEntry_MESH_INTERNAL
	frozen.Spec.Resolution = apinetworkingv1.ServiceEntry_STATIC
	frozen.Spec.Ports = []*apinetworkingv1.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}
	frozen.Spec.Endpoints = []*apinetworkingv1.WorkloadEntry{{Address: "10.13.0.99", Weight: 7}} // a pod long gone
	f.create(frozen)

	f.service("shared")
	f.pod("shared", "shared-1", "10.13.0.1")
	f.slice("shared", "shared-x", ready("shared-1", "10.13.0.1"))
	se := f.waitForAddresses("shared", "10.13.0.1")
	first := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "first"}, first); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(se); ref == nil || ref.UID != first.UID {
		t.Fatalf("ServiceEntry controlled by %v, want the winner %s", ref, first.UID)
	}
	f.waitForCondition("first", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	f.waitForCondition("second", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonConflict)
}

// The mirror's membership record of a deleted AdaptiveLoadBalancer goes with it, also when no
// weight cycle runs (no TSDB) to prune it: otherwise it grows with every deleted object, and one
// re-created under the same name would start its endpoints at the old object's weights.
func TestMirror_DeletingTheAdaptiveLoadBalancerDropsItsMembershipRecord(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.14.0.1")
	f.slice("web", "web-x", ready("web-1", "10.14.0.1"))
	alb := f.alb("web", "web")
	f.waitForAddresses("web", "10.14.0.1")
	key := client.ObjectKeyFromObject(alb)
	f.eventually("membership records the endpoint", func() error {
		if !sharedMembership.listed(key, "10.14.0.1") {
			return errNotYet
		}
		return nil
	})
	if err := k8s.Delete(f.ctx, alb); err != nil {
		t.Fatal(err)
	}
	f.eventually("membership record dropped", func() error {
		sharedMembership.mu.Lock()
		defer sharedMembership.mu.Unlock()
		if _, ok := sharedMembership.byKey[key]; ok {
			return errNotYet
		}
		return nil
	})
}

// A Service annotated exportTo "~" is visible in no namespace: a ServiceEntry exported the same
// way would weight nothing while the status called it mirrored. It is Unsupported, and the
// ServiceEntry written before the annotation goes.
func TestMirror_AServiceExportedToNoNamespaceIsUnsupported(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	svc := f.service("web")
	f.pod("web", "web-1", "10.8.1.1")
	f.slice("web", "web-x", ready("web-1", "10.8.1.1"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.8.1.1")

	if err := k8s.Get(f.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{"networking.istio.io/exportTo": "~"}
	if err := k8s.Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonUnsupported)
	if !strings.Contains(c.Message, "exported to no namespace") {
		t.Fatalf("message %q does not say why", c.Message)
	}
	f.eventually("ServiceEntry of the Service exported nowhere removed", func() error {
		if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
}
