package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// Cache indexes: lookups by index instead of lists, which matters at 200,000 pods.
const (
	indexTargetName   = "spec.targetRef.name"
	indexSliceService = "metadata.labels.service-name"
	indexSlicePod     = "endpoints.targetRef.pod"
	indexPodIP        = "status.podIP"
	// indexServiceEntryController maps a ServiceEntry to the UID of the AdaptiveLoadBalancer
	// that controls it.
	indexServiceEntryController = "metadata.ownerReferences.controller"
	// indexServiceEntryHost maps a ServiceEntry to its hosts, lower-cased.
	indexServiceEntryHost = "spec.hosts"
)

// SetupIndexes registers the cache indexes the reconciler queries.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &adlbv1.AdaptiveLoadBalancer{}, indexTargetName, func(o client.Object) []string {
		return []string{o.(*adlbv1.AdaptiveLoadBalancer).Spec.TargetRef.Name}
	}); err != nil {
		return err
	}
	if err := indexInNamespace(ctx, mgr.GetCache(), &corev1.Pod{}, indexPodIP, func(o client.Object) []string {
		return endpointIPs(o.(*corev1.Pod))
	}); err != nil {
		return err
	}
	if err := indexInNamespace(ctx, mgr.GetCache(), &discoveryv1.EndpointSlice{}, indexSlicePod, func(o client.Object) []string {
		var pods []string
		for _, ep := range o.(*discoveryv1.EndpointSlice).Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				pods = append(pods, ep.TargetRef.Name)
			}
		}
		return pods
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &networkingv1.ServiceEntry{}, indexServiceEntryHost, serviceEntryHosts); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &networkingv1.ServiceEntry{}, indexServiceEntryController, func(o client.Object) []string {
		if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "AdaptiveLoadBalancer" && strings.HasPrefix(ref.APIVersion, adlbv1.GroupVersion.Group+"/") {
			return []string{string(ref.UID)}
		}
		return nil
	}); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &discoveryv1.EndpointSlice{}, indexSliceService, func(o client.Object) []string {
		if name := o.GetLabels()[discoveryv1.LabelServiceName]; name != "" {
			return []string{name}
		}
		return nil
	})
}

// indexInNamespace registers an index as the cache's IndexField does, for lookups within one
// namespace only. IndexField files every value twice, under the object's namespace and under
// "all namespaces", and client-go's indexer keeps a set per key: for the indexes with an entry
// per pod that second copy was a tenth of the operator's heap (docs/scaling.md, "where the heap
// goes"), and no query reads it. A List on such an index must name its namespace
// (client.InNamespace): without one it finds nothing (TestIndexes_NamespacedOnlyQueriedInANamespace).
func indexInNamespace(ctx context.Context, c cache.Cache, obj client.Object, field string, extract client.IndexerFunc) error {
	informer, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("index %T by %s: %w", obj, field, err)
	}
	return informer.AddIndexers(toolscache.Indexers{fieldIndexName(field): namespacedIndex(extract)})
}

// fieldIndexName is the name controller-runtime's cache reader looks an index up by when a List
// selects on field (client.MatchingFields); the cache tests fail if it changes.
func fieldIndexName(field string) string { return "field:" + field }

// namespacedIndex files each value extract returns under "<namespace>/<value>", the key the
// cache reader asks for in a List within a namespace.
func namespacedIndex(extract client.IndexerFunc) toolscache.IndexFunc {
	return func(raw any) ([]string, error) {
		obj, ok := raw.(client.Object)
		if !ok {
			return nil, fmt.Errorf("cannot index %T: not a Kubernetes object", raw)
		}
		values := extract(obj)
		keys := make([]string, len(values))
		for i, v := range values {
			keys[i] = obj.GetNamespace() + "/" + v
		}
		return keys, nil
	}
}

// SetupWithManager wires the reconciler to the events that can change a ServiceEntry.
func (r *AdaptiveLoadBalancerReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, workers int) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.ClusterDomain == "" {
		r.ClusterDomain = "cluster.local"
	}
	if r.Mesh == (MeshSource{}) {
		r.Mesh = DefaultMeshSource()
	}
	r.mesh = &meshFacts{source: r.Mesh, clusters: r.RemoteClusters}
	r.propagation = newPropagationTracker()
	if r.Versions == nil {
		r.Versions = &ServiceEntryVersions{}
	}
	r.apiReader = mgr.GetAPIReader()
	if err := SetupIndexes(ctx, mgr); err != nil {
		return err
	}
	if err := (&orphanReconciler{r}).setup(mgr); err != nil {
		return err
	}
	// Re-mirrors everything when an informer goes blind or recovers (informerWatch), or when
	// istiod's count of its remote clusters changes (RemoteClusterProbe).
	informerChanges := make(chan event.GenericEvent, 1)
	remirror := func() {
		select {
		case informerChanges <- event.GenericEvent{}:
		default: // a re-mirror of everything is already queued
		}
	}
	if r.RemoteClusters != nil {
		if r.RemoteClusters.Namespace == "" {
			r.RemoteClusters.Namespace = r.Mesh.IstioNamespace
		}
		r.RemoteClusters.changed = remirror
		if err := mgr.Add(r.RemoteClusters); err != nil {
			return err
		}
	}
	if r.Progress != nil {
		if err := mgr.Add(cutSilentStreams{r.Progress}); err != nil {
			return err
		}
		watch := &informerWatch{progress: r.Progress, events: informerChanges, interval: time.Second, logger: mgr.GetLogger().WithName("informers")}
		if err := mgr.Add(watch); err != nil {
			return err
		}
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Mesh.IstioVersion == "" {
		// istiod's version from its Deployments; declared, nothing reads them, and no informer
		// runs that could go blind.
		b = b.WatchesMetadata(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(r.forMeshObject), builder.WithPredicates(labelsChanged()))
	}
	return b.
		Named("adaptiveloadbalancer").
		For(&adlbv1.AdaptiveLoadBalancer{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&networkingv1.ServiceEntry{}, builder.WithPredicates(r.notOwnWrite())).
		Watches(&networkingv1.ServiceEntry{}, r.serviceEntryDeleted()).
		Watches(&networkingv1.ServiceEntry{}, handler.EnqueueRequestsFromMapFunc(r.forServiceEntryHosts), builder.WithPredicates(foreignServiceEntry())).
		Watches(&adlbv1.AdaptiveLoadBalancer{}, r.unblockOnRelease()).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.forService)).
		Watches(&discoveryv1.EndpointSlice{}, r.sliceHandler()).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.forPod), builder.WithPredicates(podChanged())).
		// Nodes are cached trimmed to their labels and allocatable CPU (CacheOptions); only a
		// change of their locality or instance type moves the mirror's output.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.forNode), builder.WithPredicates(topologyChanged())).
		WatchesRawSource(source.Channel(informerChanges, handler.EnqueueRequestsFromMapFunc(r.every))).
		// The mesh facts (meshfacts.go): a namespace's labels (ambient, waypoint, and istiod's
		// network), istiod's ConfigMap (and Deployments, above).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.forNamespace), builder.WithPredicates(labelsChanged())).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.forMeshObject)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers,
			// Fast first retries for transient API errors, bounded for persistent ones.
			// A failing one is also retried when its ServiceEntry turns stale, to delete it then.
			RateLimiter: staleDeadlineLimiter{
				TypedRateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, requeueAfterError),
				untilStale:       r.untilStale,
			},
		}).
		Complete(r)
}

// forService maps a Service to the AdaptiveLoadBalancers that target it.
func (r *AdaptiveLoadBalancerReconciler) forService(ctx context.Context, o client.Object) []reconcile.Request {
	return r.targeting(ctx, o.GetNamespace(), o.GetName())
}

func (r *AdaptiveLoadBalancerReconciler) targeting(ctx context.Context, namespace, service string) []reconcile.Request {
	var list adlbv1.AdaptiveLoadBalancerList
	// Read-only lookups in the event handlers skip the cache's deep copies: under endpoint churn
	// they run for every event, and the copies (status endpoint lists included) are most of
	// their cost.
	if err := r.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{indexTargetName: service}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, alb := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}})
	}
	return reqs
}

// sliceHandler enqueues the owners of a changed EndpointSlice's Service and notes when the change
// arrived, for adaptivelb_endpoint_propagation_seconds.
func (r *AdaptiveLoadBalancerReconciler) sliceHandler() handler.EventHandler {
	enqueue := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		service := o.GetLabels()[discoveryv1.LabelServiceName]
		if service == "" {
			return
		}
		now := r.Clock.Now()
		for _, req := range r.targeting(ctx, o.GetNamespace(), service) {
			r.propagation.observed(req.NamespacedName, now)
			q.Add(req)
		}
	}
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
	}
}

// forPod maps a pod to the AdaptiveLoadBalancers of the Services whose EndpointSlices list it:
// only those pods' labels, service account, node and sidecar reach a ServiceEntry. A pod no
// slice lists yet needs nothing: the slice update that adds it triggers the mirror.
func (r *AdaptiveLoadBalancerReconciler) forPod(ctx context.Context, o client.Object) []reconcile.Request {
	var slices discoveryv1.EndpointSliceList
	if err := r.List(ctx, &slices, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexSlicePod: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	services := map[string]bool{}
	for i := range slices.Items {
		service := slices.Items[i].Labels[discoveryv1.LabelServiceName]
		if service == "" || services[service] {
			continue
		}
		services[service] = true
		reqs = append(reqs, r.targeting(ctx, o.GetNamespace(), service)...)
	}
	return reqs
}

// every re-mirrors every AdaptiveLoadBalancer when an informer goes blind or recovers.
func (r *AdaptiveLoadBalancerReconciler) every(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.all(ctx)
}

// forNamespace re-mirrors the AdaptiveLoadBalancers of a namespace whose labels changed (its
// ambient mode or waypoint), and every one when it is istiod's (the cluster's network).
func (r *AdaptiveLoadBalancerReconciler) forNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetName() == r.Mesh.IstioNamespace {
		return r.all(ctx)
	}
	var list adlbv1.AdaptiveLoadBalancerList
	if err := r.List(ctx, &list, client.InNamespace(o.GetName()), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, alb := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}})
	}
	return reqs
}

// forMeshObject re-mirrors every AdaptiveLoadBalancer when one of the mesh-wide facts changes:
// istiod's ConfigMap, its version. The cache holds only those objects (see CacheOptions), and
// they change rarely.
func (r *AdaptiveLoadBalancerReconciler) forMeshObject(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.all(ctx)
}

// forServiceEntryHosts re-mirrors the AdaptiveLoadBalancers of the Services whose host another
// owner's ServiceEntry declares (created, changed or deleted): it may now be in their way, or
// no longer.
func (r *AdaptiveLoadBalancerReconciler) forServiceEntryHosts(ctx context.Context, o client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	suffix := ".svc." + strings.ToLower(r.ClusterDomain)
	for _, host := range serviceEntryHosts(o) {
		rest, ok := strings.CutSuffix(host, suffix)
		if !ok {
			continue
		}
		if name, namespace, ok := strings.Cut(rest, "."); ok && !strings.Contains(namespace, ".") {
			reqs = append(reqs, r.targeting(ctx, namespace, name)...)
		}
	}
	return reqs
}

// all lists every AdaptiveLoadBalancer.
func (r *AdaptiveLoadBalancerReconciler) all(ctx context.Context) []reconcile.Request {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, alb := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}})
	}
	return reqs
}

// foreignServiceEntry passes the ServiceEntries the operator does not manage.
func foreignServiceEntry() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[ManagedByLabel] != ManagedByValue
	})
}

// labelsChanged passes creations, deletions and label changes.
func labelsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !labels.Equals(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
		},
	}
}

// forNode re-mirrors every AdaptiveLoadBalancer when a node's topology labels change, which is
// rare; the locality of its pods' endpoints depends on them.
func (r *AdaptiveLoadBalancerReconciler) forNode(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.all(ctx)
}

// podChanged passes the pod events that can change a ServiceEntry: labels (subsets), deletion
// (leave at once), IPs, readiness, node placement and sidecar annotations.
func podChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldPod, ok1 := e.ObjectOld.(*corev1.Pod)
			newPod, ok2 := e.ObjectNew.(*corev1.Pod)
			if !ok1 || !ok2 {
				return true
			}
			return !labels.Equals(oldPod.Labels, newPod.Labels) ||
				oldPod.DeletionTimestamp.IsZero() != newPod.DeletionTimestamp.IsZero() ||
				oldPod.Status.PodIP != newPod.Status.PodIP ||
				oldPod.Spec.NodeName != newPod.Spec.NodeName ||
				oldPod.Spec.ServiceAccountName != newPod.Spec.ServiceAccountName ||
				podReady(oldPod) != podReady(newPod) ||
				istio.Enrolled(oldPod) != istio.Enrolled(newPod) ||
				hasAnnotation(oldPod, istio.SidecarStatusAnnotation) != hasAnnotation(newPod, istio.SidecarStatusAnnotation)
		},
	}
}

// hasAnnotation compares presence only: the cache keeps the sidecar annotation without its value.
func hasAnnotation(o client.Object, key string) bool {
	_, ok := o.GetAnnotations()[key]
	return ok
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func topologyChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			for _, k := range []string{istio.RegionLabel, istio.ZoneLabel, istio.SubzoneLabel, InstanceTypeLabel} {
				if e.ObjectOld.GetLabels()[k] != e.ObjectNew.GetLabels()[k] {
					return true
				}
			}
			return false
		},
	}
}

// serviceEntryDeleted drops the remembered version of a deleted ServiceEntry (its owner deleted,
// or someone else deleted it), so versions hold nothing for objects that are gone, and enqueues
// every AdaptiveLoadBalancer that targets the Service of that name or slice: one blocked by a
// foreign ServiceEntry (ServiceEntryNotOwned) can take the name over now. Its owner, if any, is
// enqueued by Owns as well.
func (r *AdaptiveLoadBalancerReconciler) serviceEntryDeleted() handler.EventHandler {
	return handler.Funcs{
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.Versions.forgetDeleted(e.Object)
			// A slice's name is its Service's, a dot and a number (istio.SliceName); a Service's
			// name has no dot.
			service, _, _ := strings.Cut(e.Object.GetName(), ".")
			for _, req := range r.targeting(ctx, e.Object.GetNamespace(), service) {
				q.Add(req)
			}
		},
	}
}

// unblockOnRelease enqueues the AdaptiveLoadBalancers that target the same Service as one that
// is deleted or starts being deleted: the oldest of them wins the Conflict it lost.
func (r *AdaptiveLoadBalancerReconciler) unblockOnRelease() handler.EventHandler {
	enqueueOthers := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		alb, ok := o.(*adlbv1.AdaptiveLoadBalancer)
		if !ok {
			return
		}
		for _, req := range r.targeting(ctx, alb.Namespace, alb.Spec.TargetRef.Name) {
			if req.Name != alb.Name {
				q.Add(req)
			}
		}
	}
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero() {
				enqueueOthers(ctx, e.ObjectNew, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueueOthers(ctx, e.Object, q)
		},
	}
}

// notOwnWrite drops the watch events of ServiceEntry versions the operator already knows (its
// own writes): reconciling them would find nothing to do and only take a worker from the next
// endpoint change. Anyone else's edit has another resourceVersion and is reconciled (and
// reverted).
func (r *AdaptiveLoadBalancerReconciler) notOwnWrite() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !r.Versions.known(client.ObjectKeyFromObject(e.ObjectNew), e.ObjectNew.GetResourceVersion())
		},
		CreateFunc: func(e event.CreateEvent) bool {
			return !r.Versions.known(client.ObjectKeyFromObject(e.Object), e.Object.GetResourceVersion())
		},
	}
}
