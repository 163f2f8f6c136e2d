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
		Hosts: []string{"web.shop.svc.cluster.local"},
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
				Locality:       "eu-west/eu-west-1a",
				Weight:         250,
			},
			{
				Address:        "10.0.0.2",
				Ports:          map[string]uint32{"http-web": 8080, "grpc": 9091},
				Labels:         map[string]string{"app": "web", "version": "v1", TLSModeLabel: TLSModeIstio},
				ServiceAccount: "web-sa",
				Locality:       "eu-west/eu-west-1b",
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
		{corev1.ServicePort{Name: "web"}, "TCP"},
		{corev1.ServicePort{Name: "web", AppProtocol: ptr.To("http")}, "HTTP"},
		{corev1.ServicePort{Name: "api", AppProtocol: ptr.To("grpc")}, "GRPC"},
		{corev1.ServicePort{Name: "api", AppProtocol: ptr.To("kubernetes.io/h2c")}, "TCP"},
	} {
		if got := protocolOf(tc.port); got != tc.want {
			t.Errorf("protocol of %+v = %s, want %s", tc.port, got, tc.want)
		}
	}
}

func TestBuild_SidecarAndLocalityDetails(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4,
		endpoint("web-a", "10.0.0.1", "eu-west-1a"),
		endpoint("web-b", "10.0.0.2", "", func(e *discoveryv1.Endpoint) { e.Zone = nil }),
	))
	// web-a has no sidecar at all; web-b is a native-sidecar pod without the annotation.
	in.Pods["web-a"].Annotations = nil
	in.Pods["web-a"].Spec.Containers = []corev1.Container{{Name: "app"}}
	in.Pods["web-b"].Annotations = nil
	in.Pods["web-b"].Spec.Containers = []corev1.Container{{Name: "app"}}
	in.Pods["web-b"].Spec.InitContainers = []corev1.Container{{Name: SidecarContainer}}
	in.Nodes["node-2"].Labels[SubzoneLabel] = "rack-7"
	spec, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := spec.Endpoints[0].Labels[TLSModeLabel]; ok {
		t.Fatal("a pod without a sidecar must not claim Istio mTLS")
	}
	if spec.Endpoints[1].Labels[TLSModeLabel] != TLSModeIstio {
		t.Fatal("a native-sidecar pod must carry the tlsMode label")
	}
	// No zone on the slice: the node's zone label is used, with Istio's subzone.
	if got := spec.Endpoints[1].Locality; got != "eu-west/eu-west-1b/rack-7" {
		t.Fatalf("locality %q", got)
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
