package istiod

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/mesh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// shape is one named case of the matrix: a Service with its pods and nodes, Istio config around
// it, and the mesh config.
type shape struct {
	name  string
	world world
	// config is Istio YAML (DestinationRule, PeerAuthentication, Sidecar...) present from the start.
	config string
	mesh   func(*meshconfig.MeshConfig)
	// unsupported, when set, is what Build's ErrUnsupported must say: no ServiceEntry is written.
	unsupported string
	// refused, when set, is the error Build must refuse the shape with (saying unsupported).
	refused error
}

func defaultWorld(ports ...corev1.ServicePort) world {
	return world{service: httpService(ports...), pods: threePods(classicSidecar), nodes: defaultNodes()}
}

func shapes() []shape {
	httpPort := port("http-web", 80, intstr.FromInt32(8080))
	strPtr := func(s string) *string { return &s }

	mixed := defaultWorld(httpPort)
	mixed.pods[1].sidecar = noSidecar
	mixed.pods[2].sidecar = nativeSidecar

	namedTargets := defaultWorld(port("http-web", 80, intstr.FromString("web")))
	namedTargets.pods[0].containerPorts = map[string]int32{"web": 8080}
	namedTargets.pods[1].containerPorts = map[string]int32{"web": 8080}
	namedTargets.pods[2].containerPorts = map[string]int32{"web": 9090}

	dualStack := dualStackWorld()

	withNodes := func(nodes map[string]map[string]string) world {
		w := defaultWorld(httpPort)
		w.nodes = nodes
		return w
	}
	appProtocol := port("web", 80, intstr.FromInt32(8080))
	appProtocol.AppProtocol = strPtr("http")
	noSidecars := defaultWorld(httpPort)
	noSidecars.pods = threePods(noSidecar)
	natives := defaultWorld(httpPort)
	natives.pods = threePods(nativeSidecar)

	exportSpec := defaultWorld(httpPort)
	exportSpec.exportTo = []string{"."}
	exportAnnotation := defaultWorld(httpPort)
	exportAnnotation.service.Annotations = map[string]string{"networking.istio.io/exportTo": "."}
	exportBoth := defaultWorld(httpPort)
	exportBoth.service.Annotations = map[string]string{"networking.istio.io/exportTo": "shop,istio-system"}
	exportBoth.exportTo = []string{"*"}
	// The mesh's defaultServiceExportTo hides a Service without an exportTo annotation; the
	// AdaptiveLoadBalancer asks for every namespace.
	exportMeshDefault := defaultWorld(httpPort)
	exportMeshDefault.exportTo = []string{"*"}

	return []shape{
		{name: "port-http", world: defaultWorld(httpPort)},
		{name: "port-grpc", world: defaultWorld(port("grpc-api", 9000, intstr.FromInt32(9000)))},
		{name: "port-tcp", world: defaultWorld(port("tcp-db", 5432, intstr.FromInt32(5432)))},
		// istiod matches endpoints to a Service port by name: a ServiceEntry port needs one, and
		// a named copy of an unnamed port would hold endpoints the cluster never selects.
		{name: "port-unnamed-single", world: defaultWorld(port("", 80, intstr.FromInt32(8080))), unsupported: "has no name"},
		{name: "port-name-without-protocol", world: defaultWorld(port("web", 80, intstr.FromInt32(8080)))},
		{name: "port-appProtocol", world: defaultWorld(appProtocol)},
		{name: "multi-port", world: defaultWorld(httpPort, port("grpc-api", 9000, intstr.FromInt32(9000)), port("tcp-db", 5432, intstr.FromInt32(5432)))},
		{name: "named-target-ports-differ", world: namedTargets},
		{name: "dual-stack", world: dualStack},
		{name: "pods-without-sidecar", world: noSidecars},
		{name: "pods-native-sidecar", world: natives},
		{name: "pods-mixed-sidecars", world: mixed},
		{name: "nodes-region-zone-subzone", world: defaultWorld(httpPort)},
		{name: "nodes-region-zone", world: withNodes(map[string]map[string]string{
			"node-a": {istio.RegionLabel: "eu-west", istio.ZoneLabel: "eu-west-a"},
			"node-b": {istio.RegionLabel: "eu-west", istio.ZoneLabel: "eu-west-b"},
		})},
		{name: "nodes-zone-only", world: withNodes(map[string]map[string]string{
			"node-a": {istio.ZoneLabel: "eu-west-a"},
			"node-b": {istio.ZoneLabel: "eu-west-b"},
		})},
		{name: "nodes-no-topology", world: withNodes(map[string]map[string]string{"node-a": {}, "node-b": {}})},
		{name: "destinationrule-subsets", world: defaultWorld(httpPort), config: `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: shop}
spec:
  host: api.shop.svc.cluster.local
  subsets:
  - name: v1
    labels: {version: v1}
  - name: v2
    labels: {version: v2}
`},
		{name: "locality-failover", world: defaultWorld(httpPort), config: `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: shop}
spec:
  host: api.shop.svc.cluster.local
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}
    loadBalancer:
      localityLbSetting:
        enabled: true
        failover:
        - {from: eu-west, to: us-east}
`},
		{name: "locality-distribute", world: defaultWorld(httpPort), config: `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: api, namespace: shop}
spec:
  host: api.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        enabled: true
        distribute:
        - from: eu-west/*
          to: {"eu-west/eu-west-a/*": 70, "eu-west/eu-west-b/*": 30}
`},
		{name: "peerauthentication-strict", world: defaultWorld(httpPort), config: `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
`},
		{name: "peerauthentication-permissive-mixed-sidecars", world: mixed, config: `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: PERMISSIVE}
`},
		{name: "outbound-registry-only", world: defaultWorld(httpPort, port("tcp-db", 5432, intstr.FromInt32(5432))), mesh: func(m *meshconfig.MeshConfig) {
			m.OutboundTrafficPolicy = &meshconfig.MeshConfig_OutboundTrafficPolicy{Mode: meshconfig.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY}
		}},
		{name: "sidecar-scoping-egress", world: defaultWorld(httpPort), config: `
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: client}
spec:
  egress:
  - hosts: ["./*", "other/*"]
`},
		{name: "exportTo-spec", world: exportSpec},
		{name: "exportTo-service-annotation", world: exportAnnotation},
		{name: "exportTo-annotation-and-spec", world: exportBoth},
		{name: "mesh-defaultServiceExportTo", world: exportMeshDefault, mesh: func(m *meshconfig.MeshConfig) {
			m.DefaultServiceExportTo = []string{"."}
		}},
		// istiod lists the other owner's copies first: the operator refuses (Conflict) rather
		// than claim weights it cannot apply. TestForeignServiceEntryComesFirst shows why.
		{name: "foreign-serviceentry", world: defaultWorld(httpPort), config: foreignServiceEntry, refused: istio.ErrConflict, unsupported: "ServiceEntry shop/api-weights also declares host api.shop.svc.cluster.local"},
	}
}

// foreignServiceEntry is another owner's ServiceEntry for the weighted Service's host (the
// published operator's, during a migration): the same pod IPs, weight 1, no locality.
const foreignServiceEntry = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api-weights, namespace: shop}
spec:
  hosts: [api.shop.svc.cluster.local]
  addresses: [10.96.0.10]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 80, name: http-web, protocol: HTTP}
  endpoints:
  - {address: 10.1.0.1, ports: {http-web: 8080}, labels: {app: api}, weight: 1}
  - {address: 10.1.0.2, ports: {http-web: 8080}, labels: {app: api}, weight: 1}
  - {address: 10.1.0.3, ports: {http-web: 8080}, labels: {app: api}, weight: 1}
`

// dualStackWorld: a dual-stack Service (IPv4 first) whose pods have an IPv4 and an IPv6 address.
func dualStackWorld() world {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
	w.service.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:10:96::a"}
	w.service.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	policy := corev1.IPFamilyPolicyRequireDualStack
	w.service.Spec.IPFamilyPolicy = &policy
	for i := range w.pods {
		w.pods[i].ipv6 = fmt.Sprintf("fd00:10:1::%d", i+1)
	}
	return w
}

func meshConfig(s shape) *meshconfig.MeshConfig {
	m := mesh.DefaultMeshConfig()
	if s.mesh != nil {
		s.mesh(m)
	}
	return m
}

// TestServiceEntryChangesOnlyWeights is the differential invariant of docs/istio.md: for every
// shape and every client proxy, the config istiod sends with the operator's ServiceEntry equals
// the config without it, except the weight of the host Envoy keeps for each address.
func TestServiceEntryChangesOnlyWeights(t *testing.T) {
	for _, s := range shapes() {
		t.Run(s.name, func(t *testing.T) { runShape(t, s) })
	}
}

// runShape checks the differential invariant on one shape. The operator's builder gets the facts
// istiod runs with: the mesh config's defaultServiceExportTo, and the other ServiceEntries of
// the shape's config.
func runShape(t *testing.T, s shape) {
	{
		{
			s.world.mesh.DefaultServiceExportTo = meshConfig(s).DefaultServiceExportTo
			s.world.others = otherServiceEntries(t, s.config)
			if s.unsupported != "" || s.refused != nil {
				want := s.refused
				if want == nil {
					want = istio.ErrUnsupported
				}
				_, _, err := istio.Build(s.world.input())
				if !errors.Is(err, want) || !strings.Contains(err.Error(), s.unsupported) {
					t.Fatalf("Build: err = %v, want %v saying %q", err, want, s.unsupported)
				}
				return
			}
			spec, endpoints := build(t, s.world)
			wantWeight := map[string]uint32{}
			for _, ep := range endpoints {
				wantWeight[ep.IP] = ep.Weight
			}
			f := server(t, s.world, nil, xds.FakeOptions{ConfigString: s.config, MeshConfig: meshConfig(s)})
			cs := clients(s.world)
			before := make([]snapshot, len(cs))
			for i, c := range cs {
				before[i] = fetch(t, f, c)
			}
			applySE(t, f, spec)
			for i, c := range cs {
				after := fetch(t, f, c)
				checkInvariant(t, c.name, before[i], after, wantWeight)
			}
		}
	}
}

func checkInvariant(t *testing.T, proxy string, without, with snapshot, wantWeight map[string]uint32) {
	t.Helper()
	var d diffs
	compareResources(&d, "CDS", without.clusters, with.clusters)
	compareResources(&d, "LDS", without.listeners, with.listeners)
	compareResources(&d, "RDS", without.routes, with.routes)
	compareEndpoints(&d, without.endpoints, with.endpoints, wantWeight, func(cluster string) bool {
		return with.clusters[cluster].GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil
	})
	if len(d) > 0 {
		t.Errorf("proxy %s: %d differences:\n%s", proxy, len(d), strings.Join(d, "\n"))
	}
}
