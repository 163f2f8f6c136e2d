package istiod

import (
	"net"
	"slices"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pilot/test/xds"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestWeightOnlyChangeIsEDSOnly: when only the weights change, istiod pushes EDS and nothing
// else to every client proxy, except the Service's own pods whose weight changed: a proxy whose
// own endpoint changed gets a full push (CDS, EDS, LDS, RDS) as well; one whose weight stayed
// gets EDS only (own-pod-weight-unchanged). Each proxy holds an open ADS stream subscribed like Envoy; the
// test records every response between a weight change and the EDS response that carries the new
// weights. Two changes in a row, so a full push's LDS/RDS trailing the first EDS would show up
// before the second change's EDS (one stream delivers one push after another).
func TestWeightOnlyChangeIsEDSOnly(t *testing.T) {
	for _, tc := range []struct {
		shape
		// ownWeightChanges: the weight of the pod behind the own-pod proxy changes too.
		ownWeightChanges bool
	}{
		{shape{name: "port-http", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))}, true},
		{shape{name: "multi-port", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)), port("tcp-db", 5432, intstr.FromInt32(5432)))}, true},
		{shape{name: "own-pod-weight-unchanged", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))}, false},
	} {
		s := tc.shape
		t.Run(s.name, func(t *testing.T) {
			w := s.world
			f := server(t, w, nil, xds.FakeOptions{MeshConfig: meshConfig(s)})
			spec, _ := build(t, w)
			applySE(t, f, spec)
			cs := clients(w)
			streams := make([]*stream, len(cs))
			for i, c := range cs {
				streams[i] = connect(t, f, c)
				streams[i].subscribeAll(t)
			}
			for change := 1; change <= 2; change++ {
				for i := range w.pods {
					if i > 0 || tc.ownWeightChanges {
						w.pods[i].weight = uint32(100*change + i + 1)
					}
				}
				spec, _ := build(t, w)
				applySE(t, f, spec)
				want := map[string]uint32{}
				for _, p := range w.pods {
					want[p.ip] = p.weight
				}
				for _, st := range streams {
					// One of the Service's own pods also gets a full push (its own endpoint
					// changed), before or after the EDS push: read until both arrived. A
					// missing full push fails at the response timeout.
					ownPod := st.c.name == "own-pod" && tc.ownWeightChanges
					var got []string
					for weighted, full := false, false; !weighted || (ownPod && !full); {
						resp := st.receive(t)
						got = append(got, resp.TypeUrl)
						full = full || resp.TypeUrl == v3.ClusterType
						if resp.TypeUrl == v3.EndpointType && carriesWeights(decode[*endpointv3.ClusterLoadAssignment](t, resp), want) {
							weighted = true
						}
					}
					if !ownPod && slices.ContainsFunc(got, func(u string) bool { return u != v3.EndpointType }) {
						t.Errorf("change %d: proxy %s got %v, want EDS only", change, st.c.name, got)
					}
					t.Logf("change %d: proxy %s received %v", change, st.c.name, shortTypes(got))
				}
			}
		})
	}
}

// carriesWeights: some cluster of the weighted Service has every mirrored address with the
// given weight on its first occurrence.
func carriesWeights(clas []*endpointv3.ClusterLoadAssignment, want map[string]uint32) bool {
	for _, cla := range clas {
		if !isTargetCluster(cla.ClusterName) {
			continue
		}
		_, weights := keptByEnvoy(cla)
		match := 0
		for key, w := range weights {
			ip, _, _ := net.SplitHostPort(key)
			if want[ip] == w {
				match++
			}
		}
		if match == len(want) {
			return true
		}
	}
	return false
}

func shortTypes(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		switch {
		case strings.HasSuffix(u, "Cluster"):
			out[i] = "CDS"
		case strings.HasSuffix(u, "ClusterLoadAssignment"):
			out[i] = "EDS"
		case strings.HasSuffix(u, "Listener"):
			out[i] = "LDS"
		case strings.HasSuffix(u, "RouteConfiguration"):
			out[i] = "RDS"
		default:
			out[i] = u
		}
	}
	return out
}
