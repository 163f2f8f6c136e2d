package controller

import (
	"context"
	"fmt"
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
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

var nsCounter atomic.Int64

// fixture is one test's namespace on the shared API server.
type fixture struct {
	t   testing.TB
	ctx context.Context
	ns  string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	requireEnv(t)
	ns := fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(strings.NewReplacer("_", "-", "/", "-").Replace(t.Name())))
	if len(ns) > 60 {
		ns = ns[:60]
	}
	ns = strings.TrimRight(ns, "-")
	f := &fixture{t: t, ctx: context.Background(), ns: ns}
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	return f
}

func (f *fixture) create(o client.Object) {
	f.t.Helper()
	if err := k8s.Create(f.ctx, o); err != nil {
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
	if err := k8s.Create(f.ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
}

func (f *fixture) service(name string, opts ...func(*corev1.Service)) *corev1.Service {
	f.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
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

// pod creates a running, ready pod with an Istio sidecar on node-a (zone eu-west-1a), labelled
// and annotated as Istio's injector does.
func (f *fixture) pod(app, name, ip string, opts ...func(*corev1.Pod)) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns,
			Labels:      map[string]string{"app": app, "version": "v1", "security.istio.io/tlsMode": "istio"},
			Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
		Spec: corev1.PodSpec{
			NodeName:           "node-a",
			ServiceAccountName: app + "-sa",
			Containers:         []corev1.Container{{Name: "app", Image: "app"}, {Name: "istio-proxy", Image: "proxy"}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	f.create(p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &metav1.Time{Time: time.Now()},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := k8s.Status().Update(f.ctx, p); err != nil {
		f.t.Fatal(err)
	}
	return p
}

type sliceEndpoint struct {
	pod, ip                     string
	ready, serving, terminating bool
}

func ready(pod, ip string) sliceEndpoint {
	return sliceEndpoint{pod: pod, ip: ip, ready: true, serving: true}
}

// slice creates or replaces an EndpointSlice of a Service, as the endpointslice controller would.
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
	err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, existing)
	switch {
	case apierrors.IsNotFound(err):
		f.create(s)
	case err != nil:
		f.t.Fatal(err)
	default:
		existing.Endpoints = s.Endpoints
		if err := k8s.Update(f.ctx, existing); err != nil {
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
	err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, se)
	return se, err
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

// waitForAddresses waits until the ServiceEntry lists exactly want (sorted).
func (f *fixture) waitForAddresses(name string, want ...string) *networkingv1.ServiceEntry {
	f.t.Helper()
	sort.Strings(want)
	var se *networkingv1.ServiceEntry
	f.eventually(fmt.Sprintf("ServiceEntry %s lists %v", name, want), func() error {
		var err error
		se, err = f.serviceEntry(name)
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
		if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: alb}, a); err != nil {
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
	se, err := f.serviceEntry(alb)
	if err != nil {
		f.t.Fatal(err)
	}
	w := &WeightCycle{Client: operatorClient, Versions: sharedVersions, Metrics: testMetrics}
	d := &dueTarget{key: types.NamespacedName{Namespace: f.ns, Name: alb}, se: se, replannedAt: replannedAt(se), slicePod: podAt}
	var decision weights.Decision
	for ip, weight := range byIP {
		decision.Endpoints = append(decision.Endpoints, weights.Result{ID: ip, Weight: weight})
	}
	if err := w.writeWeights(f.ctx, d, decision, false); err != nil {
		f.t.Fatal(err)
	}
}
