package istiod

import (
	"fmt"
	"maps"
	"net"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	apinetworkingv1 "istio.io/api/networking/v1"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/validation"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The proofs for ServiceEntry slices (several ServiceEntries of the operator for one Service,
// so that no single object has to hold every endpoint): what istiod does with several
// ServiceEntries of one host in the Service's namespace.

// sliceSpecs splits spec's endpoints into n ServiceEntries with the same hosts, addresses,
// ports and exportTo, in address order.
func sliceSpecs(spec *apinetworkingv1.ServiceEntry, n int) []*apinetworkingv1.ServiceEntry {
	out := make([]*apinetworkingv1.ServiceEntry, n)
	for i := range out {
		out[i] = proto.Clone(spec).(*apinetworkingv1.ServiceEntry)
		out[i].Endpoints = nil
	}
	per := (len(spec.Endpoints) + n - 1) / n
	for i, ep := range spec.Endpoints {
		out[i/per].Endpoints = append(out[i/per].Endpoints, proto.Clone(ep).(*apinetworkingv1.WorkloadEntry))
	}
	return out
}

// applySlices writes the slices as ServiceEntries api, api-1, api-2... and waits until istiod's
// endpoint index holds all their endpoints.
func applySlices(t *testing.T, f *xds.FakeDiscoveryServer, slices []*apinetworkingv1.ServiceEntry) {
	t.Helper()
	want := map[string]uint32{}
	for i, spec := range slices {
		cfg := seConfig(spec)
		if i > 0 {
			cfg.Name = fmt.Sprintf("%s-%d", targetName, i)
		}
		if _, err := f.Store().Create(cfg); err != nil {
			t.Fatalf("create ServiceEntry %s: %v", cfg.Name, err)
		}
		for _, ep := range spec.Endpoints {
			want[ep.Address] = ep.Weight
		}
	}
	waitForServiceEntryEndpoints(t, f, want)
}

// TestServiceEntrySlicesMergeInEDS: two ServiceEntries of the Service's host in its namespace,
// each with part of the endpoints and everything else equal, give every client the union of
// their endpoints, each ServiceEntry copy first; CDS, LDS and RDS equal those without them. The
// differential invariant holds as for one ServiceEntry.
func TestServiceEntrySlicesMergeInEDS(t *testing.T) {
	for _, s := range []shape{
		{name: "port-http", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))},
		{name: "multi-port", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)), port("tcp-db", 5432, intstr.FromInt32(5432)))},
	} {
		t.Run(s.name, func(t *testing.T) {
			f := server(t, s.world, nil, xds.FakeOptions{MeshConfig: meshConfig(s)})
			cs := clients(s.world)
			before := make([]snapshot, len(cs))
			for i, c := range cs {
				before[i] = fetch(t, f, c)
			}
			spec, endpoints := build(t, s.world)
			applySlices(t, f, sliceSpecs(spec, 2))
			wantWeight := map[string]uint32{}
			for _, ep := range endpoints {
				wantWeight[ep.IP] = ep.Weight
			}
			for i, c := range cs {
				checkInvariant(t, c.name, before[i], fetch(t, f, c), wantWeight)
			}
		})
	}
}

// TestServiceEntrySlicesWithDifferentPortsLoseWeights records what goes wrong when the slices'
// ports differ: a slice that lacks one of the Service's ports (here the second has only port
// 80) contributes no endpoint to that port's cluster, so its pods keep there only their
// Kubernetes copy, at weight 1, while the other slice's pods carry the operator's weights: the
// weights are silently lost on that port. Slices must all carry every port.
func TestServiceEntrySlicesWithDifferentPortsLoseWeights(t *testing.T) {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)), port("tcp-db", 5432, intstr.FromInt32(5432)))
	f := server(t, w, nil, xds.FakeOptions{})
	spec, _ := build(t, w)
	slices := sliceSpecs(spec, 2)
	second := slices[1]
	second.Ports = second.Ports[:1]
	for _, ep := range second.Endpoints {
		delete(ep.Ports, "tcp-db")
	}
	if second.Ports[0].Number != 80 {
		t.Fatalf("the second slice keeps port %d, want 80", second.Ports[0].Number)
	}
	applySlices(t, f, slices)
	snap := fetch(t, f, clients(w)[0])
	_, on80 := keptByEnvoy(snap.endpoints["outbound|80||"+targetHost])
	_, on5432 := keptByEnvoy(snap.endpoints["outbound|5432||"+targetHost])
	for _, ep := range second.Endpoints {
		if got := on80[net.JoinHostPort(ep.Address, "8080")]; got != ep.Weight {
			t.Errorf("port 80: host %s kept with weight %d, want the operator's %d", ep.Address, got, ep.Weight)
		}
		if got := on5432[net.JoinHostPort(ep.Address, "5432")]; got != 1 {
			t.Errorf("port 5432: host %s kept with weight %d; the recorded loss (the Kubernetes copy's weight 1) no longer holds", ep.Address, got)
		}
	}
	for _, ep := range slices[0].Endpoints {
		if got := on5432[net.JoinHostPort(ep.Address, "5432")]; got != ep.Weight {
			t.Errorf("port 5432: host %s of the first slice kept with weight %d, want the operator's %d", ep.Address, got, ep.Weight)
		}
	}
	t.Logf("kept weights: port 80 %v, port 5432 %v", on80, on5432)
}

// applyPlannedSlices writes spec's endpoints as the operator's slices, planned by
// istio.PlanSlices at perSlice endpoints per slice and named by istio.SliceName, each checked by
// istiod's own validation, and waits until istiod's endpoint index holds all their endpoints.
func applyPlannedSlices(t *testing.T, f *xds.FakeDiscoveryServer, spec *apinetworkingv1.ServiceEntry, perSlice int) int {
	t.Helper()
	plan := istio.PlanSlices(targetName, nil, spec.Endpoints, perSlice)
	want := map[string]uint32{}
	for _, w := range plan.Writes {
		cfg := seConfig(istio.SliceSpec(spec, w.Endpoints))
		cfg.Name = w.Name
		cfg.Labels["adaptivelb.io/service"] = targetName
		if warnings, err := validation.ValidateServiceEntry(cfg); err != nil || warnings != nil {
			t.Fatalf("istiod's validation of slice %s: %v (warnings %v)", w.Name, err, warnings)
		}
		if _, err := f.Store().Create(cfg); err != nil {
			t.Fatalf("create ServiceEntry %s: %v", cfg.Name, err)
		}
		for _, ep := range cfg.Spec.(*apinetworkingv1.ServiceEntry).Endpoints {
			want[ep.Address] = ep.Weight
		}
	}
	waitForServiceEntryEndpoints(t, f, want)
	return len(plan.Writes)
}

// TestPlannedSlicesGiveTheXDSOfOneServiceEntry is the differential test of the operator's
// slices against one ServiceEntry with every endpoint: for every client, CDS, LDS and RDS are
// equal, and in EDS Envoy keeps the same hosts with the same weights, localities and metadata
// (the workload name aside, which istiod derives from the ServiceEntry's name). The slices are
// the planner's, named web.1, web.2 as the operator names them, one endpoint each so that every
// endpoint is in a slice of its own.
func TestPlannedSlicesGiveTheXDSOfOneServiceEntry(t *testing.T) {
	for _, s := range []shape{
		{name: "port-http", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))},
		{name: "multi-port", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)), port("tcp-db", 5432, intstr.FromInt32(5432)))},
	} {
		t.Run(s.name, func(t *testing.T) {
			f := server(t, s.world, nil, xds.FakeOptions{MeshConfig: meshConfig(s)})
			cs := clients(s.world)
			before := make([]snapshot, len(cs))
			for i, c := range cs {
				before[i] = fetch(t, f, c)
			}
			spec, _ := build(t, s.world)
			wantWeight := map[string]uint32{}
			for i, ep := range spec.Endpoints {
				ep.Weight = uint32(100 + 137*i) // distinct weights, so that a mix-up shows
				wantWeight[ep.Address] = ep.Weight
			}
			applySE(t, f, spec)
			one := make([]snapshot, len(cs))
			for i, c := range cs {
				one[i] = fetch(t, f, c)
			}
			deleteSE(t, f)
			if n := applyPlannedSlices(t, f, spec, 1); n != len(spec.Endpoints) || n < 2 {
				t.Fatalf("%d slices for %d endpoints", n, len(spec.Endpoints))
			}
			for i, c := range cs {
				sliced := fetch(t, f, c)
				var d diffs
				compareResources(&d, "CDS", one[i].clusters, sliced.clusters)
				compareResources(&d, "LDS", one[i].listeners, sliced.listeners)
				compareResources(&d, "RDS", one[i].routes, sliced.routes)
				for name, a := range one[i].endpoints {
					b, ok := sliced.endpoints[name]
					if !ok {
						d.add("EDS %s missing with slices", name)
						continue
					}
					keptA, weightsA, _ := keptHosts(a)
					keptB, weightsB, _ := keptHosts(b)
					if !proto.Equal(keptA, keptB) || !maps.Equal(weightsA, weightsB) {
						d.add("EDS %s differs with slices (-one +slices):\n%s\nweights %v, with slices %v", name, gocmp.Diff(keptA, keptB, protocmp.Transform()), weightsA, weightsB)
					}
				}
				if len(d) > 0 {
					t.Errorf("proxy %s: %d differences between one ServiceEntry and its slices:\n%s", c.name, len(d), strings.Join(d, "\n"))
				}
				checkInvariant(t, c.name, before[i], sliced, wantWeight)
			}
		})
	}
}
