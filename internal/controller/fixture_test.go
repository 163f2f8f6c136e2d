package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

var nsCounter atomic.Int64

// fixture is one test's namespace on the shared API server (or, with newFixtureOn, on another).
type fixture struct {
	t   testing.TB
	ctx context.Context
	ns  string
	c   client.Client // an admin's direct client: what a user's kubectl sees
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	requireEnv(t)
	return newFixtureOn(t, k8s)
}

// newFixtureOn is newFixture on the API server c reaches.
func newFixtureOn(t testing.TB, c client.Client) *fixture {
	t.Helper()
	ns := fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(strings.NewReplacer("_", "-", "/", "-").Replace(t.Name())))
	if len(ns) > 60 {
		ns = ns[:60]
	}
	ns = strings.TrimRight(ns, "-")
	f := &fixture{t: t, ctx: context.Background(), ns: ns, c: c}
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	return f
}

func (f *fixture) create(o client.Object) {
	f.t.Helper()
	if err := f.c.Create(f.ctx, o); err != nil {
		f.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// eventually polls cond until it returns nil or the timeout passes. Waiting is not timing: the
// generous timeout only bounds a hung test.
func (f *fixture) eventually(what string, cond func() error) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	f.t.Fatalf("%s: still not true after 30s: %v", what, err)
}

func (f *fixture) node(name, region, zone string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"topology.kubernetes.io/region": region, "topology.kubernetes.io/zone": zone}}}
	if err := f.c.Create(f.ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
}

// slicesLabel is in the selector of a Service whose EndpointSlices a test writes by hand, and on
// no pod: the real EndpointSlice controller (kube-controller-manager runs beside the suite's API
// server) then writes only an empty placeholder slice for it, which adds nothing to a
// ServiceEntry, instead of slices of its own beside the test's.
const slicesLabel = "adaptivelb.io/test-slices"

// service creates a Service selecting the pods labelled app=name. By default its EndpointSlices
// are the test's to write (f.slice): the weight-cycle, status and log tests set up endpoints that
// way. Tests of membership itself use slicesByController, and hand-written slices only for a
// shape the controller would not produce (each says which).
func (f *fixture) service(name string, opts ...func(*corev1.Service)) *corev1.Service {
	f.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name, slicesLabel: "hand-written"},
			Ports: []corev1.ServicePort{
				{Name: "http-web", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9091), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	for _, o := range opts {
		o(s)
	}
	f.create(s)
	return s
}

// slicesByController makes the real EndpointSlice controller write the Service's slices from its
// pods (f.pod makes them ready; f.setPodReady, f.deletePod change them). The test must call
// requireControllerManager.
func slicesByController(s *corev1.Service) {
	delete(s.Spec.Selector, slicesLabel)
}

// pod creates a running, ready pod with an Istio sidecar on node-a (zone eu-west-1a), labelled
// and annotated as Istio's injector does. Its app container names port 8080 "http", the fixture
// Service's target port.
func (f *fixture) pod(app, name, ip string, opts ...func(*corev1.Pod)) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns,
			Labels:      map[string]string{"app": app, "version": "v1", "security.istio.io/tlsMode": "istio"},
			Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
		Spec: corev1.PodSpec{
			NodeName:           "node-a",
			ServiceAccountName: app + "-sa",
			Containers: []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}},
				{Name: "istio-proxy", Image: "proxy"}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	f.create(p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &metav1.Time{Time: time.Now()},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := f.c.Status().Update(f.ctx, p); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// setPodReady sets a pod's Ready condition, as its kubelet would when its readiness probe
// starts or stops passing.
func (f *fixture) setPodReady(name string, ready bool) {
	f.t.Helper()
	if err := testtools.SetPodReady(f.ctx, f.c, types.NamespacedName{Namespace: f.ns, Name: name}, ready); err != nil {
		f.t.Fatal(err)
	}
}

// deletePod deletes a pod gracefully: it is bound to a node and no kubelet confirms its end, so it
// stays terminating (its endpoint serving, if still ready, and terminating) until
// forceDeletePod, as a pod does during its grace period.
func (f *fixture) deletePod(name string) {
	f.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}
	if err := f.c.Delete(f.ctx, p); err != nil {
		f.t.Fatal(err)
	}
}

// forceDeletePod removes a pod at once, as its kubelet does when the containers have stopped.
func (f *fixture) forceDeletePod(name string) {
	f.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}
	if err := f.c.Delete(f.ctx, p, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		f.t.Fatal(err)
	}
}

type sliceEndpoint struct {
	pod, ip                     string
	ready, serving, terminating bool
}

func ready(pod, ip string) sliceEndpoint {
	return sliceEndpoint{pod: pod, ip: ip, ready: true, serving: true}
}

// slice creates or replaces a hand-written EndpointSlice of a Service created without
// slicesByController.
func (f *fixture) slice(service, name string, eps ...sliceEndpoint) {
	f.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http-web"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("grpc"), Port: ptr.To[int32](9091), Protocol: ptr.To(corev1.ProtocolTCP)},
		},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready), Serving: ptr.To(e.serving), Terminating: ptr.To(e.terminating)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: e.pod, Namespace: f.ns},
			NodeName:   ptr.To("node-a"),
			Zone:       ptr.To("eu-west-1a"),
		})
	}
	existing := &discoveryv1.EndpointSlice{}
	err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, existing)
	switch {
	case apierrors.IsNotFound(err):
		f.create(s)
	case err != nil:
		f.t.Fatal(err)
	default:
		existing.Endpoints = s.Endpoints
		if err := f.c.Update(f.ctx, existing); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fixture) alb(name, service string, opts ...func(*adlbv1.AdaptiveLoadBalancer)) *adlbv1.AdaptiveLoadBalancer {
	f.t.Helper()
	a := &adlbv1.AdaptiveLoadBalancer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec:       adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: service}},
	}
	for _, o := range opts {
		o(a)
	}
	f.create(a)
	return a
}

func (f *fixture) serviceEntry(name string) (*networkingv1.ServiceEntry, error) {
	se := &networkingv1.ServiceEntry{}
	err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, se)
	return se, err
}

// serviceEntrySlices returns the ServiceEntry slices of the Service whose first slice is name,
// in number order, the first one included if it exists.
func (f *fixture) serviceEntrySlices(name string) []*networkingv1.ServiceEntry {
	f.t.Helper()
	var list networkingv1.ServiceEntryList
	if err := f.c.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatal(err)
	}
	var out []*networkingv1.ServiceEntry
	for _, se := range list.Items {
		if _, ok := istio.SliceIndex(name, se.Name); ok {
			out = append(out, se)
		}
	}
	slices.SortFunc(out, func(a, b *networkingv1.ServiceEntry) int {
		i, _ := istio.SliceIndex(name, a.Name)
		j, _ := istio.SliceIndex(name, b.Name)
		return i - j
	})
	return out
}

// serviceEntryUnion is the union of the Service's ServiceEntry slices as one object (the weight
// cycle's view), NotFound when there is none.
func (f *fixture) serviceEntryUnion(name string) (*networkingv1.ServiceEntry, error) {
	list := f.serviceEntrySlices(name)
	if len(list) == 0 || list[0].Name != name {
		return f.serviceEntry(name)
	}
	if len(list) == 1 {
		return list[0], nil
	}
	view := unionView(list).DeepCopy()
	view.Labels, view.OwnerReferences, view.UID = list[0].Labels, list[0].OwnerReferences, list[0].UID
	return view, nil
}

// addresses returns the ServiceEntry's endpoint addresses, sorted.
func addresses(se *networkingv1.ServiceEntry) []string {
	var out []string
	for _, e := range se.Spec.Endpoints {
		out = append(out, e.Address)
	}
	sort.Strings(out)
	return out
}

// waitForAddresses waits until the ServiceEntry's slices list exactly want (sorted); it returns
// their union.
func (f *fixture) waitForAddresses(name string, want ...string) *networkingv1.ServiceEntry {
	f.t.Helper()
	sort.Strings(want)
	var se *networkingv1.ServiceEntry
	f.eventually(fmt.Sprintf("ServiceEntry %s lists %v", name, want), func() error {
		var err error
		se, err = f.serviceEntryUnion(name)
		if err != nil {
			return err
		}
		if got := strings.Join(addresses(se), ","); got != strings.Join(want, ",") {
			return fmt.Errorf("addresses %s", got)
		}
		return nil
	})
	return se
}

// waitForCondition waits until the AdaptiveLoadBalancer's condition has the status and reason.
func (f *fixture) waitForCondition(alb, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	f.t.Helper()
	var c *metav1.Condition
	f.eventually(fmt.Sprintf("%s condition %s=%s/%s", alb, condType, status, reason), func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: alb}, a); err != nil {
			return err
		}
		c = meta.FindStatusCondition(a.Status.Conditions, condType)
		if c == nil {
			return fmt.Errorf("no %s condition yet", condType)
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s=%s/%s: %s", condType, c.Status, c.Reason, c.Message)
		}
		if c.ObservedGeneration != a.Generation {
			return fmt.Errorf("condition observed generation %d, object generation %d", c.ObservedGeneration, a.Generation)
		}
		return nil
	})
	return c
}

var errNotYet = fmt.Errorf("not yet")

// writeWeightsAsTheCycle writes weights (by address) into the ServiceEntry of AdaptiveLoadBalancer
// alb as the weight cycle does: through its write, which records them as the operator's.
// podAt names the pod at each address, as the Service's EndpointSlices do.
func (f *fixture) writeWeightsAsTheCycle(alb string, byIP map[string]int, podAt map[string]string) {
	f.t.Helper()
	if err := f.tryWriteWeightsAsTheCycle(alb, byIP, podAt); err != nil {
		f.t.Fatal(err)
	}
}

// tryWriteWeightsAsTheCycle is writeWeightsAsTheCycle returning the write's error.
func (f *fixture) tryWriteWeightsAsTheCycle(alb string, byIP map[string]int, podAt map[string]string) error {
	f.t.Helper()
	list := f.serviceEntrySlices(alb)
	if len(list) == 0 {
		f.t.Fatalf("no ServiceEntry %s", alb)
	}
	se := unionView(list)
	w := &WeightCycle{Client: operatorClient, Versions: sharedVersions, Metrics: testMetrics}
	d := &dueTarget{key: types.NamespacedName{Namespace: f.ns, Name: alb}, se: se, slices: list, replannedAt: replannedAt(se), slicePod: podAt}
	var decision weights.Decision
	for ip, weight := range byIP {
		decision.Endpoints = append(decision.Endpoints, weights.Result{ID: ip, Weight: weight})
	}
	_, err := w.writeWeights(f.ctx, d, decision, false)
	return err
}

// controllerSlices lists the EndpointSlices the EndpointSlice controller wrote for a Service.
func (f *fixture) controllerSlices(service string) []discoveryv1.EndpointSlice {
	f.t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := f.c.List(f.ctx, &list, client.InNamespace(f.ns), client.MatchingLabels{
		discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}); err != nil {
		f.t.Fatal(err)
	}
	return list.Items
}

// slicePods lists, sorted, the pods the controller's slices of a Service name.
func (f *fixture) slicePods(service string) []string {
	f.t.Helper()
	var pods []string
	for _, s := range f.controllerSlices(service) {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil {
				pods = append(pods, e.TargetRef.Name)
			}
		}
	}
	sort.Strings(pods)
	return pods
}

type endpointState struct{ ready, serving, terminating bool }

// waitForSliceEndpoint waits until the controller's slices show pod's endpoint in state.
func (f *fixture) waitForSliceEndpoint(service, pod string, want endpointState) {
	f.t.Helper()
	f.eventually(fmt.Sprintf("the EndpointSlice controller reports %s as %+v", pod, want), func() error {
		for _, s := range f.controllerSlices(service) {
			for _, e := range s.Endpoints {
				if e.TargetRef == nil || e.TargetRef.Name != pod {
					continue
				}
				got := endpointState{ptr.Deref(e.Conditions.Ready, false), ptr.Deref(e.Conditions.Serving, false), ptr.Deref(e.Conditions.Terminating, false)}
				if got != want {
					return fmt.Errorf("%+v", got)
				}
				return nil
			}
		}
		return fmt.Errorf("not in any slice")
	})
}
