package istio

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// OrdinaryLabels are the labels of a pod of a typical Helm-installed Deployment in the mesh,
// the basis of MaxSingleServiceEntryEndpoints.
func OrdinaryLabels(app string) map[string]string {
	return map[string]string{
		"app": app, "version": "v1", "pod-template-hash": "7d9f8b6c4d",
		"app.kubernetes.io/name": app, "app.kubernetes.io/instance": app + "-prod", "app.kubernetes.io/version": "1.24.3",
		"app.kubernetes.io/component": "backend", "app.kubernetes.io/part-of": "shop",
		"service.istio.io/canonical-name": app, "service.istio.io/canonical-revision": "v1",
	}
}

// largeInput is a Service of n pods with the labels labels gives, all at weight w, over three
// zones.
func largeInput(n int, w uint32, labels func() map[string]string) Input {
	in := Input{Service: service(), Pods: map[string]*corev1.Pod{}, Nodes: map[string]*corev1.Node{}, Weights: map[string]uint32{},
		DefaultWeight: w, ClusterDomain: "cluster.local", MaxEndpoints: n}
	for z := range 3 {
		in.Nodes[fmt.Sprintf("node-%d", z)] = node(fmt.Sprintf("node-%d", z), "eu-west", fmt.Sprintf("eu-west-1%c", 'a'+z))
	}
	var eps []discoveryv1.Endpoint
	for i := range n {
		name, ip := fmt.Sprintf("web-%05d", i), fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
		p := pod(name, ip, fmt.Sprintf("node-%d", i%3))
		p.Labels = labels()
		in.Pods[name] = p
		eps = append(eps, endpoint(name, ip, fmt.Sprintf("eu-west-1%c", 'a'+i%3)))
	}
	in.Slices = []*discoveryv1.EndpointSlice{slice("web-1", discoveryv1.AddressTypeIPv4, eps...)}
	return in
}

func TestLimitWeightSum_NoLocalityCanOverflowEnvoysUint32(t *testing.T) {
	cases := map[string]struct {
		n       int
		weight  uint32
		scaled  bool
		ratioOf [2]int // two endpoints whose ratio must survive
	}{
		"4,296 endpoints just pass the sum":               {n: 4296, weight: 1_000_000, scaled: true},
		"4,294 endpoints fit and are left alone":          {n: 4294, weight: 1_000_000, scaled: false},
		"2,000 endpoints at the default weights are fine": {n: 2000, weight: 100, scaled: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			// Few labels, so that the size limit does not refuse first.
			in := largeInput(tc.n, tc.weight, func() map[string]string { return map[string]string{"app": "web"} })
			// One endpoint at a tenth of the others: the ratio must survive scaling.
			in.Weights["web-00000"] = tc.weight / 10
			spec, eps, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			var sum uint64
			perLocality := map[string]uint64{}
			for _, e := range spec.Endpoints {
				sum += uint64(e.Weight)
				perLocality[e.Locality] += uint64(e.Weight)
				if e.Weight == 0 {
					t.Fatalf("endpoint %s has weight 0, which Envoy ignores", e.Address)
				}
			}
			if sum > MaxWeightSum {
				t.Fatalf("weight sum %d exceeds %d", sum, uint64(MaxWeightSum))
			}
			for l, s := range perLocality {
				if s > MaxWeightSum {
					t.Fatalf("locality %s sums to %d", l, s)
				}
			}
			if changed := spec.Endpoints[1].Weight != tc.weight; changed != tc.scaled {
				t.Fatalf("scaled %v, want %v (weight %d)", changed, tc.scaled, spec.Endpoints[1].Weight)
			}
			// The status view reports the weights written.
			for i := range eps {
				if eps[i].Weight != spec.Endpoints[i].Weight {
					t.Fatalf("status weight %d, ServiceEntry weight %d for %s", eps[i].Weight, spec.Endpoints[i].Weight, eps[i].IP)
				}
			}
			small, big := spec.Endpoints[0].Weight, spec.Endpoints[1].Weight
			if r := float64(big) / float64(small); r < 9.99 || r > 10.01 {
				t.Fatalf("the 1:10 ratio became 1:%.3f", r)
			}
		})
	}
}

// Directly, at the size the issue names: 9,000 endpoints at the largest weight.
func TestLimitWeightSum_NineThousandEndpointsAtTheLargestWeight(t *testing.T) {
	var entries []*apinetworkingv1.WorkloadEntry
	for range 9000 {
		entries = append(entries, &apinetworkingv1.WorkloadEntry{Weight: 1_000_000})
	}
	entries[0].Weight = 1 // the smallest weight stays at least 1
	if !LimitWeightSum(entries) {
		t.Fatal("not scaled")
	}
	var sum uint64
	for _, e := range entries {
		sum += uint64(e.Weight)
	}
	if sum > MaxWeightSum || entries[0].Weight != 1 || entries[1].Weight < 470_000 {
		t.Fatalf("sum %d, weights %d and %d", sum, entries[0].Weight, entries[1].Weight)
	}
}

func ordinary() map[string]string { return OrdinaryLabels("web") }

func TestBuild_RefusesAServiceAboveTheEndpointLimit(t *testing.T) {
	in := largeInput(301, 100, ordinary)
	in.MaxEndpoints = 300
	_, _, err := Build(in)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("301 endpoints above a limit of 300: err %v, want ErrTooLarge", err)
	}
	want := "Service shop/web: ServiceEntry too large: 301 ready endpoints, above the limit of 300 endpoints per Service; its clients use the Kubernetes endpoints without weights"
	if err.Error() != want {
		t.Fatalf("message\n%s\nwant\n%s", err, want)
	}
	// 10,000 endpoints with ordinary labels: far above what one ServiceEntry holds, mirrored
	// in slices.
	in = largeInput(10_000, 100, ordinary)
	in.MaxEndpoints = 0 // the default
	whole, _, err := Build(in)
	if err != nil {
		t.Fatalf("10,000 endpoints: %v", err)
	}
	plan := PlanSlices("web", nil, whole.Endpoints, 0)
	if len(plan.Slices) != 10_000/MaxSliceEndpoints {
		t.Fatalf("%d slices, want %d", len(plan.Slices), 10_000/MaxSliceEndpoints)
	}
	for name, eps := range plan.Slices {
		if err := CheckSliceSize(SliceSpec(whole, eps), 0); err != nil {
			t.Fatalf("slice %s: %v", name, err)
		}
	}
}

func TestCheckSliceSize_RefusesASliceTooLargeForEtcd(t *testing.T) {
	in := largeInput(MaxSliceEndpoints, 100, ordinary)
	whole, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSliceSize(whole, 0); err != nil {
		t.Fatalf("a full slice of ordinary labels: %v", err)
	}
	// A full slice with very long labels (thirty of 63 characters under keys of 400) is refused
	// by size, with what to do.
	in = largeInput(MaxSliceEndpoints, 100, ordinary)
	for _, p := range in.Pods {
		for i := range 30 {
			p.Labels[fmt.Sprintf("example.com/%0380d", i)] = fmt.Sprintf("%063d", i)
		}
	}
	whole, _, err = Build(in)
	if err != nil {
		t.Fatal(err)
	}
	err = CheckSliceSize(whole, 0)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "shorten the pods' labels") {
		t.Fatalf("%d endpoints with 14 KB of labels each: err %v, want ErrTooLarge saying what to do", MaxSliceEndpoints, err)
	}
}

// Slices listed in another order give the same ServiceEntry, also when an address appears in two
// of them (an IP reused before the old slice is updated).
func TestBuild_SliceOrderDoesNotMatter(t *testing.T) {
	in := input()
	in.Pods["web-old"] = pod("web-old", "10.0.0.1", "node-1")
	in.Pods["web-old"].Labels = map[string]string{"app": "web", "version": "v0"}
	a := slice("web-a", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "eu-west-1a"), endpoint("web-b", "10.0.0.2", "eu-west-1b"))
	a.Name = "web-a"
	b := slice("web-b", discoveryv1.AddressTypeIPv4, endpoint("web-old", "10.0.0.1", "eu-west-1a"))
	b.Name = "web-b"
	in.Slices = []*discoveryv1.EndpointSlice{a, b}
	first, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Slices = []*discoveryv1.EndpointSlice{b, a}
	second, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, second) {
		t.Fatalf("slice order changed the ServiceEntry:\n%v\n%v", first, second)
	}
}
