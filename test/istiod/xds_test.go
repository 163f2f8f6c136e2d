package istiod

import (
	"fmt"
	"maps"
	"sort"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	apinetworkingv1 "istio.io/api/networking/v1"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pilot/pkg/serviceregistry/provider"
	pilotxds "istio.io/istio/pilot/pkg/xds"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pilot/test/xdstest"
	"istio.io/istio/pkg/cluster"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation"
	"istio.io/istio/pkg/network"
	"istio.io/istio/pkg/test/util/retry"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// responseTimeout bounds each wait for istiod's answer on an ADS stream. It is a hang guard,
// not a measurement: a healthy in-process server answers in milliseconds.
const responseTimeout = 2 * time.Minute

// client is one proxy that receives config from istiod.
type client struct {
	name      string
	nodeType  model.NodeType
	ip        string
	pod       string
	namespace string
	labels    map[string]string
	// cluster and network are the proxy's (default: the local cluster, no network).
	cluster string
	network string
}

func (c client) nodeID() string {
	return fmt.Sprintf("%s~%s~%s.%s~%s.svc.%s", c.nodeType, c.ip, c.pod, c.namespace, c.namespace, clusterDomain)
}

func (c client) metadata() model.NodeMetadata {
	clusterID := c.cluster
	if clusterID == "" {
		clusterID = "Kubernetes"
	}
	return model.NodeMetadata{
		Namespace:    c.namespace,
		Labels:       c.labels,
		ClusterID:    cluster.ID(clusterID),
		Network:      network.ID(c.network),
		IstioVersion: "1.31.0",
	}
}

// clients: a sidecar in another namespace, a sidecar in the Service's namespace, one of the
// Service's own pods (inbound listeners), and an ingress gateway.
func clients(w world) []client {
	own := w.pods[0]
	labels := map[string]string{"app": targetName}
	for k, v := range own.labels {
		labels[k] = v
	}
	return []client{
		{name: "other-namespace", nodeType: model.SidecarProxy, ip: "10.3.0.1", pod: "client-0", namespace: clientNamespace, labels: map[string]string{"app": "client"}},
		{name: "same-namespace", nodeType: model.SidecarProxy, ip: "10.1.9.1", pod: "neighbour-0", namespace: targetNamespace, labels: map[string]string{"app": "neighbour"}},
		{name: "own-pod", nodeType: model.SidecarProxy, ip: own.ip, pod: own.name, namespace: targetNamespace, labels: labels},
		{name: "gateway", nodeType: model.Router, ip: "10.4.0.1", pod: "istio-ingressgateway-0", namespace: "istio-system", labels: map[string]string{"istio": "ingressgateway"}},
	}
}

// snapshot is all a proxy received, by resource name.
type snapshot struct {
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
}

// stream is one real ADS connection to the in-process istiod.
type stream struct {
	ads *pilotxds.AdsTest
	c   client
	// subscribed are the resource names requested per type, repeated in every ACK.
	subscribed map[string][]string
}

func connect(t *testing.T, f *xds.FakeDiscoveryServer, c client) *stream {
	t.Helper()
	ads := f.ConnectADS().WithID(c.nodeID()).WithMetadata(c.metadata()).WithTimeout(responseTimeout)
	return &stream{ads: ads, c: c, subscribed: map[string][]string{}}
}

// request sends a request for typeURL and returns the answer to it, ACKing it. Responses of other
// types that arrive first (a push racing the request) are ACKed and skipped.
func (s *stream) request(t *testing.T, typeURL string, names []string) *discovery.DiscoveryResponse {
	t.Helper()
	s.ads.Request(t, &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names})
	for {
		resp := s.receive(t)
		if resp.TypeUrl == typeURL {
			return resp
		}
	}
}

// receive returns the next response and ACKs it.
func (s *stream) receive(t *testing.T) *discovery.DiscoveryResponse {
	t.Helper()
	resp := s.ads.ExpectResponse(t)
	s.ads.Request(t, &discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, ResponseNonce: resp.Nonce, VersionInfo: resp.VersionInfo, ResourceNames: s.subscribed[resp.TypeUrl]})
	return resp
}

// fetch subscribes to CDS, EDS for every EDS cluster, LDS and RDS for every route the listeners
// name, the way Envoy does, and returns what istiod sent.
func fetch(t *testing.T, f *xds.FakeDiscoveryServer, c client) snapshot {
	t.Helper()
	s := connect(t, f, c)
	defer s.ads.Cleanup()
	return s.subscribeAll(t)
}

func (s *stream) subscribeAll(t *testing.T) snapshot {
	t.Helper()
	snap := snapshot{
		clusters:  map[string]*clusterv3.Cluster{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		listeners: map[string]*listenerv3.Listener{},
		routes:    map[string]*routev3.RouteConfiguration{},
	}
	var edsClusters []string
	for _, c := range decode[*clusterv3.Cluster](t, s.request(t, v3.ClusterType, nil)) {
		snap.clusters[c.Name] = c
		if c.GetType() == clusterv3.Cluster_EDS {
			edsClusters = append(edsClusters, c.Name)
		}
	}
	sort.Strings(edsClusters)
	if len(edsClusters) > 0 {
		s.subscribed[v3.EndpointType] = edsClusters
		for _, cla := range decode[*endpointv3.ClusterLoadAssignment](t, s.request(t, v3.EndpointType, edsClusters)) {
			snap.endpoints[cla.ClusterName] = cla
		}
	}
	listeners := decode[*listenerv3.Listener](t, s.request(t, v3.ListenerType, nil))
	for _, l := range listeners {
		snap.listeners[l.Name] = l
	}
	routeNames := uniqueSorted(xdstest.ExtractRoutesFromListeners(listeners))
	if len(routeNames) > 0 {
		s.subscribed[v3.RouteType] = routeNames
		for _, r := range decode[*routev3.RouteConfiguration](t, s.request(t, v3.RouteType, routeNames)) {
			snap.routes[r.Name] = r
		}
	}
	return snap
}

func decode[T proto.Message](t *testing.T, resp *discovery.DiscoveryResponse) []T {
	t.Helper()
	out := make([]T, 0, len(resp.Resources))
	for _, r := range resp.Resources {
		m, err := r.UnmarshalNew()
		if err != nil {
			t.Fatalf("decode %s: %v", resp.TypeUrl, err)
		}
		out = append(out, m.(T))
	}
	return out
}

func uniqueSorted(in []string) []string {
	sort.Strings(in)
	out := in[:0]
	for i, s := range in {
		if i == 0 || s != in[i-1] {
			out = append(out, s)
		}
	}
	return out
}

// seConfig wraps the spec Build produced into the object the operator writes.
func seConfig(spec *apinetworkingv1.ServiceEntry) config.Config {
	return config.Config{
		Meta: config.Meta{
			GroupVersionKind: gvk.ServiceEntry,
			Name:             targetName,
			Namespace:        targetNamespace,
			// The labels the operator stamps: managed-by, its owner and its installation.
			Labels: map[string]string{"app.kubernetes.io/managed-by": "adaptive-lb", "adaptivelb.io/owner": targetName,
				"adaptivelb.io/install": "adaptive-lb-system.adaptive-lb.adaptivelb.io"},
		},
		Spec: spec,
	}
}

// build runs the operator's builder on the world and checks the result passes istiod's own
// validation (the webhook would reject it otherwise).
func build(t *testing.T, w world) (*apinetworkingv1.ServiceEntry, []istio.Endpoint) {
	t.Helper()
	spec, endpoints, err := istio.Build(w.input())
	if err != nil {
		t.Fatalf("istio.Build: %v", err)
	}
	warnings, err := validation.ValidateServiceEntry(seConfig(spec))
	if err != nil {
		t.Fatalf("istiod's validation rejects the ServiceEntry Build wrote: %v", err)
	}
	if warnings != nil {
		t.Errorf("istiod's validation warns about the ServiceEntry Build wrote: %v", warnings)
	}
	return spec, endpoints
}

// server starts istiod's discovery server on the world's Kubernetes objects and extra config.
func server(t *testing.T, w world, extra []config.Config, opts xds.FakeOptions) *xds.FakeDiscoveryServer {
	t.Helper()
	opts.KubernetesObjects = w.objects()
	opts.Configs = extra
	opts.ConfigString = gatewayConfig + "\n---\n" + opts.ConfigString
	return xds.NewFakeDiscoveryServer(t, opts)
}

// gatewayConfig gives the ingress gateway a listener, routing to the other Service (a gateway
// without a Gateway resource has no listeners at all).
const gatewayConfig = `
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: istio-system}
spec:
  hosts: ["*"]
  gateways: [ingress]
  http:
  - route:
    - destination: {host: web.other.svc.cluster.local, port: {number: 80}}
`

func applySE(t *testing.T, f *xds.FakeDiscoveryServer, spec *apinetworkingv1.ServiceEntry) {
	t.Helper()
	cfg := seConfig(spec)
	if existing := f.Store().Get(gvk.ServiceEntry, targetName, targetNamespace); existing != nil {
		cfg.ResourceVersion = existing.ResourceVersion
		if _, err := f.Store().Update(cfg); err != nil {
			t.Fatalf("update ServiceEntry: %v", err)
		}
	} else if _, err := f.Store().Create(cfg); err != nil {
		t.Fatalf("create ServiceEntry: %v", err)
	}
	want := map[string]uint32{}
	for _, ep := range spec.Endpoints {
		want[ep.Address] = ep.Weight
	}
	waitForServiceEntryEndpoints(t, f, want)
}

// waitForServiceEntryEndpoints waits until istiod's endpoint index holds exactly the
// ServiceEntry endpoints with these weights and the push context is rebuilt. The ServiceEntry
// registry updates the index asynchronously; the bound only guards against a hang.
func waitForServiceEntryEndpoints(t *testing.T, f *xds.FakeDiscoveryServer, want map[string]uint32) {
	t.Helper()
	retry.UntilOrFail(t, func() bool {
		got := map[string]uint32{}
		if shards, ok := f.Discovery.Env.EndpointIndex.ShardsForService(targetHost, targetNamespace); ok {
			shards.RLock()
			for key, eps := range shards.Shards {
				if key.Provider != provider.External {
					continue
				}
				for _, ep := range eps {
					for _, addr := range ep.Addresses {
						got[addr] = ep.LbWeight
					}
				}
			}
			shards.RUnlock()
		}
		return maps.Equal(got, want)
	}, retry.Timeout(responseTimeout), retry.Delay(10*time.Millisecond))
	f.EnsureSynced(t)
}

func deleteSE(t *testing.T, f *xds.FakeDiscoveryServer) {
	t.Helper()
	if err := f.Store().Delete(gvk.ServiceEntry, targetName, targetNamespace, nil); err != nil {
		t.Fatalf("delete ServiceEntry: %v", err)
	}
	waitForServiceEntryEndpoints(t, f, map[string]uint32{})
}

// diffs collects the differences one comparison finds, each naming the resource.
type diffs []string

func (d *diffs) add(format string, args ...any) { *d = append(*d, fmt.Sprintf(format, args...)) }

func compareResources[T proto.Message](d *diffs, kind string, without, with map[string]T) {
	for name, a := range without {
		b, ok := with[name]
		if !ok {
			d.add("%s %s disappears with the ServiceEntry", kind, name)
			continue
		}
		if !proto.Equal(a, b) {
			d.add("%s %s changes with the ServiceEntry (-without +with):\n%s", kind, name, cmp.Diff(a, b, protocmp.Transform()))
		}
	}
	for name := range with {
		if _, ok := without[name]; !ok {
			d.add("%s %s appears with the ServiceEntry:\n%s", kind, name, cmp.Diff(nil, with[name], protocmp.Transform()))
		}
	}
}

// isTargetCluster: an outbound cluster of the weighted Service's host (any port, any subset),
// or a waypoint's inbound cluster for it.
func isTargetCluster(name string) bool {
	return (strings.HasPrefix(name, "outbound|") || strings.HasPrefix(name, "inbound-vip|")) && strings.HasSuffix(name, "|"+targetHost)
}

const targetHost = targetName + "." + targetNamespace + ".svc." + clusterDomain
