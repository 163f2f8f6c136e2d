// Package istio builds the ServiceEntry that mirrors a Service's ready endpoints with weights.
//
// It is the only place that knows how an endpoint must look for Istio. istiod merges a
// ServiceEntry's endpoints with the Kubernetes endpoints of the same host, and Envoy keeps the
// first copy of an address across the whole ClusterLoadAssignment, which is the ServiceEntry's:
// so that copy must be what istiod makes of the pod's Kubernetes endpoint (labels for
// DestinationRule subsets, tlsMode, locality, port names and target ports), plus the weight, and
// the ServiceEntry must merge into the Service without adding listeners or routes of its own
// (the Service's address, its ports' protocols, its visibility). The differential tests in
// test/istiod check this against istiod itself; see docs/istio.md.
//
// The package is pure: objects in, desired spec out.
package istio

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	apinetworkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Labels and annotations Istio reads.
const (
	// TLSModeLabel tells client sidecars that the endpoint has a sidecar and accepts Istio mTLS.
	TLSModeLabel = "security.istio.io/tlsMode"
	// TLSModeIstio is TLSModeLabel's value for pods with a sidecar.
	TLSModeIstio = "istio"
	// SidecarStatusAnnotation is set by Istio's injector on every injected pod.
	SidecarStatusAnnotation = "sidecar.istio.io/status"
	// SidecarContainer is the name of Istio's proxy container.
	SidecarContainer = "istio-proxy"
	// RegionLabel and ZoneLabel are the well-known node topology labels; SubzoneLabel is Istio's.
	RegionLabel  = "topology.kubernetes.io/region"
	ZoneLabel    = "topology.kubernetes.io/zone"
	SubzoneLabel = "topology.istio.io/subzone"
	// LegacyRegionLabel and LegacyZoneLabel are the deprecated node labels istiod still reads
	// when the well-known ones are absent.
	LegacyRegionLabel = "failure-domain.beta.kubernetes.io/region"
	LegacyZoneLabel   = "failure-domain.beta.kubernetes.io/zone"
	// LocalityLabel on a pod overrides the locality istiod derives from its node; the legacy
	// label istio-locality is read when it is absent. Either may use "." for "/".
	LocalityLabel       = "topology.istio.io/locality"
	LegacyLocalityLabel = "istio-locality"
	// ExportToAnnotation on a Service limits the namespaces istiod exports it to.
	ExportToAnnotation = "networking.istio.io/exportTo"
)

// ErrUnsupported marks Services the mirror cannot represent.
var ErrUnsupported = errors.New("unsupported service")

// ErrNoPorts marks a selection of ports that matches none of the Service's TCP ports.
var ErrNoPorts = errors.New("no usable ports")

// Input is everything the desired ServiceEntry depends on.
type Input struct {
	Service *corev1.Service
	// Slices are the Service's EndpointSlices (label kubernetes.io/service-name).
	Slices []*discoveryv1.EndpointSlice
	// Pods are the pods the slices point at, by name (same namespace).
	Pods map[string]*corev1.Pod
	// Nodes are the nodes those pods run on, by name; only their topology labels are read.
	Nodes map[string]*corev1.Node
	// Weights are the endpoint weights by pod name; pods without one get DefaultWeight.
	Weights       map[string]uint32
	DefaultWeight uint32
	// ClusterDomain is the cluster's DNS domain, usually cluster.local.
	ClusterDomain string
	// Ports selects Service ports by number; empty selects all.
	Ports    []int32
	ExportTo []string
	// MaxEndpoints refuses a Service with more endpoints (ErrTooLarge); 0 is MaxEndpoints. The
	// size of each slice is checked when the slices are planned (CheckSliceSize).
	MaxEndpoints int
	// Namespace is the Service's namespace (its ambient and waypoint labels); nil if unknown.
	Namespace *corev1.Namespace
	// Mesh is what the operator knows of the mesh (see Mesh).
	Mesh Mesh
	// Others are other owners' ServiceEntries that declare the Service's host (ErrConflict).
	Others []OtherServiceEntry
}

// Endpoint is one mirrored endpoint, as the status reports it.
type Endpoint struct {
	Pod    string
	IP     string
	Zone   string
	Weight uint32
}

// Host returns the Service's FQDN, the ServiceEntry host that merges with the Service.
func Host(svc *corev1.Service, clusterDomain string) string {
	return fmt.Sprintf("%s.%s.svc.%s", svc.Name, svc.Namespace, clusterDomain)
}

// CheckSupported reports why a Service cannot be mirrored, or nil.
func CheckSupported(svc *corev1.Service) error {
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return fmt.Errorf("%w: service %s/%s is of type ExternalName; it has no endpoints to weight", ErrUnsupported, svc.Namespace, svc.Name)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return fmt.Errorf("%w: service %s/%s is headless; clients resolve pod IPs through DNS, not Envoy's balancer", ErrUnsupported, svc.Namespace, svc.Name)
	case svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0:
		return fmt.Errorf("%w: service %s/%s has no ClusterIP yet; the ServiceEntry must carry the Service's addresses, or istiod would route its ports for every destination to it", ErrUnsupported, svc.Namespace, svc.Name)
	case len(svc.Spec.Selector) == 0:
		return fmt.Errorf("%w: service %s/%s has no selector; its endpoints are managed by hand, so there are no pods to weight", ErrUnsupported, svc.Namespace, svc.Name)
	}
	return nil
}

// Build returns the desired ServiceEntry spec with every endpoint and the mirrored endpoints, in
// a stable order: the same input always yields a byte-identical spec, so an unchanged Service
// costs no write. The caller splits it into slices (PlanSlices, SliceSpec).
func Build(in Input) (*apinetworkingv1.ServiceEntry, []Endpoint, error) {
	svc := in.Service
	if err := CheckSupported(svc); err != nil {
		return nil, nil, err
	}
	if err := checkMultiCluster(in); err != nil {
		return nil, nil, err
	}
	if err := checkAmbient(in); err != nil {
		return nil, nil, err
	}
	ports, err := selectPorts(svc, in.Ports)
	if err != nil {
		return nil, nil, err
	}
	exportTo, err := exportTo(svc, in.ExportTo, in.Mesh)
	if err != nil {
		return nil, nil, err
	}
	if conflicts := Conflicts(svc, in.ClusterDomain, exportTo, in.Mesh, in.Others); len(conflicts) > 0 {
		return nil, nil, ConflictError(svc, in.ClusterDomain, conflicts)
	}
	wanted := make(map[string]bool, len(ports))
	for _, p := range ports {
		wanted[p.Name] = true
	}

	var entries []*apinetworkingv1.WorkloadEntry
	var endpoints []Endpoint
	seen := map[string]bool{}
	// The cache lists slices in no fixed order, and an address in two slices (a pod IP reused
	// while the old slice is not yet updated) keeps the first one's pod: decide by name, so the
	// same cluster state always gives the same ServiceEntry.
	slices := append([]*discoveryv1.EndpointSlice(nil), in.Slices...)
	sort.SliceStable(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	for _, slice := range slices {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		// Target ports can differ per slice (named target ports resolve per pod).
		targetPorts := map[string]uint32{}
		for _, p := range slice.Ports {
			if p.Name != nil && p.Port != nil && wanted[*p.Name] {
				targetPorts[*p.Name] = uint32(*p.Port)
			}
		}
		if len(targetPorts) == 0 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if !receivesTraffic(ep.Conditions) || ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
				continue
			}
			pod, ok := in.Pods[ep.TargetRef.Name]
			if !ok || pod.DeletionTimestamp != nil {
				// Without the pod we cannot copy its labels; a new endpoint waits for the pod event.
				continue
			}
			node := in.Nodes[pod.Spec.NodeName]
			zone := ""
			if ep.Zone != nil {
				zone = *ep.Zone
			} else if node != nil {
				zone = node.Labels[ZoneLabel]
			}
			weight := in.DefaultWeight
			if w, ok := in.Weights[pod.Name]; ok && w > 0 {
				weight = w
			}
			for _, addr := range ep.Addresses {
				if seen[addr] {
					continue
				}
				seen[addr] = true
				entries = append(entries, &apinetworkingv1.WorkloadEntry{
					Address:        addr,
					Ports:          copyPorts(targetPorts),
					Labels:         endpointLabels(pod),
					ServiceAccount: serviceAccount(pod),
					Locality:       PodLocality(pod, node),
					Network:        podNetwork(pod, in.Mesh),
					Weight:         weight,
				})
				endpoints = append(endpoints, Endpoint{Pod: pod.Name, IP: addr, Zone: zone, Weight: weight})
			}
		}
	}
	if LimitWeightSum(entries) {
		for i := range entries {
			endpoints[i].Weight = entries[i].Weight
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Address < entries[j].Address })
	sort.Slice(endpoints, func(i, j int) bool { return endpoints[i].IP < endpoints[j].IP })

	spec := &apinetworkingv1.ServiceEntry{
		Hosts: []string{Host(svc, in.ClusterDomain)},
		// The Service's own VIPs: without them istiod builds listeners for the ServiceEntry
		// alone (0.0.0.0:<port> for TCP, capturing every destination on that port) and drops
		// the ClusterIP from the Service's HTTP route.
		Addresses:  clusterIPs(svc),
		Ports:      ports,
		Location:   apinetworkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution: apinetworkingv1.ServiceEntry_STATIC,
		Endpoints:  entries,
		ExportTo:   exportTo,
	}
	if err := checkCount(spec, in.MaxEndpoints); err != nil {
		return nil, nil, fmt.Errorf("Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return spec, endpoints, nil
}

// clusterIPs are the ServiceEntry's addresses: the Service's primary ClusterIP only. With both
// families of a dual-stack Service, istiod (dual-stack support off, its default) puts the IPv6
// address in the route's domains in place of the IPv4 one.
func clusterIPs(svc *corev1.Service) []string {
	if svc.Spec.ClusterIP != "" {
		return []string{svc.Spec.ClusterIP}
	}
	if len(svc.Spec.ClusterIPs) > 0 {
		return []string{svc.Spec.ClusterIPs[0]}
	}
	return nil
}

// receivesTraffic applies the EndpointSlice conditions: an endpoint that is not ready, not
// serving, or terminating must get no new connections. A nil ready or serving means ready.
func receivesTraffic(c discoveryv1.EndpointConditions) bool {
	if c.Ready != nil && !*c.Ready {
		return false
	}
	if c.Serving != nil && !*c.Serving {
		return false
	}
	return c.Terminating == nil || !*c.Terminating
}

func selectPorts(svc *corev1.Service, numbers []int32) ([]*apinetworkingv1.ServicePort, error) {
	want := map[int32]bool{}
	for _, n := range numbers {
		want[n] = true
	}
	var out []*apinetworkingv1.ServicePort
	for _, p := range svc.Spec.Ports {
		if len(want) > 0 && !want[p.Port] {
			continue
		}
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			continue // Istio routes TCP-based protocols only
		}
		if p.Name == "" {
			if len(svc.Spec.Ports) > 1 {
				continue // Kubernetes requires names on multi-port Services; unreachable
			}
			return nil, fmt.Errorf("%w: service %s/%s port %d has no name; give it one (for example http-%d) so the ServiceEntry's port can match it", ErrUnsupported, svc.Namespace, svc.Name, p.Port, p.Port)
		}
		sp := &apinetworkingv1.ServicePort{Number: uint32(p.Port), Name: p.Name, Protocol: protocolOf(p)}
		if p.TargetPort.IntVal != 0 {
			sp.TargetPort = uint32(p.TargetPort.IntVal)
		}
		out = append(out, sp)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: service %s/%s has none of the selected TCP ports %v", ErrNoPorts, svc.Namespace, svc.Name, numbers)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	return out, nil
}

// protocolOf is the protocol istiod gives the Service's port, as a ServiceEntry port protocol:
// appProtocol first (with Kubernetes' standard kubernetes.io/ names), else the port name; the
// part before the first "-" names the protocol ("grpc-web" as a whole). A name istiod does not
// know leaves the protocol to sniffing, which on a ServiceEntry is an empty protocol, except on
// the well-known ports 25, 53, 3306 and 27017, which are TCP.
func protocolOf(p corev1.ServicePort) string {
	name := p.Name
	if p.AppProtocol != nil {
		name = *p.AppProtocol
		switch name {
		case "kubernetes.io/h2c":
			return "HTTP2"
		case "kubernetes.io/ws":
			return "HTTP"
		case "kubernetes.io/wss":
			return "HTTPS"
		}
	}
	if len(name) >= len("grpc-web") && strings.EqualFold(name[:len("grpc-web")], "grpc-web") {
		return "GRPC-WEB"
	}
	if i := strings.IndexByte(name, '-'); i >= 0 {
		name = name[:i]
	}
	switch prefix := strings.ToLower(name); prefix {
	case "tcp", "grpc", "http", "http2", "https", "tls", "mongo", "redis", "mysql":
		return strings.ToUpper(prefix)
	case "http_proxy":
		return "HTTP_PROXY"
	}
	switch p.Port {
	case 25, 53, 3306, 27017:
		return "TCP"
	}
	return ""
}

// endpointLabels are the pod's labels, which DestinationRule subsets select on.
func endpointLabels(pod *corev1.Pod) map[string]string {
	labels := make(map[string]string, len(pod.Labels))
	for k, v := range pod.Labels {
		labels[k] = v
	}
	return labels
}

// serviceAccount is the endpoint's service account, set only when the pod carries the tlsMode
// label. istiod reads a Kubernetes endpoint's tlsMode from that label alone (absent means
// plaintext), but a ServiceEntry endpoint without the label and with a service account gets
// tlsMode istio: the copy Envoy keeps would then send mTLS to a pod without a sidecar.
func serviceAccount(pod *corev1.Pod) string {
	if _, ok := pod.Labels[TLSModeLabel]; !ok {
		return ""
	}
	return pod.Spec.ServiceAccountName
}

// HasSidecar recognises an injected pod: the injector's status annotation, or an istio-proxy
// container (classic) or init container (native sidecar).
func HasSidecar(pod *corev1.Pod) bool {
	if _, ok := pod.Annotations[SidecarStatusAnnotation]; ok {
		return true
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == SidecarContainer {
			return true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == SidecarContainer {
			return true
		}
	}
	return false
}

// PodLocality is the locality istiod gives the pod's Kubernetes endpoint, so that both copies
// land in the same LocalityLbEndpoints: the pod's locality label, else region/zone/subzone of
// its node, always with three parts ("eu-west/eu-west-1a/" without a subzone), else none.
func PodLocality(pod *corev1.Pod, node *corev1.Node) string {
	label, ok := pod.Labels[LocalityLabel]
	if !ok {
		label = pod.Labels[LegacyLocalityLabel]
	}
	if label != "" {
		if strings.Contains(label, "/") {
			return label
		}
		return strings.ReplaceAll(label, ".", "/")
	}
	if node == nil {
		return ""
	}
	region := firstLabel(node.Labels, RegionLabel, LegacyRegionLabel)
	zone := firstLabel(node.Labels, ZoneLabel, LegacyZoneLabel)
	subzone := node.Labels[SubzoneLabel]
	if region == "" && zone == "" && subzone == "" {
		return ""
	}
	return region + "/" + zone + "/" + subzone
}

// podNetwork is the network istiod gives the pod's Kubernetes endpoint: the pod's
// topology.istio.io/network label, else the cluster's network. Without it the ServiceEntry's
// copy would belong to no network, which istiod treats as reachable from every network: a
// client in another network would get the pod's address instead of its network's gateway
// (test/istiod TestServiceEntryAcrossNetworks).
func podNetwork(pod *corev1.Pod, mesh Mesh) string {
	if n := pod.Labels[NetworkLabel]; n != "" {
		return n
	}
	return mesh.Network
}

// firstLabel returns the first non-empty value among keys.
func firstLabel(labels map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return ""
}

func copyPorts(m map[string]uint32) map[string]uint32 {
	out := make(map[string]uint32, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
