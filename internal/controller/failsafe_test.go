package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// endpointWeightSeries counts the adaptivelb_endpoint_weight series of one AdaptiveLoadBalancer.
func endpointWeightSeries(t *testing.T, namespace, alb string) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 1024)
	go func() { testMetrics.EndpointWeights.Collect(ch); close(ch) }()
	n := 0
	for m := range ch {
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range out.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == namespace && labels["adaptiveloadbalancer"] == alb {
			n++
		}
	}
	return n
}

func TestCRD_TargetRefIsImmutable(t *testing.T) {
	f := newFixture(t)
	alb := f.alb("web", "web")
	err := k8s.Patch(f.ctx, alb, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"targetRef":{"name":"api"}}}`)))
	if err == nil || !strings.Contains(err.Error(), "targetRef is immutable: create a new AdaptiveLoadBalancer for the other Service and delete this one") {
		t.Fatalf("changing spec.targetRef: err %v; want the immutability message", err)
	}
}

// A ServiceEntry the AdaptiveLoadBalancer controls under another name than its target's (left
// from a targetRef change made before the field was immutable) is deleted, not left frozen.
func TestMirror_DeletesAServiceEntryLeftFromAnEarlierTarget(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.31.0.1")
	f.slice("web", "web-x", ready("web-1", "10.31.0.1"))
	alb := f.alb("web", "web")
	f.waitForAddresses("web", "10.31.0.1")

	stale := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: f.ns,
		Labels: map[string]string{ManagedByLabel: ManagedByValue, ServiceEntryOwnerLabel: alb.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer", Name: alb.Name, UID: alb.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}}}
	stale.Spec.Hosts = []string{"old." + f.ns + ".svc.cluster.local"}
	stale.Spec.Resolution = apinetworkingv1.ServiceEntry_STATIC
	stale.Spec.Endpoints = []*apinetworkingv1.WorkloadEntry{{Address: "10.31.9.9", Weight: 100}}
	f.create(stale)
	f.eventually("the stale ServiceEntry deleted", func() error {
		if _, err := f.serviceEntry("old"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	// The target's own ServiceEntry stays.
	f.waitForAddresses("web", "10.31.0.1")
}

// Deleting what blocks an AdaptiveLoadBalancer (a foreign ServiceEntry, or the winner of a
// Conflict and then its ServiceEntry) lets it take over, with no other event.
func TestMirror_ABlockedAdaptiveLoadBalancerRecovers(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")

	f.service("mine")
	f.pod("mine", "mine-1", "10.32.0.1")
	f.slice("mine", "mine-x", ready("mine-1", "10.32.0.1"))
	users := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: f.ns}}
	users.Spec.Hosts = []string{"mine.example.com"}
	users.Spec.Resolution = apinetworkingv1.ServiceEntry_DNS
	f.create(users)
	f.alb("mine", "mine")
	f.waitForCondition("mine", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonServiceEntryNotOwned)
	if err := k8s.Delete(f.ctx, users); err != nil {
		t.Fatal(err)
	}
	f.waitForAddresses("mine", "10.32.0.1")
	f.waitForCondition("mine", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	f.service("shared")
	f.pod("shared", "shared-1", "10.32.1.1")
	f.slice("shared", "shared-x", ready("shared-1", "10.32.1.1"))
	first := f.alb("first", "shared")
	f.waitForCondition("first", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	se := f.waitForAddresses("shared", "10.32.1.1")
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	f.alb("second", "shared")
	f.waitForCondition("second", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonConflict)
	// The winner goes: the loser is no longer in Conflict. The winner's ServiceEntry goes with it
	// (the garbage collector and the operator's owner check delete it; until then the loser
	// reports it is not its own), and that deletion hands the Service over.
	if err := k8s.Delete(f.ctx, first); err != nil {
		t.Fatal(err)
	}
	f.eventually("the winner's ServiceEntry is deleted", func() error {
		now, err := f.serviceEntry("shared")
		if err == nil && now.UID == se.UID {
			return errNotYet
		}
		return client.IgnoreNotFound(err)
	})
	f.waitForCondition("second", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	got := f.waitForAddresses("shared", "10.32.1.1")
	if ref := metav1.GetControllerOf(got); ref == nil || ref.Name != "second" {
		t.Fatalf("ServiceEntry controller %v; want second", ref)
	}
}

// ordinaryLabels are the labels of a pod of a typical Helm-installed Deployment in the mesh, as
// in the istio package's sizing test.
func ordinaryLabels(app string) map[string]string {
	return map[string]string{
		"app": app, "version": "v1", "pod-template-hash": "7d9f8b6c4d",
		"app.kubernetes.io/name": app, "app.kubernetes.io/instance": app + "-prod", "app.kubernetes.io/version": "1.24.3",
		"app.kubernetes.io/component": "backend", "app.kubernetes.io/part-of": "shop",
		"service.istio.io/canonical-name": app, "service.istio.io/canonical-revision": "v1",
		istio.TLSModeLabel: istio.TLSModeIstio,
	}
}

func sizedServiceEntry(ns, name string, n int) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{ManagedByLabel: ManagedByValue, ServiceEntryOwnerLabel: name}}}
	se.Spec.Hosts = []string{name + "." + ns + ".svc.cluster.local"}
	se.Spec.Location = apinetworkingv1.ServiceEntry_MESH_INTERNAL
	se.Spec.Resolution = apinetworkingv1.ServiceEntry_STATIC
	se.Spec.Ports = []*apinetworkingv1.ServicePort{{Number: 80, Name: "http-web", Protocol: "HTTP"}, {Number: 9090, Name: "grpc", Protocol: "GRPC"}}
	for i := range n {
		se.Spec.Endpoints = append(se.Spec.Endpoints, &apinetworkingv1.WorkloadEntry{
			Address: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256), Ports: map[string]uint32{"http-web": 8080, "grpc": 9091},
			Labels: ordinaryLabels("checkout"), ServiceAccount: "checkout", Locality: fmt.Sprintf("eu-west-1/eu-west-1%c", 'a'+i%3), Weight: 1000})
	}
	return se
}

// The endpoint limit is real: the API server stores a ServiceEntry at istio.MaxSingleServiceEntryEndpoints
// endpoints with ordinary labels, and etcd refuses one a little above 3,000.
func TestServiceEntrySize_EtcdRefusesAboveTheLimit(t *testing.T) {
	f := newFixture(t)
	at := sizedServiceEntry(f.ns, "at-limit", istio.MaxSingleServiceEntryEndpoints)
	if err := k8s.Create(f.ctx, at); err != nil {
		t.Fatalf("%d endpoints with ordinary labels: %v", istio.MaxSingleServiceEntryEndpoints, err)
	}
	raw, err := json.Marshal(at)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d endpoints: %d bytes stored, %d bytes per endpoint", istio.MaxSingleServiceEntryEndpoints, len(raw), len(raw)/istio.MaxSingleServiceEntryEndpoints)
	if len(raw) > istio.MaxEncodedBytes {
		t.Fatalf("at the endpoint limit the ServiceEntry is %d bytes, above MaxEncodedBytes %d", len(raw), istio.MaxEncodedBytes)
	}
	above := sizedServiceEntry(f.ns, "above", 3200)
	err = k8s.Create(f.ctx, above)
	if err == nil {
		t.Fatal("etcd stored a ServiceEntry of 3,200 endpoints with ordinary labels: the limit is not where docs/operations.md says")
	}
	t.Logf("3,200 endpoints: %v", err)
}

func TestWeightCycle_ForgetsDeletedAdaptiveLoadBalancers(t *testing.T) {
	kept, gone, going := types.NamespacedName{Namespace: "a", Name: "kept"}, types.NamespacedName{Namespace: "a", Name: "gone"}, types.NamespacedName{Namespace: "a", Name: "going"}
	w := &WeightCycle{states: map[types.NamespacedName]cycle.State{}, lastRun: map[types.NamespacedName]time.Time{},
		known: map[types.NamespacedName]map[string]bool{}, rateHistory: map[types.NamespacedName][]rateObservation{}}
	for _, k := range []types.NamespacedName{kept, gone, going} {
		w.states[k], w.lastRun[k], w.known[k] = cycle.State{}, time.Now(), map[string]bool{"10.0.0.1": true}
		w.statusThrottle.wrote(k, time.Now())
		w.rateHistory[k] = []rateObservation{{at: time.Now(), rate: 100}}
	}
	now := metav1.Now()
	w.forgetGone([]adlbv1.AdaptiveLoadBalancer{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "kept"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "going", DeletionTimestamp: &now}},
	})
	for name, m := range map[string]int{"states": len(w.states), "lastRun": len(w.lastRun), "statusThrottle": len(w.statusThrottle.last), "known": len(w.known), "rateHistory": len(w.rateHistory)} {
		if m != 1 {
			t.Errorf("%s holds %d entries, want only the live one", name, m)
		}
	}
	if _, ok := w.states[kept]; !ok {
		t.Error("the live AdaptiveLoadBalancer's state was dropped")
	}
}

// The weight cycle reads an endpoint's metrics as its pod's: the pod the EndpointSlice names, never
// a host-network pod on the same IP nor a pod that held the IP before.
func TestWeightCycle_FindsThePodTheSliceNamesForAnIP(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.35.0.1")
	f.pod("web", "web-2", "10.35.0.2")
	// A host-network pod on a node whose IP equals web-1's (a flat network), and an older pod
	// that held web-2's IP and is not in the slice.
	f.pod("agent", "agent-1", "10.35.0.1", func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	f.pod("web", "web-old", "10.35.0.2", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "batch"} })
	f.slice("web", "web-x", ready("web-1", "10.35.0.1"), ready("web-2", "10.35.0.2"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.35.0.1", "10.35.0.2")
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	w := &WeightCycle{Client: operatorClient, Tick: 5 * time.Second}
	key := types.NamespacedName{Namespace: f.ns, Name: "web"}
	f.eventually("pods found by the cycle", func() error {
		g, err := w.dueTargets(f.ctx, time.Now())
		if err != nil {
			return err
		}
		for _, d := range g.due {
			if d.key != key {
				continue
			}
			for ip, want := range map[string]string{"10.35.0.1": "web-1", "10.35.0.2": "web-2"} {
				if p := d.pods[ip]; p == nil || p.Name != want {
					return fmt.Errorf("pod of %s is %v, want %s", ip, p, want)
				}
			}
			return nil
		}
		return fmt.Errorf("not due")
	})
	// Without a slice naming the pod, an IP two pods claim gives no pod, not a guess.
	pod, err := w.podOf(f.ctx, f.ns, "10.35.0.2", "")
	if err != nil || pod != nil {
		t.Fatalf("ambiguous IP: pod %v err %v; want none", pod, err)
	}
	pod, err = w.podOf(f.ctx, f.ns, "10.35.0.1", "")
	if err != nil || pod == nil || pod.Name != "web-1" {
		t.Fatalf("IP shared with a host-network pod: pod %v err %v; want web-1", pod, err)
	}
}

// Per-Service PromQL runs with the operator's TSDB credentials: without the admin's
// --allow-query-overrides it is ignored (the default queries run) and the condition says so.
func TestWeightCycle_QueryOverridesNeedTheAdminsConsent(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Metrics = &adlbv1.MetricsSpec{Queries: &adlbv1.QueryOverrides{LatencyP99: `histogram_quantile(0.99, sum by (le) (`}}
	})
	lf.load(skewedCores, equalRPS)
	lf.loop.AllowQueryOverrides = false
	lf.run()
	c := lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonQueryOverridesIgnored)
	if !strings.Contains(c.Message, "spec.metrics.queries ignored: the operator runs without --allow-query-overrides") {
		t.Fatalf("message %q", c.Message)
	}
	// Allowed, the same override runs (and, being broken, fails).
	lf.loop.AllowQueryOverrides = true
	lf.clock.Step(loopInterval)
	lf.load(skewedCores, equalRPS)
	lf.run()
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonQueryFailed)
}
