package istio

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func service(opts ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: corev1.ServiceSpec{
			Selector:  map[string]string{"app": "web"},
			ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{
				{Name: "http-web", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9091), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func pod(name, ip, node string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app": "web", "version": "v1", TLSModeLabel: TLSModeIstio},
			Annotations: map[string]string{SidecarStatusAnnotation: "{}"}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "web-sa",
			Containers: []corev1.Container{{Name: "app"}, {Name: SidecarContainer}}},
		Status: corev1.PodStatus{PodIP: ip},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func node(name, region, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{RegionLabel: region, ZoneLabel: zone}}}
}

type epOpt func(*discoveryv1.Endpoint)

func notReady(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr.To(false) }
func terminating(e *discoveryv1.Endpoint) {
	e.Conditions.Terminating = ptr.To(true)
	e.Conditions.Serving = ptr.To(true)
}

func endpoint(podName, ip, zone string, opts ...epOpt) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: podName, Namespace: "shop"},
		Zone:       ptr.To(zone),
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func slice(name string, family discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: family,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http-web"), Port: ptr.To[int32](8080)},
			{Name: ptr.To("grpc"), Port: ptr.To[int32](9091)},
		},
		Endpoints: eps,
	}
}
