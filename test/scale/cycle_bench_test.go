// Package scale holds benchmarks of the operator's per-cycle work at the largest supported size,
// in memory: no API server and no TSDB, so that what is measured is the operator's own CPU and
// memory. The API-facing costs are measured against real components elsewhere (docs/scaling.md).
package scale

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

const (
	services       = 10_000
	podsPerService = 20
	nodes          = 10_000
	writeBudget    = 50
)

// service is one opted-in Service as the operator's caches hold it.
type service struct {
	input   istio.Input
	current *apinetworkingv1.ServiceEntry // the applied ServiceEntry spec
	weights map[string]uint32             // applied weights by pod
	ipToPod map[string]string
	// observed are this cycle's per-pod signals (what the metrics source returned).
	observed []weights.Endpoint
}

// fleet builds n Services of 20 pods on 10,000 nodes in 3 zones, with realistic labels, two
// hardware speeds, and ServiceEntries already written with earlier, near-equal weights.
func fleet(tb testing.TB, n int) []*service {
	tb.Helper()
	r := rand.New(rand.NewSource(1))
	nodeObjs := make(map[string]*corev1.Node, nodes)
	for n := range nodes {
		name := fmt.Sprintf("node-%05d", n)
		nodeObjs[name] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			istio.RegionLabel: "eu-west-1", istio.ZoneLabel: fmt.Sprintf("eu-west-1%c", 'a'+n%3),
		}}}
	}
	out := make([]*service, n)
	for s := range n {
		ns, name := fmt.Sprintf("team-%04d", s/10), fmt.Sprintf("svc-%05d", s)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, ClusterIP: fmt.Sprintf("10.96.%d.%d", s/250, s%250+1), Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP},
			}},
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-abcde"},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("grpc"), Port: ptr.To[int32](9090)}},
		}
		pods := make(map[string]*corev1.Pod, podsPerService)
		svcObj := &service{weights: map[string]uint32{}, ipToPod: map[string]string{}}
		for p := range podsPerService {
			podName := fmt.Sprintf("%s-7d9f8b6c4d-%05d", name, p)
			ip := fmt.Sprintf("10.%d.%d.%d", s/250, s%250, p+1)
			node := fmt.Sprintf("node-%05d", r.Intn(nodes))
			pods[podName] = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podName,
					Labels:      map[string]string{"app": name, "version": "v1", "pod-template-hash": "7d9f8b6c4d"},
					Annotations: map[string]string{istio.SidecarStatusAnnotation: `{"containers":["istio-proxy"]}`}},
				Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: name},
			}
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{ip},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: podName},
				NodeName:   ptr.To(node),
			})
			// Two hardware speeds; a cost per request of 10 ms on the fast ones.
			cost := 0.010
			if p%4 == 0 {
				cost = 0.022
			}
			rps := 20 + 10*r.Float64()
			svcObj.observed = append(svcObj.observed, weights.Endpoint{
				ID: ip, CPUCores: rps * cost, CPULimitCores: 1, RequestRate: rps,
				LatencyP99Seconds: 4 * cost, HasMetrics: true,
			})
			svcObj.weights[podName] = uint32(100 + r.Intn(10))
			svcObj.ipToPod[ip] = podName
		}
		svcObj.input = istio.Input{
			Service: svc, Slices: []*discoveryv1.EndpointSlice{slice}, Pods: pods, Nodes: nodeObjs,
			DefaultWeight: 100, ClusterDomain: "cluster.local",
		}
		in := svcObj.input
		in.Weights = svcObj.weights
		spec, _, err := istio.Build(in)
		if err != nil {
			tb.Fatal(err)
		}
		svcObj.current = spec
		out[s] = svcObj
	}
	return out
}

// plan runs the engine, the dead band, the hold/fallback policy and the write budget for every
// Service, as the operator's weight cycle does (the engine's endpoint IDs are pod IPs).
func plan(tb testing.TB, fleet []*service, now time.Time, algorithm weights.Algorithm) []cycle.Outcome {
	settings := weights.DefaultSettings(algorithm)
	targets := make([]cycle.Target, len(fleet))
	for i, s := range fleet {
		eps := make([]weights.Endpoint, len(s.observed))
		for j, o := range s.observed {
			o.CurrentWeight = int(s.weights[s.ipToPod[o.ID]])
			eps[j] = o
		}
		targets[i] = cycle.Target{
			Key: s.input.Service.Namespace + "/" + s.input.Service.Name, Endpoints: eps, Settings: settings,
			HoldTime: 150 * time.Second, WindowCoverage: 1, WindowSeconds: 60,
		}
	}
	outcomes, _ := cycle.Plan(now, targets, map[string]cycle.State{}, writeBudget)
	for _, o := range outcomes {
		if o.Err != nil {
			tb.Fatalf("%s: %v", o.Key, o.Err)
		}
	}
	return outcomes
}

// runCycle is one weight cycle's in-memory work: plan every Service, then, for each write the
// budget lets out, copy the applied ServiceEntry spec, set the decided weights on its endpoints
// and diff it against the applied one, as the operator's weight writer does before patching.
// It returns the number of writes and how many of them change the spec.
func runCycle(tb testing.TB, fleet []*service, now time.Time, algorithm weights.Algorithm) (writes, changed int) {
	for i, o := range plan(tb, fleet, now, algorithm) {
		if o.Action != cycle.ActionWrite {
			continue
		}
		writes++
		next := o.Decision.Weights()
		spec := proto.Clone(fleet[i].current).(*apinetworkingv1.ServiceEntry)
		for _, e := range spec.Endpoints {
			if w, ok := next[e.Address]; ok {
				e.Weight = uint32(w)
			}
		}
		if !proto.Equal(spec, fleet[i].current) {
			changed++
		}
	}
	return writes, changed
}

// rebuildAll is the mirror's worst case in one go: the desired ServiceEntry of every Service
// rebuilt from its Service, slices, pods and nodes with the decided weights, and diffed against
// the applied one. The mirror does this per Service on endpoint changes, never all at once; it
// bounds what a full resync costs.
func rebuildAll(tb testing.TB, fleet []*service, outcomes []cycle.Outcome) (differ int) {
	for i, o := range outcomes {
		decided := make(map[string]uint32, len(o.Decision.Endpoints))
		for _, r := range o.Decision.Endpoints {
			decided[fleet[i].ipToPod[r.ID]] = uint32(r.Weight)
		}
		in := fleet[i].input
		in.Weights = decided
		spec, _, err := istio.Build(in)
		if err != nil {
			tb.Fatal(err)
		}
		if !proto.Equal(spec, fleet[i].current) {
			differ++
		}
	}
	return differ
}

// BenchmarkWeightCycle_10kServices measures one weight cycle for 10,000 Services and 200,000
// pods: the engine, dead band, hold/fallback and budget for every Service, and the weight diff
// of the writes the budget lets out. The metrics fetch for 200,000 pods is measured in
// internal/metrics. Target: < 1 s.
//
//	go test -run '^$' -bench 'WeightCycle_10kServices/capacity' -benchtime 5x -benchmem ./test/scale/
//	go test -run '^$' -bench 'WeightCycle_10kServices/tail' -benchtime 5x -benchmem ./test/scale/
func BenchmarkWeightCycle_10kServices(b *testing.B) {
	f := fleet(b, services)
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for _, algorithm := range []weights.Algorithm{weights.AlgorithmCapacity, weights.AlgorithmTail} {
		b.Run(string(algorithm), func(b *testing.B) {
			var writes, changed int
			b.ReportAllocs()
			b.ResetTimer()
			peak, before := benchutil.PeakHeap(func() {
				for b.Loop() {
					writes, changed = runCycle(b, f, now, algorithm)
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(writes), "writes")
			b.ReportMetric(float64(changed), "changed-SEs")
			b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
			b.ReportMetric(float64(before)/1e6, "fleet-heap-MB")
		})
	}
}

func BenchmarkMirrorRebuild_10kServices(b *testing.B) {
	f := fleet(b, services)
	outcomes := plan(b, f, time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC), weights.AlgorithmCapacity)
	var differ int
	b.ReportAllocs()
	b.ResetTimer()
	peak, before := benchutil.PeakHeap(func() {
		for b.Loop() {
			differ = rebuildAll(b, f, outcomes)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(differ), "changed-SEs")
	b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(before)/1e6, "fleet-heap-MB")
}

// TestWeightCycle_AtScaleDecidesAndBudgetsEveryService checks the benchmarks' premises on a
// slice of the fleet: the budget caps the writes, every written spec really changes, and a full
// rebuild sees every Service's new weights.
func TestWeightCycle_AtScaleDecidesAndBudgetsEveryService(t *testing.T) {
	f := fleet(t, 200)
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	writes, changed := runCycle(t, f, now, weights.AlgorithmCapacity)
	if writes != writeBudget || changed != writes {
		t.Errorf("writes = %d (changed %d), want the budget %d, all changing the spec", writes, changed, writeBudget)
	}
	if differ := rebuildAll(t, f, plan(t, f, now, weights.AlgorithmCapacity)); differ != len(f) {
		t.Errorf("%d of %d rebuilt ServiceEntries differ from the applied ones, want all: the diff misses changes", differ, len(f))
	}
}
