package istiod

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingclient "istio.io/client-go/pkg/apis/networking/v1"
	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pilot/pkg/model"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/test"
	"istio.io/istio/pkg/test/util/retry"
	"istio.io/istio/pkg/workloadapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// ambientWorld: the Service's namespace is in ambient mode and its pods are enrolled (istio-cni's
// annotation), without sidecars.
func ambientWorld() world {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
	w.namespaceLabels = map[string]string{istio.DataplaneModeLabel: "ambient"}
	w.mesh.IstioVersion = "1.31.1" // the in-process istiod's line
	for i := range w.pods {
		w.pods[i].sidecar = noSidecar
		w.pods[i].ambient = true
	}
	return w
}

// waypointObjects is a waypoint for the Service's namespace, as `istioctl waypoint apply`
// creates it (its Gateway, and the Service and pod the gateway controller derives from it),
// in the form istiod reads: the ambient index reads them from Kubernetes, the config store reads
// the Gateway.
const waypointObjects = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
status:
  addresses:
  - {type: Hostname, value: waypoint.shop.svc.cluster.local}
---
apiVersion: v1
kind: Service
metadata:
  name: waypoint
  namespace: shop
  labels:
    gateway.istio.io/managed: istio.io-mesh-controller
    gateway.networking.k8s.io/gateway-name: waypoint
spec:
  clusterIP: 10.96.0.99
  ports:
  - {name: mesh, port: 15008, appProtocol: hbone}
  selector:
    gateway.networking.k8s.io/gateway-name: waypoint
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-0
  namespace: shop
  labels:
    gateway.istio.io/managed: istio.io-mesh-controller
    gateway.networking.k8s.io/gateway-name: waypoint
spec:
  nodeName: node-b
  serviceAccountName: waypoint
status:
  phase: Running
  conditions:
  - {type: Ready, status: "True"}
  podIP: 10.1.8.1
  podIPs:
  - ip: 10.1.8.1
`

// waypointClient is the waypoint's own proxy.
var waypointClient = client{name: "waypoint", nodeType: model.Waypoint, ip: "10.1.8.1", pod: "waypoint-0", namespace: targetNamespace,
	labels: map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint", "gateway.istio.io/managed": "istio.io-mesh-controller"}}

// ambientServer starts istiod with ambient support on. Extra Kubernetes objects (the waypoint)
// go to both the Kubernetes registry and the config store, as in istiod's own waypoint tests.
func ambientServer(t *testing.T, w world, extra string) *xds.FakeDiscoveryServer {
	t.Helper()
	test.SetForTest(t, &features.EnableAmbient, true)
	return server(t, w, nil, xds.FakeOptions{KubernetesObjectString: extra, ConfigString: extra})
}

// applySEEverywhere writes the ServiceEntry where each part of istiod reads it: the config store
// (sidecars, gateways and waypoints) and the Kubernetes API (the ambient index behind ztunnel's
// workload discovery). A second, unrelated ServiceEntry written after it is the barrier: once
// the ambient index shows it, it has processed the first.
func applySEEverywhere(t *testing.T, f *xds.FakeDiscoveryServer, spec *apinetworkingv1.ServiceEntry) {
	t.Helper()
	applySE(t, f, spec)
	ses := f.KubeClient().Istio().NetworkingV1().ServiceEntries(targetNamespace)
	cfg := seConfig(spec)
	obj := &networkingclient.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace, Labels: cfg.Labels}}
	proto.Merge(&obj.Spec, spec)
	if _, err := ses.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceEntry in the Kubernetes API: %v", err)
	}
	barrier := &networkingclient.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "barrier", Namespace: targetNamespace}}
	barrier.Spec.Hosts = []string{barrierHost}
	barrier.Spec.Addresses = []string{"240.240.0.1"}
	barrier.Spec.Ports = []*apinetworkingv1.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}
	barrier.Spec.Resolution = apinetworkingv1.ServiceEntry_STATIC
	if _, err := ses.Create(context.Background(), barrier, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the barrier ServiceEntry: %v", err)
	}
	retry.UntilOrFail(t, func() bool {
		return slices.ContainsFunc(f.AmbientIndex.All(), func(a model.AddressInfo) bool {
			return a.GetService().GetHostname() == barrierHost
		})
	}, retry.Timeout(responseTimeout), retry.Delay(10*time.Millisecond))
	f.EnsureSynced(t)
}

const barrierHost = "barrier.example.com"

// ztunnelAddresses is ztunnel's workload discovery (WDS): every address istiod sends a ztunnel
// on node-a that subscribes to all of them, by resource name. The barrier is left out.
func ztunnelAddresses(t *testing.T, f *xds.FakeDiscoveryServer) map[string]*workloadapi.Address {
	t.Helper()
	ads := f.ConnectDeltaADS().WithType(v3.AddressType).WithTimeout(responseTimeout).
		WithID("ztunnel~10.0.0.1~ztunnel-a.istio-system~istio-system.svc.cluster.local").
		WithMetadata(model.NodeMetadata{NodeName: "node-a", Namespace: "istio-system", ClusterID: "Kubernetes", IstioVersion: "1.31.0"})
	defer ads.Cleanup()
	resp := ads.RequestResponseAck(&discovery.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{"*"}})
	out := map[string]*workloadapi.Address{}
	for _, r := range resp.Resources {
		addr := &workloadapi.Address{}
		if err := r.Resource.UnmarshalTo(addr); err != nil {
			t.Fatalf("decode WDS address %s: %v", r.Name, err)
		}
		if addr.GetService().GetHostname() == barrierHost {
			continue
		}
		out[r.Name] = addr
	}
	return out
}

// TestAmbientZtunnelIgnoresServiceEntry: in ambient mode, with the Service present, istiod
// leaves the operator's ServiceEntry out of ztunnel's workload discovery (since Istio 1.28.1
// and 1.29.0 a Kubernetes Service wins over a ServiceEntry of the same host): ztunnel receives
// exactly what it received without it. Sidecar and gateway clients of the same host still get
// the weights and nothing else changes for them (the differential invariant).
func TestAmbientZtunnelIgnoresServiceEntry(t *testing.T) {
	w := ambientWorld()
	f := ambientServer(t, w, "")
	cs := slices.DeleteFunc(clients(w), func(c client) bool { return c.name == "own-pod" }) // ambient pods run no sidecar
	before := make([]snapshot, len(cs))
	for i, c := range cs {
		before[i] = fetch(t, f, c)
	}
	wdsBefore := ztunnelAddresses(t, f)
	spec, endpoints := build(t, w)
	if e := istio.Enforce(w.input(), endpoints); e.Enforced || e.Reason != istio.NotEnforcedAmbientWithoutWaypoint {
		t.Errorf("the operator reports %+v; ztunnel clients are not weighted here, want AmbientWithoutWaypoint", e)
	}
	applySEEverywhere(t, f, spec)

	wdsAfter := ztunnelAddresses(t, f)
	if diff := cmp.Diff(wdsBefore, wdsAfter, protocmp.Transform()); diff != "" {
		t.Errorf("ztunnel's workload discovery changes with the ServiceEntry (-without +with):\n%s", diff)
	}
	wantWeight := map[string]uint32{}
	for _, ep := range endpoints {
		wantWeight[ep.IP] = ep.Weight
	}
	for i, c := range cs {
		checkInvariant(t, c.name, before[i], fetch(t, f, c), wantWeight)
	}
}

// TestAmbientServiceEntryOutlivingItsService records why a ServiceEntry must never outlive its
// Service in ambient mode: once the Service is gone, istiod serves ztunnel the ServiceEntry as
// the host's only service, and a second workload for every pod address, the ServiceEntry's, with
// no tunnel (plaintext) and no identity.
func TestAmbientServiceEntryOutlivingItsService(t *testing.T) {
	w := ambientWorld()
	f := ambientServer(t, w, "")
	spec, _ := build(t, w)
	applySEEverywhere(t, f, spec)
	if err := f.KubeClient().Kube().CoreV1().Services(targetNamespace).Delete(context.Background(), targetName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The bound only guards against a hang: istiod serves it within milliseconds.
	var addrs map[string]*workloadapi.Address
	var seWorkloads []*workloadapi.Workload
	var service *workloadapi.Service
	retry.UntilOrFail(t, func() bool {
		addrs = ztunnelAddresses(t, f)
		seWorkloads, service = nil, nil
		for _, a := range addrs {
			if a.GetService().GetHostname() == targetHost {
				service = a.GetService()
			}
			if wl := a.GetWorkload(); wl != nil && strings.Contains(wl.GetUid(), "ServiceEntry") {
				seWorkloads = append(seWorkloads, wl)
			}
		}
		return service != nil && len(seWorkloads) == len(w.pods)
	}, retry.Timeout(30*time.Second), retry.Delay(50*time.Millisecond))
	podAddresses := map[string]bool{}
	for _, a := range addrs {
		if wl := a.GetWorkload(); wl != nil && strings.Contains(wl.GetUid(), "/Pod/") {
			for _, ip := range wl.GetAddresses() {
				podAddresses[string(ip)] = true
			}
		}
	}
	for _, wl := range seWorkloads {
		if wl.GetTunnelProtocol() != workloadapi.TunnelProtocol_NONE || wl.GetServiceAccount() != "" {
			t.Errorf("the ServiceEntry's workload %s has tunnel %v and service account %q; the recorded harm (plaintext, no identity) no longer holds", wl.GetUid(), wl.GetTunnelProtocol(), wl.GetServiceAccount())
		}
		for _, ip := range wl.GetAddresses() {
			if !podAddresses[string(ip)] {
				t.Errorf("the ServiceEntry's workload %s has an address no pod workload has", wl.GetUid())
			}
		}
	}
	t.Logf("with the Service gone, ztunnel gets service %s/%s from the ServiceEntry and %d second workloads for the pods' addresses, e.g. %v", service.GetNamespace(), service.GetName(), len(seWorkloads), seWorkloads[0])
}

// TestAmbientWaypointUsesWeights: a waypoint bound to the Service (its istio.io/use-waypoint
// label) receives the ServiceEntry's copy of each pod first, weighted, with the same port,
// locality, tunnel and metadata as the Kubernetes copy: ztunnel clients, which reach the Service
// through the waypoint, are weighted. CDS, LDS and RDS of the waypoint do not change.
func TestAmbientWaypointUsesWeights(t *testing.T) {
	w := ambientWorld()
	w.service.Labels = map[string]string{istio.UseWaypointLabel: "waypoint"}
	f := ambientServer(t, w, waypointObjects)
	before := fetch(t, f, waypointClient)
	if !slices.ContainsFunc(keys(before.endpoints), isTargetCluster) {
		t.Fatalf("the waypoint has no EDS cluster for the Service; is it bound? clusters: %v", keys(before.clusters))
	}
	spec, endpoints := build(t, w)
	// istiod confirms the binding on the Service's status (its status writer does not run in
	// process): the operator reads the same condition.
	bound := w
	bound.service = w.service.DeepCopy()
	bound.service.Status.Conditions = []metav1.Condition{{Type: istio.WaypointBoundCondition, Status: metav1.ConditionTrue, Reason: "Accepted", Message: "bound to shop/waypoint"}}
	if e := istio.Enforce(bound.input(), endpoints); !e.Enforced || e.Reason != istio.EnforcedByWaypoint {
		t.Errorf("the operator reports %+v, want Waypoint", e)
	}
	applySEEverywhere(t, f, spec)
	wantWeight := map[string]uint32{}
	for _, ep := range endpoints {
		wantWeight[ep.IP] = ep.Weight
	}
	after := fetch(t, f, waypointClient)
	checkInvariant(t, waypointClient.name, before, after, wantWeight)
	for name, cla := range after.endpoints {
		if !isTargetCluster(name) {
			continue
		}
		_, weights := keptByEnvoy(cla)
		for key, got := range weights {
			if got == 1 {
				t.Errorf("waypoint cluster %s: host %s kept with weight 1, the Kubernetes copy's, not the operator's", name, key)
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
