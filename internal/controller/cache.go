package controller

import (
	"math"
	"strconv"
	"unique"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/intern"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// CacheOptions keep in the informer caches only what the operator reads. At 200,000 pods the
// cache is most of the operator's memory, and a pod as the API server sends it (managed fields,
// every container's image, env, probes and volumes, kubectl's last-applied annotation) is
// several kilobytes of which the mirror reads a few hundred bytes. Nodes keep their labels and
// their allocatable CPU only (trimNode).
//
// With namespaces, namespaced objects are watched in those namespaces only (the operator then
// needs Roles there, not a ClusterRole); nodes, cluster-scoped, are still watched cluster-wide.
func CacheOptions(namespaces ...string) cache.Options {
	return CacheOptionsFor(DefaultMeshSource(), namespaces...)
}

// CacheOptionsFor is CacheOptions for the mesh facts read where src says: in istiod's namespace
// only its ConfigMap and the metadata of its Deployments (app=istiod) are cached; namespaces
// keep their labels only. No Secret is read anywhere.
func CacheOptionsFor(src MeshSource, namespaces ...string) cache.Options {
	var only map[string]cache.Config
	for _, ns := range namespaces {
		if only == nil {
			only = map[string]cache.Config{}
		}
		only[ns] = cache.Config{}
	}
	istiod := func(c cache.Config) map[string]cache.Config { return map[string]cache.Config{src.IstioNamespace: c} }
	// One table per cache: a rebuilt manager's cache shares nothing with the one before.
	shared := intern.NewMaps(intern.DefaultMapLimit)
	return cache.Options{
		DefaultNamespaces: only,
		DefaultTransform:  cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                {Transform: podTrimmer(shared)},
			&corev1.Node{}:               {Transform: trimNode},
			&corev1.Service{}:            {Transform: trimService},
			&discoveryv1.EndpointSlice{}: {Transform: trimEndpointSlice},
			&networkingv1.ServiceEntry{}: {Transform: trimForeignServiceEntry},
			&corev1.Namespace{}:          {Transform: trimNamespace},
			&corev1.ConfigMap{}:          {Namespaces: istiod(cache.Config{FieldSelector: fields.OneTermEqualSelector("metadata.name", src.MeshConfigMap)})},
			&appsv1.Deployment{}:         {Namespaces: istiod(cache.Config{LabelSelector: labels.SelectorFromSet(labels.Set{IstiodAppLabel: "istiod"})})},
		},
	}
}

// CachedCPULimitAnnotation carries, in the operator's cache only, the pod's CPU limit as
// cpuLimit computes it from the containers (millicores; "0" for no limit). It is never written
// to the API server: the transform derives it so that the containers themselves (about 400
// bytes each before their contents) need not be cached.
const CachedCPULimitAnnotation = "cache.adaptivelb.io/cpu-limit-millicores"

// podTrimmer returns trimPod with the pods' labels and derived annotations shared through
// shared: the replicas of a Deployment carry equal labels, and most pods the same two
// annotations, and one map per pod was about an eighth of the operator's heap (docs/scaling.md,
// "where the heap goes"). The cache never writes its objects, so sharing is safe there.
// Its readiness condition is shared the same way, one slice per status, and the strings that
// thousands of pods repeat (namespace, node, service account) are Go's unique copies.
func podTrimmer(shared *intern.Maps) func(obj any) (any, error) {
	ready := map[corev1.ConditionStatus][]corev1.PodCondition{}
	for _, s := range []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionUnknown} {
		ready[s] = []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}
	}
	return func(obj any) (any, error) {
		out, err := trimPod(obj)
		pod, ok := out.(*corev1.Pod)
		if !ok || err != nil {
			return out, err
		}
		pod.Labels, pod.Annotations = shared.Of(pod.Labels), shared.Of(pod.Annotations)
		if len(pod.Status.Conditions) == 1 {
			if c, ok := ready[pod.Status.Conditions[0].Status]; ok {
				pod.Status.Conditions = c
			}
		}
		pod.Namespace = unique.Make(pod.Namespace).Value()
		pod.Spec.NodeName = unique.Make(pod.Spec.NodeName).Value()
		pod.Spec.ServiceAccountName = unique.Make(pod.Spec.ServiceAccountName).Value()
		return pod, nil
	}
}

// trimPod keeps what the mirror and the weight cycle read: namespace, name, labels (copied onto the
// ServiceEntry endpoint), whether Istio's sidecar is there, the node, the service account, the
// IPs, readiness and the start time (DestinationRule warm-up). Two facts are derived from the
// containers and kept as annotations instead of the containers: the presence of a sidecar (as
// the injector's own annotation, which istio.Build already reads) and the CPU limit.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone: leave it to the informer
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		Spec: corev1.PodSpec{
			NodeName:           pod.Spec.NodeName,
			ServiceAccountName: pod.Spec.ServiceAccountName,
			HostNetwork:        pod.Spec.HostNetwork, // its IP is the node's: never an endpoint's by IP
		},
		Status: corev1.PodStatus{
			PodIP:     pod.Status.PodIP,
			PodIPs:    pod.Status.PodIPs,
			StartTime: pod.Status.StartTime,
		},
	}
	out.ObjectMeta = trimmedMeta(pod.ObjectMeta)
	// Nothing reads a pod's UID or owners (its ReplicaSet): about 300 bytes a pod.
	out.UID, out.OwnerReferences = "", nil
	out.Labels = pod.Labels
	out.Annotations = map[string]string{CachedCPULimitAnnotation: strconv.FormatInt(int64(math.Round(cpuLimit(pod)*1000)), 10)}
	if istio.HasSidecar(pod) {
		out.Annotations[istio.SidecarStatusAnnotation] = "" // only its presence is read
	}
	if istio.Enrolled(pod) {
		out.Annotations[istio.AmbientRedirectionAnnotation] = istio.AmbientRedirectionEnabled
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
}

// trimNode keeps a node's labels (locality and instance type, read by the mirror and the weight
// cycle) and its allocatable CPU (the tail algorithm's node CPU count). The rest of its status
// (images, conditions, addresses: kilobytes per node, updated every few seconds) stays out of
// the cache.
func trimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{TypeMeta: node.TypeMeta}
	out.ObjectMeta = trimmedMeta(node.ObjectMeta)
	out.Labels = node.Labels
	if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		out.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: cpu}
	}
	return out, nil
}

// trimForeignServiceEntry keeps other owners' ServiceEntries (a mesh may hold thousands) as
// their metadata, hosts and exportTo only: the mirror needs to know that one is in the way of a
// Service (by name, or by declaring its host for the same clients), never the rest of its spec.
// The operator's own, by label or by owner, are kept whole. A label selector on the watch would
// drop them from the cache instead, and an edit that removed the label would then go unseen.
func trimForeignServiceEntry(obj any) (any, error) {
	se, ok := obj.(*networkingv1.ServiceEntry)
	if !ok || se.Labels[ManagedByLabel] == ManagedByValue {
		return obj, nil
	}
	for _, ref := range se.OwnerReferences {
		if ref.Kind == "AdaptiveLoadBalancer" {
			return obj, nil
		}
	}
	out := &networkingv1.ServiceEntry{TypeMeta: se.TypeMeta}
	out.ObjectMeta = trimmedMeta(se.ObjectMeta)
	out.Labels = se.Labels
	out.Spec.Hosts, out.Spec.ExportTo = se.Spec.Hosts, se.Spec.ExportTo
	return out, nil
}

// trimNamespace keeps a namespace's labels (ambient mode, waypoint, network).
func trimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	out := &corev1.Namespace{TypeMeta: ns.TypeMeta}
	out.ObjectMeta = trimmedMeta(ns.ObjectMeta)
	out.Labels = ns.Labels
	return out, nil
}

// trimService drops annotations (kubectl's last-applied copy of the whole object is the usual
// bulk) except Istio's exportTo, and the status except istiod's istio.io/WaypointBound
// condition; the spec is read whole.
func trimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	out := &corev1.Service{TypeMeta: svc.TypeMeta, Spec: svc.Spec}
	out.ObjectMeta = trimmedMeta(svc.ObjectMeta)
	out.Labels = svc.Labels
	// istio.Build keeps the ServiceEntry's exportTo within the Service's own.
	if v, ok := svc.Annotations[istio.ExportToAnnotation]; ok {
		out.Annotations = map[string]string{istio.ExportToAnnotation: v}
	}
	for _, c := range svc.Status.Conditions {
		if c.Type == istio.WaypointBoundCondition {
			out.Status.Conditions = []metav1.Condition{c}
		}
	}
	return out, nil
}

// trimEndpointSlice drops annotations and topology hints; endpoints, ports and labels are read.
func trimEndpointSlice(obj any) (any, error) {
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := slice.DeepCopy()
	out.ObjectMeta = trimmedMeta(slice.ObjectMeta)
	out.Labels = slice.Labels
	for i := range out.Endpoints {
		out.Endpoints[i].Hints = nil
		out.Endpoints[i].DeprecatedTopology = nil
	}
	return out, nil
}

// trimmedMeta keeps the identity and lifecycle fields every cached object needs (the informer
// and the field indexes key on namespace and name; the resource version orders updates).
func trimmedMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		Generation:        m.Generation,
		CreationTimestamp: m.CreationTimestamp,
		DeletionTimestamp: m.DeletionTimestamp,
		OwnerReferences:   m.OwnerReferences,
	}
}
