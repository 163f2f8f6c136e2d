package scale

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/adaptive-lb/adaptive-lb/internal/controller"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// transforms returns the operator's cache transform for each kind it trims.
// nodeTransform returns the cache's Node transform.
func nodeTransform(t testing.TB) toolscache.TransformFunc {
	t.Helper()
	for obj, by := range controller.CacheOptions().ByObject {
		if _, ok := obj.(*corev1.Node); ok && by.Transform != nil {
			return by.Transform
		}
	}
	t.Fatal("the cache options lost the Node transform")
	return nil
}

func transforms(t testing.TB) (pod, svc, slice toolscache.TransformFunc) {
	t.Helper()
	for obj, by := range controller.CacheOptions().ByObject {
		switch obj.(type) {
		case *corev1.Pod:
			pod = by.Transform
		case *corev1.Service:
			svc = by.Transform
		case *discoveryv1.EndpointSlice:
			slice = by.Transform
		}
	}
	if pod == nil || svc == nil || slice == nil {
		t.Fatal("the cache options lost a transform")
	}
	return pod, svc, slice
}

func managedFields(n int) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for i := range n {
		raw := `{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:version":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:image":{},"f:env":{},"f:ports":{},"f:resources":{}}}},"f:status":{"f:conditions":{},"f:podIPs":{}}}` + strings.Repeat(" ", 200*i)
		out = append(out, metav1.ManagedFieldsEntry{Manager: fmt.Sprintf("manager-%d", i), Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(raw)}})
	}
	return out
}

// realisticPod is an Istio-injected application pod as the API server returns it: managed
// fields, kubectl's last-applied annotation, the injector's status, two containers with env,
// probes and mounts, an init container, volumes and a full status.
func realisticPod(i int) *corev1.Pod {
	name := fmt.Sprintf("checkout-7d9f8b6c4d-%05d", i)
	env := func(n int) []corev1.EnvVar {
		var out []corev1.EnvVar
		for j := range n {
			out = append(out, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%02d", j), Value: fmt.Sprintf("value-%d-with-some-length", j)})
		}
		return out
	}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 10}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	now := metav1.NewTime(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "shop", UID: "6b3c1c8e-8f0d-4b8e-9a51-0f6f2a6d5e11", ResourceVersion: "123456789", CreationTimestamp: now,
			GenerateName: "checkout-7d9f8b6c4d-",
			Labels: map[string]string{"app": "checkout", "version": "v1", "pod-template-hash": "7d9f8b6c4d",
				"security.istio.io/tlsMode": "istio", "service.istio.io/canonical-name": "checkout", "service.istio.io/canonical-revision": "v1"},
			Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat(`{"apiVersion":"v1","kind":"Pod"}`, 40),
				istio.SidecarStatusAnnotation:                      `{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}`,
				"prometheus.io/scrape":                             "true", "prometheus.io/port": "15020", "prometheus.io/path": "/stats/prometheus",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "checkout-7d9f8b6c4d", UID: "0b1e...", Controller: ptr.To(true)}},
			ManagedFields:   managedFields(3),
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%05d", i%10000), ServiceAccountName: "checkout",
			Containers: []corev1.Container{
				{Name: "app", Image: "registry.example.com/shop/checkout:1.42.7", Env: env(12), Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					Resources:      corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")}, Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
					ReadinessProbe: probe, LivenessProbe: probe, VolumeMounts: mounts},
				{Name: istio.SidecarContainer, Image: "docker.io/istio/proxyv2:1.31.1", Args: strings.Fields("proxy sidecar --domain shop.svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info"),
					Env: env(25), Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}, ReadinessProbe: probe, VolumeMounts: mounts},
			},
			InitContainers: []corev1.Container{{Name: "istio-init", Image: "docker.io/istio/proxyv2:1.31.1", Args: strings.Fields("istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i * -x  -b * -d 15090,15021,15020")}},
			Volumes:        []corev1.Volume{{Name: "config"}, {Name: "istio-envoy"}, {Name: "istio-data"}, {Name: "istio-podinfo"}, {Name: "istio-token"}, {Name: "istiod-ca-cert"}},
			Tolerations:    []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists}, {Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "10.0.3.17", PodIP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256),
			PodIPs:    []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)}},
			StartTime: &now, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now}, {Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "app", Ready: true, Image: "registry.example.com/shop/checkout:1.42.7", ImageID: "registry.example.com/shop/checkout@sha256:" + strings.Repeat("ab", 32), ContainerID: "containerd://" + strings.Repeat("cd", 32)},
				{Name: istio.SidecarContainer, Ready: true, Image: "docker.io/istio/proxyv2:1.31.1", ImageID: "docker.io/istio/proxyv2@sha256:" + strings.Repeat("ef", 32), ContainerID: "containerd://" + strings.Repeat("01", 32)},
			},
		},
	}
}

// realisticSlice is one Service's EndpointSlice of 20 endpoints, as the endpointslice controller writes it.
func realisticSlice(first int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "checkout-x7k2p", Namespace: "shop", ResourceVersion: "123456790", GenerateName: "checkout-",
			Labels:        map[string]string{discoveryv1.LabelServiceName: "checkout", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": "checkout"},
			Annotations:   map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-22T12:00:00Z"},
			ManagedFields: managedFields(1)},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i := first; i < first+20; i++ {
		p := realisticPod(i)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.Status.PodIP}, NodeName: ptr.To(p.Spec.NodeName), Zone: ptr.To("eu-west-1a"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: p.Name, UID: p.UID},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "eu-west-1a"}}},
		})
	}
	return s
}

func realisticService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "checkout", Namespace: "shop", ResourceVersion: "42",
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat(`{"apiVersion":"v1","kind":"Service"}`, 20)},
			ManagedFields: managedFields(1)},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "checkout"}, ClusterIP: "10.96.14.7", Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}},
	}
}

// The transforms must not change anything the operator computes: the ServiceEntry built from
// the trimmed objects is identical to the one built from the full objects, and the CPU limits,
// readiness, start time and IPs the weight cycle and the indexes read are the same.
func TestCacheTransforms_KeepEverythingTheOperatorReads(t *testing.T) {
	trimPod, trimSvc, trimSlice := transforms(t)
	rawSlice, rawSvc := realisticSlice(0), realisticService()
	rawPods, trimmedPods := map[string]*corev1.Pod{}, map[string]*corev1.Pod{}
	for i := range 20 {
		p := realisticPod(i)
		rawPods[p.Name] = p
		tp, err := trimPod(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		trimmedPods[p.Name] = tp.(*corev1.Pod)
	}
	ts, err := trimSlice(rawSlice.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	tsvc, err := trimSvc(rawSvc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*corev1.Node{}
	for _, p := range rawPods {
		nodes[p.Spec.NodeName] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.Spec.NodeName, Labels: map[string]string{istio.ZoneLabel: "eu-west-1a", istio.RegionLabel: "eu-west-1"}}}
	}
	build := func(svc *corev1.Service, slice *discoveryv1.EndpointSlice, pods map[string]*corev1.Pod) *apinetworkingv1.ServiceEntry {
		spec, _, err := istio.Build(istio.Input{Service: svc, Slices: []*discoveryv1.EndpointSlice{slice}, Pods: pods, Nodes: nodes, DefaultWeight: 100, ClusterDomain: "cluster.local"})
		if err != nil {
			t.Fatal(err)
		}
		return spec
	}
	if full, cached := build(rawSvc, rawSlice, rawPods), build(tsvc.(*corev1.Service), ts.(*discoveryv1.EndpointSlice), trimmedPods); !proto.Equal(full, cached) {
		t.Errorf("the ServiceEntry built from cached (trimmed) objects differs from the one built from full objects:\nfull:   %.600s\ncached: %.600s", prototext.Format(full), prototext.Format(cached))
	}
	for name, raw := range rawPods {
		got := trimmedPods[name]
		if got.Status.PodIP != raw.Status.PodIP || len(got.Status.PodIPs) != 1 || !got.Status.StartTime.Equal(raw.Status.StartTime) ||
			got.Spec.NodeName != raw.Spec.NodeName || got.DeletionTimestamp != raw.DeletionTimestamp || got.ResourceVersion != raw.ResourceVersion {
			t.Errorf("%s: identity, IPs, node or start time lost: %+v", name, got)
		}
		// The app container's limit (2 cores); the sidecar's does not count.
		if v := got.Annotations[controller.CachedCPULimitAnnotation]; v != "2000" {
			t.Errorf("%s: cached CPU limit %q millicores, want 2000", name, v)
		}
		if !istio.HasSidecar(got) {
			t.Errorf("%s: the sidecar is no longer recognised", name)
		}
		if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != corev1.PodReady || got.Status.Conditions[0].Status != corev1.ConditionTrue {
			t.Errorf("%s: readiness lost: %v", name, got.Status.Conditions)
		}
		if got.ManagedFields != nil || got.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" || got.Status.ContainerStatuses != nil || got.Spec.Containers != nil ||
			got.UID != "" || got.OwnerReferences != nil {
			t.Errorf("%s: kept what the operator never reads", name)
		}
	}
}

// The replicas of a Deployment share one labels map, one annotations map and one readiness
// condition in the cache; a pod with other labels or another readiness has its own.
func TestCacheTransforms_ReplicasShareWhatTheyHaveInCommon(t *testing.T) {
	trimPod, _, _ := transforms(t)
	trim := func(p *corev1.Pod) *corev1.Pod {
		out, err := trimPod(p)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*corev1.Pod)
	}
	mapOf := func(m map[string]string) unsafe.Pointer { return reflect.ValueOf(m).UnsafePointer() }
	a, b := trim(realisticPod(1)), trim(realisticPod(2))
	if mapOf(a.Labels) != mapOf(b.Labels) || mapOf(a.Annotations) != mapOf(b.Annotations) || &a.Status.Conditions[0] != &b.Status.Conditions[0] {
		t.Error("two replicas do not share their labels, annotations and readiness")
	}
	other := realisticPod(3)
	other.Labels = map[string]string{"app": "checkout", "version": "v2"}
	other.Status.Conditions[1].Status = corev1.ConditionFalse
	c := trim(other)
	if mapOf(c.Labels) == mapOf(a.Labels) || c.Labels["version"] != "v2" || &c.Status.Conditions[0] == &a.Status.Conditions[0] || podReady(c) {
		t.Errorf("a pod of another version or readiness shares the replicas': labels %v, conditions %v", c.Labels, c.Status.Conditions)
	}
	if !podReady(a) || a.Labels["version"] != "v1" {
		t.Errorf("the replicas' shared labels or readiness changed: %v, %v", a.Labels, a.Status.Conditions)
	}
}

func podReady(p *corev1.Pod) bool {
	return len(p.Status.Conditions) == 1 && p.Status.Conditions[0].Type == corev1.PodReady && p.Status.Conditions[0].Status == corev1.ConditionTrue
}

// sizeOf measures the heap that n objects made by build take once built and kept alive.
func sizeOf(n int, build func(i int) any) float64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	objs := make([]any, n)
	for i := range n {
		objs[i] = build(i)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(objs)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkCacheBytesPerObject reports the heap one cached object takes, as the API server
// sends it and as the operator's cache keeps it.
//
//	go test -run '^$' -bench CacheBytesPerObject -benchtime 1x ./test/scale/
func BenchmarkCacheBytesPerObject(b *testing.B) {
	trimPod, trimSvc, trimSlice := transforms(b)
	const n = 2000
	trimmed := func(f toolscache.TransformFunc, build func(i int) any) func(i int) any {
		return func(i int) any {
			o, err := f(build(i))
			if err != nil {
				b.Fatal(err)
			}
			return o
		}
	}
	pod := func(i int) any { return realisticPod(i) }
	slice := func(i int) any { return realisticSlice(i * 20) }
	svc := func(int) any { return realisticService() }
	node := func(i int) any {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), ResourceVersion: "77", ManagedFields: managedFields(4),
				Labels:      map[string]string{istio.ZoneLabel: "eu-west-1a", istio.RegionLabel: "eu-west-1", controller.InstanceTypeLabel: "m7i.2xlarge", "kubernetes.io/hostname": fmt.Sprintf("node-%05d", i), "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
				Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
			Status: corev1.NodeStatus{Images: nodeImages(40), Conditions: make([]corev1.NodeCondition, 5),
				Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.3.17"}, {Type: corev1.NodeHostName, Address: "node"}},
				Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")},
				Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7910m"), corev1.ResourceMemory: resource.MustParse("30Gi")}},
		}
	}
	trimNode := nodeTransform(b)
	for b.Loop() {
		b.ReportMetric(sizeOf(n, pod), "pod-raw-B")
		b.ReportMetric(sizeOf(n, trimmed(trimPod, pod)), "pod-cached-B")
		b.ReportMetric(sizeOf(n/10, slice), "slice20-raw-B")
		b.ReportMetric(sizeOf(n/10, trimmed(trimSlice, slice)), "slice20-cached-B")
		b.ReportMetric(sizeOf(n, svc), "service-raw-B")
		b.ReportMetric(sizeOf(n, trimmed(trimSvc, svc)), "service-cached-B")
		b.ReportMetric(sizeOf(n, node), "node-raw-B")
		b.ReportMetric(sizeOf(n, trimmed(trimNode, node)), "node-cached-B")
	}
}

func nodeImages(n int) []corev1.ContainerImage {
	var out []corev1.ContainerImage
	for i := range n {
		out = append(out, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.example.com/team/image-%d@sha256:%s", i, strings.Repeat("ab", 32)), fmt.Sprintf("registry.example.com/team/image-%d:1.0.%d", i, i)}, SizeBytes: 123456789})
	}
	return out
}

// The facts derived from the containers hold for the other shapes of pod: a native sidecar (an
// init container) is still a sidecar, and one container without a limit makes the pod unlimited.
func TestCacheTransforms_DerivedFactsForOtherPodShapes(t *testing.T) {
	trimPod, _, _ := transforms(t)
	native := realisticPod(1)
	delete(native.Annotations, istio.SidecarStatusAnnotation)
	native.Spec.InitContainers = append(native.Spec.InitContainers, corev1.Container{Name: istio.SidecarContainer})
	native.Spec.Containers = native.Spec.Containers[:1]
	got, _ := trimPod(native)
	if !istio.HasSidecar(got.(*corev1.Pod)) {
		t.Error("a native sidecar is no longer recognised after the transform")
	}
	plain := realisticPod(2)
	delete(plain.Annotations, istio.SidecarStatusAnnotation)
	plain.Spec.Containers = append(plain.Spec.Containers[:1], corev1.Container{Name: "helper"}) // no limit
	got, _ = trimPod(plain)
	if p := got.(*corev1.Pod); istio.HasSidecar(p) || p.Annotations[controller.CachedCPULimitAnnotation] != "0" {
		t.Errorf("a pod without sidecar and with an unlimited container: annotations %v", p.Annotations)
	}
}

// BenchmarkDecodePod measures decoding one realistic pod from protobuf, the wire format the
// operator's watches use for built-in types: the client side of a start-up sync, per pod.
//
//	go test -run '^$' -bench DecodePod -benchmem ./test/scale/
func BenchmarkDecodePod(b *testing.B) {
	raw, err := realisticPod(1).Marshal()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var p corev1.Pod
		if err := p.Unmarshal(raw); err != nil {
			b.Fatal(err)
		}
	}
}
