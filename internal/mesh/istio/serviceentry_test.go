package istio

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func input(slices ...*discoveryv1.EndpointSlice) Input {
	return Input{
		Service: service(),
		Slices:  slices,
		Pods: map[string]*corev1.Pod{
			"web-a": pod("web-a", "10.0.0.1", "node-1"),
			"web-b": pod("web-b", "10.0.0.2", "node-2"),
			"web-c": pod("web-c", "10.0.0.3", "node-2"),
		},
		Nodes:         map[string]*corev1.Node{"node-1": node("node-1", "eu-west", "eu-west-1a"), "node-2": node("node-2", "eu-west", "eu-west-1b")},
		Weights:       map[string]uint32{"web-a": 250},
		DefaultWeight: 100,
		ClusterDomain: "cluster.local",
	}
}

func TestBuild_MirrorsTheServiceExactly(t *testing.T) {
	in := input(slice("web-1", discoveryv1.AddressTypeIPv4,
		endpoint("web-b", "10.0.0.2", "eu-west-1b"),
		endpoint("web-a", "10.0.0.1", "eu-west-1a"),
	))
	spec, eps, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &apinetworkingv1.ServiceEntry{
		Hosts:     []string{"web.shop.svc.cluster.local"},
		Addresses: []string{"10.96.0.10"},
		Ports: []*apinetworkingv1.ServicePort{
			{Number: 80, Name: "http-web", Protocol: "HTTP"},
			{Number: 9090, Name: "grpc", Protocol: "GRPC", TargetPort: 9091},
		},
		Location:   apinetworkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution: apinetworkingv1.ServiceEntry_STATIC,
		Endpoints: []*apinetworkingv1.WorkloadEntry{
			{
				Address:        "10.0.0.1",
				Ports:          map[string]uint32{"http-web": 8080, "grpc": 9091},
				Labels:         map[string]string{"app": "web", "version": "v1", TLSModeLabel: TLSModeIstio},
				ServiceAccount: "web-sa",
				Locality:       "eu-west/eu-west-1a/",
				Weight:         250,
			},
			{
				Address:        "10.0.0.2",
				Ports:          map[string]uint32{"http-web": 8080, "grpc": 9091},
				Labels:         map[string]string{"app": "web", "version": "v1", TLSModeLabel: TLSModeIstio},
				ServiceAccount: "web-sa",
				Locality:       "eu-west/eu-west-1b/",
				Weight:         100,
			},
		},
	}
	if !proto.Equal(spec, want) {
		t.Fatalf("spec mismatch:\n got  %v\n want %v", spec, want)
	}
	if len(eps) != 2 || eps[0].Pod != "web-a" || eps[0].Weight != 250 || eps[1].Zone != "eu-west-1b" {
		t.Fatalf("endpoints = %+v", eps)
	}
}

func TestBuild_DropsEndpointsThatMustGetNoNewTraffic(t *testing.T) {
	cases := map[string]struct {
		ep   discoveryv1.Endpoint
		kept bool
	}{
		"ready":                         {endpoint("web-a", "10.0.0.1", "z"), true},
		"not ready":                     {endpoint("web-a", "10.0.0.1", "z", notReady), false},
		"terminating but still serving": {endpoint("web-a", "10.0.0.1", "z", terminating), false},
		"not serving": {endpoint("web-a", "10.0.0.1", "z", func(e *discoveryv1.Endpoint) {
			e.Conditions.Serving = ptr.To(false)
		}), false},
		"conditions unset mean ready": {endpoint("web-a", "10.0.0.1", "z", func(e *discoveryv1.Endpoint) {
			e.Conditions = discoveryv1.EndpointConditions{}
		}), true},
		"no pod reference":  {endpoint("web-a", "10.0.0.1", "z", func(e *discoveryv1.Endpoint) { e.TargetRef = nil }), false},
		"pod not known yet": {endpoint("web-x", "10.0.0.9", "z"), false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			spec, _, err := Build(input(slice("s", discoveryv1.AddressTypeIPv4, tc.ep)))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(spec.Endpoints) == 1; got != tc.kept {
				t.Fatalf("kept = %v, want %v", got, tc.kept)
			}
		})
	}
	deleting := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
	deleting.Pods["web-a"].DeletionTimestamp = &metav1.Time{}
	if spec, _, _ := Build(deleting); len(spec.Endpoints) != 0 {
		t.Fatal("a pod being deleted must leave the ServiceEntry even before its slice says so")
	}
}

func TestBuild_SeveralSlicesDualStackAndStableOrder(t *testing.T) {
	v4a := slice("web-v4-a", discoveryv1.AddressTypeIPv4, endpoint("web-c", "10.0.0.3", "eu-west-1b"))
	v4b := slice("web-v4-b", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "eu-west-1a"), endpoint("web-b", "10.0.0.2", "eu-west-1b"))
	v6 := slice("web-v6", discoveryv1.AddressTypeIPv6, endpoint("web-a", "fd00::1", "eu-west-1a"))
	fqdn := slice("web-fqdn", discoveryv1.AddressTypeFQDN, endpoint("web-b", "web-b.example", "z"))
	first, _, err := Build(input(v4a, v6, fqdn, v4b))
	if err != nil {
		t.Fatal(err)
	}
	second, _, _ := Build(input(v4b, fqdn, v4a, v6))
	var addrs []string
	for _, e := range first.Endpoints {
		addrs = append(addrs, e.Address)
	}
	if got := strings.Join(addrs, ","); got != "10.0.0.1,10.0.0.2,10.0.0.3,fd00::1" {
		t.Fatalf("addresses %s", got)
	}
	det := proto.MarshalOptions{Deterministic: true}
	a, _ := det.Marshal(first)
	b, _ := det.Marshal(second)
	if string(a) != string(b) {
		t.Fatal("slice order changed the spec's bytes: every informer resync would cost a write")
	}
}

func TestBuild_NamedTargetPortsResolvePerSlice(t *testing.T) {
	// Two versions of the pod template name the same port differently: the slices carry each
	// version's number and each endpoint must keep its own.
	old := slice("web-old", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z"))
	newer := slice("web-new", discoveryv1.AddressTypeIPv4, endpoint("web-b", "10.0.0.2", "z"))
	newer.Ports[0].Port = ptr.To[int32](8081)
	spec, _, err := Build(input(old, newer))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Endpoints[0].Ports["http-web"] != 8080 || spec.Endpoints[1].Ports["http-web"] != 8081 {
		t.Fatalf("target ports %v / %v, want 8080 / 8081", spec.Endpoints[0].Ports, spec.Endpoints[1].Ports)
	}
}

func TestBuild_PortSelectionAndProtocols(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
	in.Ports = []int32{9090}
	spec, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Ports) != 1 || spec.Ports[0].Name != "grpc" || len(spec.Endpoints[0].Ports) != 1 {
		t.Fatalf("selected ports %v, endpoint ports %v", spec.Ports, spec.Endpoints[0].Ports)
	}
	in.Ports = []int32{443}
	if _, _, err := Build(in); !errors.Is(err, ErrNoPorts) {
		t.Fatalf("err = %v, want ErrNoPorts", err)
	}
	for _, tc := range []struct {
		port corev1.ServicePort
		want string
	}{
		{corev1.ServicePort{Name: "http"}, "HTTP"},
		{corev1.ServicePort{Name: "http2-api"}, "HTTP2"},
		{corev1.ServicePort{Name: "https"}, "HTTPS"},
		{corev1.ServicePort{Name: "tcp-db"}, "TCP"},
		// Names istiod does not know are sniffed: an empty ServiceEntry protocol, as on the Service.
		{corev1.ServicePort{Name: "web", Port: 80}, ""},
		{corev1.ServicePort{Name: "h2c-api", Port: 80}, ""},
		// ...except on the well-known ports istiod treats as TCP.
		{corev1.ServicePort{Name: "db", Port: 3306}, "TCP"},
		{corev1.ServicePort{Name: "grpc-web-ui"}, "GRPC-WEB"},
		{corev1.ServicePort{Name: "web", AppProtocol: ptr.To("http")}, "HTTP"},
		{corev1.ServicePort{Name: "api", AppProtocol: ptr.To("grpc")}, "GRPC"},
		{corev1.ServicePort{Name: "api", AppProtocol: ptr.To("kubernetes.io/h2c")}, "HTTP2"},
		{corev1.ServicePort{Name: "http-api", AppProtocol: ptr.To("example.com/custom")}, ""},
	} {
		if got := protocolOf(tc.port); got != tc.want {
			t.Errorf("protocol of %+v = %s, want %s", tc.port, got, tc.want)
		}
	}
}

func TestBuild_TLSModeFollowsThePodsLabel(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4,
		endpoint("web-a", "10.0.0.1", "eu-west-1a"),
		endpoint("web-b", "10.0.0.2", "eu-west-1b"),
	))
	// web-a has no sidecar: no tlsMode label. istiod gives a ServiceEntry endpoint with a
	// service account and no label the tlsMode istio, so the service account must go too.
	delete(in.Pods["web-a"].Labels, TLSModeLabel)
	in.Pods["web-a"].Annotations = nil
	in.Pods["web-a"].Spec.Containers = []corev1.Container{{Name: "app"}}
	spec, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := spec.Endpoints[0].Labels[TLSModeLabel]; ok || spec.Endpoints[0].ServiceAccount != "" {
		t.Fatalf("a pod without the tlsMode label got labels %v and service account %q; istiod would send it mTLS",
			spec.Endpoints[0].Labels, spec.Endpoints[0].ServiceAccount)
	}
	if spec.Endpoints[1].Labels[TLSModeLabel] != TLSModeIstio || spec.Endpoints[1].ServiceAccount != "web-sa" {
		t.Fatalf("an injected pod got labels %v and service account %q", spec.Endpoints[1].Labels, spec.Endpoints[1].ServiceAccount)
	}
}

func TestPodLocality(t *testing.T) {
	nodeWith := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	}
	podWith := func(labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	}
	full := nodeWith(map[string]string{RegionLabel: "r", ZoneLabel: "z", SubzoneLabel: "s"})
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		node *corev1.Node
		want string
	}{
		"region zone subzone": {podWith(nil), full, "r/z/s"},
		// istiod always writes three parts for a Kubernetes endpoint.
		"region zone":       {podWith(nil), nodeWith(map[string]string{RegionLabel: "r", ZoneLabel: "z"}), "r/z/"},
		"zone only":         {podWith(nil), nodeWith(map[string]string{ZoneLabel: "z"}), "/z/"},
		"no topology":       {podWith(nil), nodeWith(nil), ""},
		"no node":           {podWith(nil), nil, ""},
		"legacy node label": {podWith(nil), nodeWith(map[string]string{LegacyRegionLabel: "r", LegacyZoneLabel: "z"}), "r/z/"},
		"pod label wins":    {podWith(map[string]string{LocalityLabel: "a/b/c"}), full, "a/b/c"},
		"pod label dots":    {podWith(map[string]string{LegacyLocalityLabel: "a.b"}), full, "a/b"},
	} {
		if got := PodLocality(tc.pod, tc.node); got != tc.want {
			t.Errorf("%s: locality %q, want %q", name, got, tc.want)
		}
	}
}

func TestCheckSupported(t *testing.T) {
	cases := map[string]struct {
		svc  *corev1.Service
		want string
	}{
		"ExternalName": {service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), "is of type ExternalName"},
		"headless":     {service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), "is headless"},
		"no selector":  {service(func(s *corev1.Service) { s.Spec.Selector = nil }), "has no selector"},
		"no ClusterIP": {service(func(s *corev1.Service) { s.Spec.ClusterIP = "" }), "has no ClusterIP yet"},
		"unnamed single port": {service(func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}
		}), "port 80 has no name"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := input()
			in.Service = tc.svc
			_, _, err := Build(in)
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrUnsupported containing %q", err, tc.want)
			}
		})
	}
}

func TestBuild_ExportToNeverWiderThanTheService(t *testing.T) {
	for name, tc := range map[string]struct {
		annotation string
		requested  []string
		want       []string
		refused    bool
	}{
		"neither":                 {"", nil, nil, false},
		"spec only":               {"", []string{"."}, []string{"."}, false},
		"annotation only":         {".", nil, []string{"."}, false},
		"annotation all":          {"*", []string{"a"}, []string{"a"}, false},
		"spec all":                {"shop, istio-system", []string{"*"}, []string{"shop", "istio-system"}, false},
		"both: intersection":      {"shop,istio-system", []string{".", "other"}, []string{"."}, false},
		"both: nothing in common": {".", []string{"other"}, nil, true},
		"annotation none":         {"~", nil, nil, true},
		"annotation none, spec":   {"~", []string{"."}, nil, true},
		"spec none":               {"", []string{"~"}, nil, true},
		"spec none and a ns":      {"", []string{"~", "shop"}, []string{"shop"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
			if tc.annotation != "" {
				in.Service.Annotations = map[string]string{ExportToAnnotation: tc.annotation}
			}
			in.ExportTo = tc.requested
			spec, _, err := Build(in)
			if tc.refused {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("err = %v, want ErrUnsupported", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(spec.ExportTo, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("exportTo %v, want %v", spec.ExportTo, tc.want)
			}
		})
	}
}
