package istiod

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
)

// hostKey is how Envoy identifies a host within a cluster: its socket address.
func hostKey(ep *endpointv3.LbEndpoint) string {
	sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
	return net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
}

// keptByEnvoy returns the ClusterLoadAssignment as Envoy applies it: the first occurrence of
// each address across the whole assignment (all priorities and localities) is the host, later
// ones are dropped, and a LocalityLbEndpoints left empty disappears. The weights of the kept
// endpoints are returned by address and cleared, as are the localities' weights (istiod sends
// the sum of a locality's endpoint weights, duplicates included; Envoy reads it only when the
// cluster balances by locality weight, which compareEndpoints checks separately).
func keptByEnvoy(cla *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, map[string]uint32) {
	out, weights, _ := keptHosts(cla)
	return out, weights
}

// keptHosts is keptByEnvoy that also returns, by address, the workload name of the kept host's
// Istio metadata ("istio"/"workload" = "name;namespace;canonical name;revision;cluster"), and
// blanks that name in the returned assignment: istiod names a ServiceEntry endpoint's workload
// "<serviceentry>-<index>" and offers no field to set it (TestWorkloadNameOfServiceEntryHosts).
func keptHosts(cla *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, map[string]uint32, map[string]string) {
	out, weights, workloads, _ := keptHostsAndLocalityWeights(cla)
	return out, weights, workloads
}

// keptHostsAndLocalityWeights is keptHosts that also returns the localities' weights as sent,
// by priority and locality.
func keptHostsAndLocalityWeights(cla *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, map[string]uint32, map[string]string, map[string]uint32) {
	out := proto.Clone(cla).(*endpointv3.ClusterLoadAssignment)
	weights := map[string]uint32{}
	workloads := map[string]string{}
	localityWeights := map[string]uint32{}
	seen := map[string]bool{}
	var groups []*endpointv3.LocalityLbEndpoints
	for _, g := range out.Endpoints {
		var kept []*endpointv3.LbEndpoint
		for _, ep := range g.LbEndpoints {
			key := hostKey(ep)
			if seen[key] {
				continue
			}
			seen[key] = true
			weights[key] = ep.GetLoadBalancingWeight().GetValue()
			ep.LoadBalancingWeight = nil
			// istiod marks Kubernetes endpoints HEALTHY and leaves ServiceEntry endpoints UNKNOWN;
			// Envoy balances over both alike (UNKNOWN counts as healthy).
			if ep.HealthStatus == corev3.HealthStatus_HEALTHY {
				ep.HealthStatus = corev3.HealthStatus_UNKNOWN
			}
			if w := ep.GetMetadata().GetFilterMetadata()["istio"].GetFields()["workload"]; w != nil {
				name, rest, _ := strings.Cut(w.GetStringValue(), ";")
				workloads[key] = name
				w.Kind = &structpb.Value_StringValue{StringValue: ";" + rest}
			}
			kept = append(kept, ep)
		}
		if len(kept) == 0 {
			continue
		}
		g.LbEndpoints = kept
		localityWeights[fmt.Sprintf("%d %s", g.Priority, localityString(g.Locality))] = g.GetLoadBalancingWeight().GetValue()
		g.LoadBalancingWeight = nil
		slices.SortFunc(g.LbEndpoints, func(a, b *endpointv3.LbEndpoint) int { return cmp.Compare(hostKey(a), hostKey(b)) })
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b *endpointv3.LocalityLbEndpoints) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(localityString(a.Locality), localityString(b.Locality)))
	})
	out.Endpoints = groups
	return out, weights, workloads, localityWeights
}

func localityString(l *corev3.Locality) string {
	return l.GetRegion() + "/" + l.GetZone() + "/" + l.GetSubZone()
}

// compareEndpoints checks the EDS half of the invariant for one proxy. For the weighted Service's
// clusters, the hosts Envoy keeps must equal the Kubernetes-only hosts in everything but the
// weight, and carry the operator's weight; where the cluster balances by locality weight
// (localityWeighted), each locality's weight must stay (set by distribute) or grow by exactly its
// hosts' operator weights.
// Every other cluster must be byte-identical.
func compareEndpoints(d *diffs, without, with map[string]*endpointv3.ClusterLoadAssignment, wantWeight map[string]uint32, localityWeighted func(cluster string) bool) {
	for name, a := range without {
		b, ok := with[name]
		if !ok {
			d.add("EDS %s disappears with the ServiceEntry", name)
			continue
		}
		if !isTargetCluster(name) {
			if !proto.Equal(a, b) {
				d.add("EDS %s of another Service changes with the ServiceEntry (-without +with):\n%s", name, gocmp.Diff(a, b, protocmp.Transform()))
			}
			continue
		}
		// Both copies of an address must share one LocalityLbEndpoints: a second group for the
		// same locality and priority (istiod groups by its locality string, "r/z" and "r/z/"
		// differ) splits the locality's weight in two.
		groups := map[string]int{}
		for _, g := range b.Endpoints {
			groups[fmt.Sprintf("priority %d locality %s", g.Priority, localityString(g.Locality))]++
		}
		for k, n := range groups {
			if n > 1 {
				d.add("EDS %s: %d LocalityLbEndpoints for %s", name, n, k)
			}
		}
		keptA, _, _, localityA := keptHostsAndLocalityWeights(a)
		keptB, weightsB, _, localityB := keptHostsAndLocalityWeights(b)
		if localityWeighted(name) {
			// A locality keeps the share localityLbSetting.distribute gives it; otherwise
			// istiod weighs it by the sum of its endpoints' weights, the Kubernetes duplicates
			// Envoy drops included: with the ServiceEntry it must weigh its hosts' operator
			// weights plus exactly what it weighed without.
			want := maps.Clone(localityA)
			for _, g := range keptB.Endpoints {
				k := fmt.Sprintf("%d %s", g.Priority, localityString(g.Locality))
				for _, ep := range g.LbEndpoints {
					want[k] += weightsB[hostKey(ep)]
				}
			}
			if !maps.Equal(localityA, localityB) && !maps.Equal(want, localityB) {
				d.add("EDS %s: locality weights %v with the ServiceEntry, want %v (%v without it plus the operator's weights)", name, localityB, want, localityA)
			}
		}
		if !proto.Equal(keptA, keptB) {
			d.add("EDS %s: the hosts Envoy keeps differ from the Kubernetes hosts beyond the weight (-without +with):\n%s",
				name, gocmp.Diff(keptA, keptB, protocmp.Transform()))
		}
		for key, got := range weightsB {
			ip, _, _ := net.SplitHostPort(key)
			if want, ok := wantWeight[ip]; ok && got != want {
				d.add("EDS %s: host %s kept with weight %d, the operator wrote %d", name, key, got, want)
			}
		}
	}
	for name := range with {
		if _, ok := without[name]; !ok {
			d.add("EDS %s appears with the ServiceEntry", name)
		}
	}
}
