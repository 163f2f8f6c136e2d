package istiod

import (
	"fmt"
	"strings"
	"testing"

	networkingclient "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The mesh every case runs in: the weighted Service shop/api, another Service other/web that
// must stay untouched, and client pods in another namespace and in shop.
const (
	targetNamespace = "shop"
	targetName      = "api"
	otherNamespace  = "other"
	clientNamespace = "client"
	clusterDomain   = "cluster.local"
)

// sidecarKind is how a pod is meshed.
type sidecarKind int

const (
	noSidecar sidecarKind = iota
	// classicSidecar: what Istio's injector writes, an istio-proxy container plus the
	// security.istio.io/tlsMode label and the status annotation.
	classicSidecar
	// nativeSidecar: the injector's native-sidecar form, istio-proxy as a restartable init container.
	nativeSidecar
)

// podSpec describes one pod of the weighted Service.
type podSpec struct {
	name    string
	ip      string
	ipv6    string
	node    string
	sidecar sidecarKind
	labels  map[string]string
	// containerPorts names the container's ports, so a named targetPort resolves per pod.
	containerPorts map[string]int32
	weight         uint32
	// ambient: the pod is enrolled in ambient mode (istio-cni's redirection annotation), with
	// no sidecar.
	ambient bool
}

// world is the Kubernetes side of one case.
type world struct {
	service *corev1.Service
	pods    []podSpec
	nodes   map[string]map[string]string
	// exportTo is the AdaptiveLoadBalancer's spec.exportTo.
	exportTo []string
	// namespaceLabels label the Service's namespace (istio.io/dataplane-mode, istio.io/use-waypoint).
	namespaceLabels map[string]string
	// mesh and others are the facts the operator gathers (istio.Input.Mesh and .Others).
	mesh   istio.Mesh
	others []istio.OtherServiceEntry
}

func defaultNodes() map[string]map[string]string {
	return map[string]map[string]string{
		"node-a": {istio.RegionLabel: "eu-west", istio.ZoneLabel: "eu-west-a", istio.SubzoneLabel: "rack-1"},
		"node-b": {istio.RegionLabel: "eu-west", istio.ZoneLabel: "eu-west-b", istio.SubzoneLabel: "rack-2"},
	}
}

func httpService(ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: targetName, Namespace: targetNamespace},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Selector:   map[string]string{"app": targetName},
			Ports:      ports,
		},
	}
}

func port(name string, number int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: number, TargetPort: target, Protocol: corev1.ProtocolTCP}
}

// threePods is the default: two pods on node-a and one on node-b, all with a sidecar, two
// versions for DestinationRule subsets, distinct weights so every copy is recognisable.
func threePods(kind sidecarKind) []podSpec {
	return []podSpec{
		{name: "api-5c9d-a1", ip: "10.1.0.1", node: "node-a", sidecar: kind, labels: map[string]string{"version": "v1"}, weight: 11},
		{name: "api-5c9d-b2", ip: "10.1.0.2", node: "node-a", sidecar: kind, labels: map[string]string{"version": "v1"}, weight: 22},
		{name: "api-5c9d-c3", ip: "10.1.0.3", node: "node-b", sidecar: kind, labels: map[string]string{"version": "v2"}, weight: 33},
	}
}

func (p podSpec) pod() *corev1.Pod {
	labels := map[string]string{"app": targetName, "pod-template-hash": "5c9d"}
	for k, v := range p.labels {
		labels[k] = v
	}
	controller := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:         p.name,
			Namespace:    targetNamespace,
			GenerateName: "api-5c9d-",
			Labels:       labels,
			Annotations:  map[string]string{},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "api-5c9d", UID: "rs-uid", Controller: &controller,
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:           p.node,
			ServiceAccountName: "api-sa",
			Containers:         []corev1.Container{{Name: "app", Image: "app"}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      p.ip,
			PodIPs:     []corev1.PodIP{{IP: p.ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	if p.ipv6 != "" {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: p.ipv6})
	}
	for name, number := range p.containerPorts {
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: name, ContainerPort: number, Protocol: corev1.ProtocolTCP})
	}
	always := corev1.ContainerRestartPolicyAlways
	if p.ambient {
		pod.Annotations[istio.AmbientRedirectionAnnotation] = istio.AmbientRedirectionEnabled
	}
	switch p.sidecar {
	case classicSidecar:
		markInjected(&pod.ObjectMeta)
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: istio.SidecarContainer, Image: "proxyv2"})
	case nativeSidecar:
		markInjected(&pod.ObjectMeta)
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: istio.SidecarContainer, Image: "proxyv2", RestartPolicy: &always})
	}
	return pod
}

// markInjected writes what Istio's injector adds to a pod's metadata.
func markInjected(meta *metav1.ObjectMeta) {
	meta.Labels[istio.TLSModeLabel] = istio.TLSModeIstio
	meta.Labels["service.istio.io/canonical-name"] = meta.Labels["app"]
	meta.Annotations[istio.SidecarStatusAnnotation] = `{"containers":["istio-proxy"]}`
}

// targetPort resolves a Service port's target on one pod, as the EndpointSlice controller does.
func (p podSpec) targetPort(sp corev1.ServicePort) (int32, bool) {
	if sp.TargetPort.Type == intstr.String {
		n, ok := p.containerPorts[sp.TargetPort.StrVal]
		return n, ok
	}
	if sp.TargetPort.IntVal == 0 {
		return sp.Port, true
	}
	return sp.TargetPort.IntVal, true
}

// slices writes the EndpointSlices the EndpointSlice controller would: one per address family
// and per distinct set of resolved target ports.
func (w world) slices() []*discoveryv1.EndpointSlice {
	type key struct {
		family discoveryv1.AddressType
		ports  string
	}
	var order []key
	byKey := map[key]*discoveryv1.EndpointSlice{}
	families := []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4}
	for _, p := range w.pods {
		if p.ipv6 != "" {
			families = append(families, discoveryv1.AddressTypeIPv6)
			break
		}
	}
	for _, family := range families {
		for _, p := range w.pods {
			addr := p.ip
			if family == discoveryv1.AddressTypeIPv6 {
				addr = p.ipv6
			}
			if addr == "" {
				continue
			}
			var ports []discoveryv1.EndpointPort
			var sig []string
			for _, sp := range w.service.Spec.Ports {
				n, ok := p.targetPort(sp)
				if !ok {
					continue
				}
				name, number, proto := sp.Name, n, sp.Protocol
				ports = append(ports, discoveryv1.EndpointPort{Name: &name, Port: &number, Protocol: &proto, AppProtocol: sp.AppProtocol})
				sig = append(sig, fmt.Sprintf("%s=%d", sp.Name, n))
			}
			k := key{family, strings.Join(sig, ",")}
			slice, ok := byKey[k]
			if !ok {
				slice = &discoveryv1.EndpointSlice{
					ObjectMeta: metav1.ObjectMeta{
						Name:      fmt.Sprintf("%s-%d", targetName, len(order)),
						Namespace: targetNamespace,
						Labels:    map[string]string{discoveryv1.LabelServiceName: targetName, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
					},
					AddressType: family,
					Ports:       ports,
				}
				byKey[k] = slice
				order = append(order, k)
			}
			ready, serving, terminating := true, true, false
			node := p.node
			ep := discoveryv1.Endpoint{
				Addresses:  []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: targetNamespace, Name: p.name},
				NodeName:   &node,
			}
			if zone := w.nodes[p.node][istio.ZoneLabel]; zone != "" {
				ep.Zone = &zone
			}
			slice.Endpoints = append(slice.Endpoints, ep)
		}
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(order))
	for _, k := range order {
		out = append(out, byKey[k])
	}
	return out
}

// objects is everything the Kubernetes registry of the discovery server starts with.
func (w world) objects() []runtime.Object {
	var out []runtime.Object
	out = append(out, w.namespaces()...)
	for name, labels := range w.nodes {
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	}
	out = append(out, w.service)
	for _, p := range w.pods {
		out = append(out, p.pod())
	}
	for _, s := range w.slices() {
		out = append(out, s)
	}
	out = append(out, otherObjects()...)
	return out
}

// namespaces are the mesh's namespaces, with the world's labels on the Service's.
func (w world) namespaces() []runtime.Object {
	var out []runtime.Object
	for _, ns := range []string{targetNamespace, otherNamespace, clientNamespace, "istio-system"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns == targetNamespace {
			n.Labels = w.namespaceLabels
		}
		out = append(out, n)
	}
	return out
}

// namespace is the Service's namespace as the operator reads it.
func (w world) namespace() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: targetNamespace, Labels: w.namespaceLabels}}
}

// otherObjects: the Service other/web with one pod, and the client pods.
func otherObjects() []runtime.Object {
	web := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: otherNamespace},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				port("http", 80, intstr.FromInt32(8080)),
				port("tcp-db", 5432, intstr.FromInt32(5432)),
			},
		},
	}
	webPod := meshedPod(otherNamespace, "web-0", "10.2.0.1", "node-a", "web")
	name80, name5432 := "http", "tcp-db"
	p80, p5432 := int32(8080), int32(5432)
	tcp := corev1.ProtocolTCP
	ready := true
	webSlice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: otherNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name80, Port: &p80, Protocol: &tcp}, {Name: &name5432, Port: &p5432, Protocol: &tcp}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.2.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: otherNamespace, Name: "web-0"},
		}},
	}
	return []runtime.Object{
		web, webPod, webSlice,
		meshedPod(clientNamespace, "client-0", "10.3.0.1", "node-b", "client"),
		meshedPod(targetNamespace, "neighbour-0", "10.1.9.1", "node-b", "neighbour"),
	}
}

func meshedPod(namespace, name, ip, node, app string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": app}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: app,
			Containers: []corev1.Container{{Name: "app"}, {Name: istio.SidecarContainer}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	markInjected(&pod.ObjectMeta)
	return pod
}

// input is what the reconciler hands istio.Build for this world.
func (w world) input() istio.Input {
	in := istio.Input{
		Service:       w.service,
		Pods:          map[string]*corev1.Pod{},
		Nodes:         map[string]*corev1.Node{},
		Weights:       map[string]uint32{},
		DefaultWeight: 100,
		ClusterDomain: clusterDomain,
		ExportTo:      w.exportTo,
		Namespace:     w.namespace(),
		Mesh:          w.mesh,
		Others:        w.others,
	}
	in.Slices = w.slices()
	for _, p := range w.pods {
		in.Pods[p.name] = p.pod()
		if p.weight > 0 {
			in.Weights[p.name] = p.weight
		}
	}
	for name, labels := range w.nodes {
		in.Nodes[name] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	return in
}

// otherServiceEntries are the ServiceEntries of Istio YAML, as the operator's cache sees other
// owners' ones.
func otherServiceEntries(t *testing.T, yamlText string) []istio.OtherServiceEntry {
	t.Helper()
	var out []istio.OtherServiceEntry
	for _, doc := range strings.Split(yamlText, "\n---\n") {
		var se networkingclient.ServiceEntry
		if err := yaml.Unmarshal([]byte(doc), &se); err != nil {
			t.Fatalf("parse %q: %v", doc, err)
		}
		if se.Kind != "ServiceEntry" {
			continue
		}
		out = append(out, istio.OtherServiceEntry{Namespace: se.Namespace, Name: se.Name, Hosts: se.Spec.Hosts, ExportTo: se.Spec.ExportTo})
	}
	return out
}
