package istiod

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/cluster"
	"istio.io/istio/pkg/config/mesh/meshwatcher"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The second cluster of the multi-cluster cases: the same Service shop/api with three pods of
// its own, in the same locality as the local pods.
const remoteCluster = "remote"

// multiClusterWorld is the local side: four pods weighted 100/300/50/10, all in one locality
// (node-a), so that the local and the remote copies share one LocalityLbEndpoints.
func multiClusterWorld() world {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
	w.pods = nil
	for i, weight := range []uint32{100, 300, 50, 10} {
		w.pods = append(w.pods, podSpec{name: fmt.Sprintf("api-5c9d-l%d", i), ip: fmt.Sprintf("10.1.0.%d", i+1), node: "node-a", sidecar: classicSidecar, weight: weight})
	}
	return w
}

// remoteObjects is the remote cluster's registry: its namespaces, a node in the local pods'
// locality, the Service (its own ClusterIP) with three pods and their EndpointSlice.
func remoteObjects() []runtime.Object {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
	w.service.Spec.ClusterIP, w.service.Spec.ClusterIPs = "10.97.0.10", []string{"10.97.0.10"}
	w.nodes = map[string]map[string]string{"node-r": defaultNodes()["node-a"]}
	w.pods = nil
	for i := range 3 {
		w.pods = append(w.pods, podSpec{name: fmt.Sprintf("api-7f2a-r%d", i), ip: fmt.Sprintf("10.2.1.%d", i+1), node: "node-r", sidecar: classicSidecar})
	}
	out := w.namespaces()
	for name, labels := range w.nodes {
		out = append(out, nodeObject(name, labels))
	}
	out = append(out, w.service)
	for _, p := range w.pods {
		out = append(out, p.pod())
	}
	for _, s := range w.slices() {
		out = append(out, s)
	}
	return out
}

// twoNetworks puts each cluster in a network of its own, each with an east-west gateway.
func twoNetworks() *meshconfig.MeshNetworks {
	network := func(registry, gateway string) *meshconfig.Network {
		return &meshconfig.Network{
			Endpoints: []*meshconfig.Network_NetworkEndpoints{{Ne: &meshconfig.Network_NetworkEndpoints_FromRegistry{FromRegistry: registry}}},
			Gateways:  []*meshconfig.Network_IstioNetworkGateway{{Gw: &meshconfig.Network_IstioNetworkGateway_Address{Address: gateway}, Port: 15443}},
		}
	}
	return &meshconfig.MeshNetworks{Networks: map[string]*meshconfig.Network{
		"network-1": network("Kubernetes", "192.0.2.1"),
		"network-2": network(remoteCluster, "192.0.2.2"),
	}}
}

// multiClusterServer starts istiod with the local world and the remote cluster's registry.
func multiClusterServer(t *testing.T, w world, networks *meshconfig.MeshNetworks) *xds.FakeDiscoveryServer {
	t.Helper()
	opts := xds.FakeOptions{KubernetesObjectsByCluster: map[cluster.ID][]runtime.Object{remoteCluster: remoteObjects()}}
	if networks != nil {
		opts.NetworksWatcher = meshwatcher.NewFixedNetworksWatcher(networks)
	}
	return server(t, w, nil, opts)
}

// localShare is the share of the weight of the hosts Envoy keeps in the Service's port-80
// cluster that goes to the local pods' addresses; every other host (a remote pod, or the remote
// network's gateway) is the other clusters'. It also returns the kept hosts by address.
func localShare(cla *endpointv3.ClusterLoadAssignment, local map[string]bool) (float64, map[string]uint32) {
	_, weights := keptByEnvoy(cla)
	var mine, total uint64
	for key, w := range weights {
		ip, _, _ := net.SplitHostPort(key)
		total += uint64(w)
		if local[ip] {
			mine += uint64(w)
		}
	}
	if total == 0 {
		return 0, weights
	}
	return float64(mine) / float64(total), weights
}

// TestServiceEntryInMultiClusterMesh: a multi-primary mesh where the second cluster runs the
// same Service. istiod merges the remote cluster's pods into the host's clusters beside the
// local ones, at weight 1 (across networks: the remote network's gateway, weighted by their
// count): the operator's weights, in the same LocalityLbEndpoints, would also decide how much
// traffic stays in this cluster, and only all-equal weights keep the split. So the operator
// refuses a multi-cluster mesh (istiod's count of its remote clusters is what it sees),
// and the test records what a ServiceEntry written anyway would do: the local share moves from
// 57.1% (4 of 7 pods) to 99.4% (460 of 463).
func TestServiceEntryInMultiClusterMesh(t *testing.T) {
	for _, tc := range []struct {
		name     string
		networks *meshconfig.MeshNetworks
		network  string // the local cluster's, and its client's
	}{
		{name: "same-network"},
		{name: "across-networks", networks: twoNetworks(), network: "network-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := multiClusterWorld()
			w.mesh.Network = tc.network
			clusters, err := istio.JudgeClusters(istio.MultiClusterAuto, "", istio.RemoteClusterReport{ByIstiod: map[string]float64{"istio-system/istiod-7d9f": 1}})
			if err != nil {
				t.Fatal(err)
			}
			w.mesh.MultiCluster = clusters.Several
			if _, _, err := istio.Build(w.input()); !errors.Is(err, istio.ErrMultiCluster) || !strings.Contains(err.Error(), "istiod istio-system/istiod-7d9f reads 1 remote cluster ") {
				t.Fatalf("Build in a multi-cluster mesh: err = %v, want ErrMultiCluster naming istiod's count", err)
			}

			// What a ServiceEntry written anyway would do.
			w.mesh.MultiCluster = nil
			local := map[string]bool{}
			for _, p := range w.pods {
				local[p.ip] = true
			}
			f := multiClusterServer(t, w, tc.networks)
			c := clients(w)[0]
			c.network = tc.network
			const cluster80 = "outbound|80||" + targetHost
			before, hostsBefore := localShare(fetch(t, f, c).endpoints[cluster80], local)
			spec, _ := build(t, w)
			applySE(t, f, spec)
			after, hostsAfter := localShare(fetch(t, f, c).endpoints[cluster80], local)
			t.Logf("local share of the traffic: %.1f%% without the ServiceEntry (%v), %.1f%% with it (%v)", 100*before, hostsBefore, 100*after, hostsAfter)
			if diff := after - before; diff < 0.3 {
				t.Errorf("the local share moves from %.1f%% to %.1f%% only: the recorded reason to refuse multi-cluster meshes no longer holds", 100*before, 100*after)
			}
		})
	}
}

// TestServiceEntryAcrossNetworks: primary-remote across networks, a client in the remote
// cluster's network. istiod sends it the local cluster's pods through network-1's east-west
// gateway; the ServiceEntry's copies, which carry the pods' network (the cluster's, here), reach
// it the same way, never as pod addresses of another network, which it cannot route to. (A
// ServiceEntry without the network gave it the four local pods' addresses directly.)
func TestServiceEntryAcrossNetworks(t *testing.T) {
	w := multiClusterWorld()
	w.mesh.Network = "network-1"
	f := multiClusterServer(t, w, twoNetworks())
	remote := client{name: "remote-network", nodeType: "sidecar", ip: "10.2.9.1", pod: "client-r", namespace: clientNamespace,
		labels: map[string]string{"app": "client"}, cluster: remoteCluster, network: "network-2"}
	const cluster80 = "outbound|80||" + targetHost
	_, before := keptByEnvoy(fetch(t, f, remote).endpoints[cluster80])
	spec, _ := build(t, w)
	applySE(t, f, spec)
	_, after := keptByEnvoy(fetch(t, f, remote).endpoints[cluster80])
	t.Logf("hosts of the remote network's client: %v without the ServiceEntry, %v with it", before, after)
	for key := range after {
		ip, _, _ := net.SplitHostPort(key)
		for _, p := range w.pods {
			if p.ip == ip {
				t.Errorf("the client in network-2 gets the local pod %s directly (host %s), an address of network-1 it cannot reach; without the ServiceEntry it reaches network-1 through its gateway (%v)", p.name, key, before)
			}
		}
	}
}

func nodeObject(name string, labels map[string]string) *corev1.Node {
	n := &corev1.Node{}
	n.Name, n.Labels = name, labels
	return n
}
