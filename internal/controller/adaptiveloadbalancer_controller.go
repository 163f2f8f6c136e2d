// Package controller holds the operator's reconcilers: the endpoint mirror that keeps one
// ServiceEntry per AdaptiveLoadBalancer in step with the Service's ready endpoints.
package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/progress"
)

// Labels the operator puts on the ServiceEntries it owns.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "adaptive-lb"
	// ServiceEntryOwnerLabel names the AdaptiveLoadBalancer that owns a ServiceEntry.
	ServiceEntryOwnerLabel = "adaptivelb.io/owner"
	// InstallLabel names the installation that wrote a ServiceEntry (InstallID: its leader
	// Lease), so that one installation's fail-open watchdog deletes only its own.
	InstallLabel = "adaptivelb.io/install"
)

// InstallID is the value of InstallLabel for the installation whose operators elect their
// leader through the Lease leaseNamespace/leaseName: "<namespace>.<name>", or, when that is
// longer than a label value may be, its first 52 characters and a hash of the whole.
func InstallID(leaseNamespace, leaseName string) string {
	id := leaseNamespace + "." + leaseName
	if len(id) <= validation.LabelValueMaxLength {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return id[:52] + "-" + hex.EncodeToString(sum[:])[:10]
}

// Event reasons.
const (
	EventServiceEntryCreated = "ServiceEntryCreated"
	EventServiceEntryDeleted = "ServiceEntryDeleted"
	// EventServiceEntryTakenOver: an AdaptiveLoadBalancer re-created under the same name took over
	// the ServiceEntry of the deleted one.
	EventServiceEntryTakenOver = "ServiceEntryTakenOver"
	EventTargetNotFound        = adlbv1.ReasonTargetNotFound
	EventUnsupported           = adlbv1.ReasonUnsupported
	EventConflict              = adlbv1.ReasonConflict
	EventNotOwned              = adlbv1.ReasonServiceEntryNotOwned
	EventWriteFailed           = adlbv1.ReasonWriteFailed
	EventCacheStale            = adlbv1.ReasonCacheStale
)

// AdaptiveLoadBalancerReconciler mirrors a Service's ready endpoints into a ServiceEntry, keeping
// the weights already in it. Membership changes are written at once; the weight cycle changes
// weights through the same ServiceEntry.
type AdaptiveLoadBalancerReconciler struct {
	client.Client
	// StatusQueue writes the statuses off the reconcile's path (status_queue.go), shared with
	// the weight cycle, through a client with a rate limit of its own; nil: the reconcile writes
	// them itself, through Client.
	StatusQueue *StatusQueue
	Scheme      *runtime.Scheme
	Recorder    record.EventRecorder
	Clock       clock.PassiveClock
	Metrics     *Metrics
	// ClusterDomain is the cluster's DNS domain (cluster.local by default).
	ClusterDomain string
	// MaxEndpoints is the most endpoints a Service may have mirrored (0: istio.MaxEndpoints).
	MaxEndpoints int
	// SliceEndpoints is the most endpoints one ServiceEntry slice carries (0:
	// istio.MaxSliceEndpoints).
	SliceEndpoints int
	// Activity, if set, counts reconciles under way; once it is closed none starts.
	Activity *Activity
	// StaleServiceEntryTimeout is how long the mirror of a Service may keep failing before its
	// ServiceEntry is deleted (0: DefaultStaleServiceEntryTimeout).
	StaleServiceEntryTimeout time.Duration
	// InstallID, if set, is stamped on every ServiceEntry as InstallLabel (see InstallID).
	InstallID string
	// Progress, if set, tracks the informers' lists and watches (the cache's transport must go
	// through it): the mirror writes nothing from an informer that has stopped following the
	// cluster, and deletes the ServiceEntry once that has lasted StaleServiceEntryTimeout.
	Progress *progress.Tracker
	// Mesh says where the mesh facts are read (zero: DefaultMeshSource).
	Mesh MeshSource
	// RemoteClusters, if set, reads istiod's count of its remote clusters from the TSDB: the
	// evidence that the mesh is this cluster alone when Mesh.MultiCluster is auto. Without it
	// auto cannot tell, and every Service is refused (MultiCluster).
	RemoteClusters *RemoteClusterProbe
	mesh           *meshFacts

	// failingSince holds, per AdaptiveLoadBalancer whose mirror fails, when the failures began.
	failingSince sync.Map // types.NamespacedName → time.Time

	propagation *propagationTracker
	// statusThrottle spaces the status writes that only refresh the endpoint list.
	statusThrottle statusThrottle
	// Versions are the ServiceEntry versions this operator wrote, shared with the weight cycle;
	// SetupWithManager creates them if nil.
	Versions *ServiceEntryVersions
	// Membership records the endpoints each written ServiceEntry lists, shared with the weight
	// cycle; nil records nothing.
	Membership *Membership
	apiReader  client.Reader // uncached reads, when the cache and the remembered version disagree
	// observePropagation, when set (benchmarks), also receives every propagation delay exactly.
	observePropagation func(time.Duration)
}

// +kubebuilder:rbac:groups=adaptivelb.io,resources=adaptiveloadbalancers,verbs=get;list;watch
// +kubebuilder:rbac:groups=adaptivelb.io,resources=adaptiveloadbalancers/status,verbs=get;update;patch
// Setting blockOwnerDeletion on the ServiceEntry's owner reference needs update on the owner's
// finalizers where OwnerReferencesPermissionEnforcement is on (OpenShift by default).
// +kubebuilder:rbac:groups=adaptivelb.io,resources=adaptiveloadbalancers/finalizers,verbs=update
// +kubebuilder:rbac:groups=networking.istio.io,resources=serviceentries,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.istio.io,resources=destinationrules,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services;pods;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// The mesh facts (meshfacts.go): namespaces' ambient and waypoint labels, and in istiod's
// namespace its ConfigMap and its Deployments' version label (their metadata only is cached;
// list is the verb a metadata watch needs). No Secret: whether the mesh spans several clusters
// comes from istiod's own metrics in the TSDB (RemoteClusterProbe) and its meshNetworks.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=istio-system,resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,namespace=istio-system,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one AdaptiveLoadBalancer's ServiceEntry and status in line with its Service.
func (r *AdaptiveLoadBalancerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if !r.Activity.enter() {
		return ctrl.Result{}, nil // this manager is being replaced; the next one reconciles
	}
	defer r.Activity.exit()
	logger := log.FromContext(ctx).WithValues("adaptiveLoadBalancer", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)
	eventAt, tracked := r.propagation.begin(req.NamespacedName)

	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := r.Get(ctx, req.NamespacedName, alb); err != nil {
		// Deleted: the ServiceEntry goes with it through its owner reference.
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !alb.DeletionTimestamp.IsZero() {
		// Being deleted. With foreground deletion the garbage collector removes the ServiceEntry
		// first and the AdaptiveLoadBalancer stays until then: a write now would re-create what
		// it just removed, and block the deletion for as long as the operator keeps writing.
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	logger = logger.WithValues("service", types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name})
	ctx = log.IntoContext(ctx, logger)
	if r.mesh.pending() {
		// The first reading of istiod's count of its remote clusters is under way (the operator
		// just started): without it every Service would be refused for a moment. Its result
		// re-mirrors every Service.
		if tracked {
			r.propagation.restore(req.NamespacedName, eventAt)
		}
		return ctrl.Result{RequeueAfter: clustersPendingRetry}, nil
	}

	outcome, err := r.mirror(ctx, alb)
	if err == nil {
		logNotServed(logger, alb, outcome)
	}
	if err != nil {
		if tracked {
			r.propagation.restore(req.NamespacedName, eventAt)
		}
		r.Metrics.ReconcileErrors.WithLabelValues(errorReason(err)).Inc()
		eventReason := EventWriteFailed
		if errors.As(err, new(*cacheStaleError)) {
			eventReason = EventCacheStale
		}
		r.Recorder.Event(alb, corev1.EventTypeWarning, eventReason, err.Error())
		outcome = r.removeStale(ctx, alb, err)
	} else {
		r.failingSince.Delete(req.NamespacedName)
		// What the ServiceEntry now lists, for the weight cycle's per-endpoint time in it.
		if outcome.status == metav1.ConditionTrue {
			eps := make([]MemberEndpoint, len(outcome.endpoints))
			for i, e := range outcome.endpoints {
				eps[i] = MemberEndpoint{IP: e.IP, Pod: e.Pod, Weight: e.Weight}
			}
			r.Membership.Observe(req.NamespacedName, eps)
		} else {
			r.Membership.Forget(req.NamespacedName)
		}
	}
	if err == nil && tracked {
		d := r.Clock.Since(eventAt)
		r.Metrics.EndpointPropagation.Observe(d.Seconds())
		if r.observePropagation != nil {
			r.observePropagation(d)
		}
	}
	later, statusErr := r.writeStatus(ctx, alb, outcome)
	if statusErr != nil {
		r.Metrics.ReconcileErrors.WithLabelValues("status").Inc()
		return ctrl.Result{}, errors.Join(err, statusErr)
	}
	// Returning the error requeues with controller-runtime's exponential back-off.
	return ctrl.Result{RequeueAfter: later}, err
}

// clustersPendingRetry is how soon a reconcile that waited for the first reading of istiod's
// count of its remote clusters runs again, should that reading's re-mirror of everything be lost.
const clustersPendingRetry = 5 * time.Second

// statusEndpointInterval spaces status writes that only refresh the endpoint list. Under endpoint
// churn the ServiceEntry is written at once while the status, which nothing routes by, follows
// at most once per interval, keeping the API server free for the latency-critical writes.
const statusEndpointInterval = 30 * time.Second

// mirrorOutcome is what the mirror did, for the status.
type mirrorOutcome struct {
	status        metav1.ConditionStatus
	reason        string
	message       string
	serviceEntry  string
	slices        int // how many ServiceEntries serviceEntry's endpoints are split across
	endpoints     []istio.Endpoint
	keepEndpoints bool // an API failure: leave the last reported endpoints in status
	wroteWeights  bool
	// enforcement says whether the clients apply the weights (with a ServiceEntry written).
	enforcement istio.Enforcement
}

func (r *AdaptiveLoadBalancerReconciler) mirror(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (mirrorOutcome, error) {
	if err := r.requireCurrentCaches(); err != nil {
		return mirrorOutcome{}, err
	}
	if err := r.deleteStaleServiceEntries(ctx, alb); err != nil {
		return mirrorOutcome{}, err
	}
	if winner, err := r.conflictWinner(ctx, alb); err != nil {
		return mirrorOutcome{}, err
	} else if winner != "" {
		// The loser may own the ServiceEntry (both created in the same second, or it was
		// reconciled before the cache listed the winner): nothing updates it while the conflict
		// lasts, so it goes, and its deletion lets the winner take the name.
		if err := r.deleteOwnedServiceEntry(ctx, alb, adlbv1.ReasonConflict); err != nil {
			return mirrorOutcome{}, err
		}
		msg := fmt.Sprintf("AdaptiveLoadBalancer %s already targets Service %s; only the oldest one is served. Delete one of them.", winner, alb.Spec.TargetRef.Name)
		r.Recorder.Event(alb, corev1.EventTypeWarning, EventConflict, msg)
		return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonConflict, message: msg}, nil
	}

	svc := &corev1.Service{}
	err := r.Get(ctx, types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}, svc)
	if apierrors.IsNotFound(err) {
		// A ServiceEntry for a Service that is gone would keep routing to pods that are gone too.
		if err := r.deleteOwnedServiceEntry(ctx, alb, adlbv1.ReasonTargetNotFound); err != nil {
			return mirrorOutcome{}, err
		}
		msg := fmt.Sprintf("Service %s/%s not found; create it or fix spec.targetRef.name", alb.Namespace, alb.Spec.TargetRef.Name)
		r.Recorder.Event(alb, corev1.EventTypeWarning, EventTargetNotFound, msg)
		return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonTargetNotFound, message: msg}, nil
	}
	if err != nil {
		return mirrorOutcome{}, fmt.Errorf("get Service %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
	}
	if err := istio.CheckSupported(svc); err != nil {
		if err := r.deleteOwnedServiceEntry(ctx, alb, adlbv1.ReasonUnsupported); err != nil {
			return mirrorOutcome{}, err
		}
		r.Recorder.Event(alb, corev1.EventTypeWarning, EventUnsupported, err.Error())
		return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonUnsupported, message: err.Error()}, nil
	}

	key := types.NamespacedName{Namespace: alb.Namespace, Name: svc.Name}
	cached := &networkingv1.ServiceEntry{}
	err = r.Get(ctx, key, cached)
	switch {
	case apierrors.IsNotFound(err), err == nil && r.Versions.deleted(cached):
		cached = nil // none, or one the operator deleted that the cache still shows
	case err != nil:
		return mirrorOutcome{}, fmt.Errorf("get ServiceEntry %s/%s: %w", key.Namespace, key.Name, err)
	}
	reads := sliceReads{live: map[string]*networkingv1.ServiceEntry{}}
	outcome, err := r.mirrorInto(ctx, alb, svc, r.Versions.newest(key, cached), cached, reads)
	// The cache and the remembered version of a slice disagree, or someone else wrote it since:
	// decide on the API server's current version of that slice; the other slices still come
	// from the cache and the operator's own versions. A retry that fails on another slice reads
	// that one too, a few times at most; the workqueue's back-off does the rest. Gets of the
	// slices concerned, never a list (a list of ServiceEntries is what the API server pays the
	// most for at scale).
	for range maxSliceRetries {
		if !errors.Is(err, errStaleView) && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err) {
			break
		}
		name := failedSlice(err, key.Name)
		sliceKey := types.NamespacedName{Namespace: key.Namespace, Name: name}
		before := r.Versions.snapshot(sliceKey)
		live := &networkingv1.ServiceEntry{}
		if err := r.apiReader.Get(ctx, sliceKey, live); apierrors.IsNotFound(err) {
			live = nil
		} else if err != nil {
			return mirrorOutcome{}, fmt.Errorf("read ServiceEntry %s/%s from the API server: %w", sliceKey.Namespace, sliceKey.Name, err)
		}
		if live != nil && metav1.IsControlledBy(live, alb) {
			// The operator's writes it superseded stay known as such; a write the weight cycle
			// made since the read is not replaced by the older read.
			r.Versions.rememberRead(live, before)
		} else {
			r.Versions.forget(sliceKey)
		}
		reads.live[name] = live
		if name == key.Name {
			cached = live
		}
		outcome, err = r.mirrorInto(ctx, alb, svc, r.Versions.newest(key, cached), cached, reads)
	}
	return outcome, err
}

// maxSliceRetries bounds the retries of one reconcile after write conflicts, each reading the
// slice that failed from the API server.
const maxSliceRetries = 3

// errStaleView: the remembered ServiceEntry already matches, but the cache shows another version
// that does not: either the cache lags the operator's last write or someone else edited it.
var errStaleView = errors.New("cached ServiceEntry differs from the remembered one")

// mirrorInto writes the desired ServiceEntry slices; existing (nil: none) is the newest version
// known of the first, cached the informer's (or, after a conflict on it, the API server's)
// version of it, and reads says which slices were read from the API server.
func (r *AdaptiveLoadBalancerReconciler) mirrorInto(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, svc *corev1.Service, existing, cached *networkingv1.ServiceEntry, reads sliceReads) (mirrorOutcome, error) {
	if existing != nil && !metav1.IsControlledBy(existing, alb) {
		if previous, err := r.ofAPreviousIncarnation(ctx, alb, existing); err != nil {
			return mirrorOutcome{}, err
		} else if previous {
			// The write below makes alb its controller (apply): one update, and the
			// Service's clients keep weighted endpoints throughout.
			log.FromContext(ctx).Info("taking over the ServiceEntry of an earlier AdaptiveLoadBalancer of the same name", "serviceEntry", client.ObjectKeyFromObject(existing),
				"previousOwner", metav1.GetControllerOf(existing).UID)
			r.Recorder.Eventf(alb, corev1.EventTypeNormal, EventServiceEntryTakenOver, "Took over ServiceEntry %s from an earlier AdaptiveLoadBalancer %s (UID %s), deleted before this one was created",
				existing.Name, alb.Name, metav1.GetControllerOf(existing).UID)
			return r.mirrorOwned(ctx, alb, svc, existing, cached, reads)
		}
		// The other slices, if alb has any, would carry the Service's endpoints beside a
		// ServiceEntry nobody keeps in step with them.
		if _, err := r.deleteSlices(ctx, alb, nil, reads, "its first ServiceEntry is someone else's"); err != nil {
			return mirrorOutcome{}, err
		}
		return r.notOwned(alb, errForeignSlice{se: existing}), nil
	}
	return r.mirrorOwned(ctx, alb, svc, existing, cached, reads)
}

// notOwned is the outcome for a ServiceEntry of the Service's, or of one of its slices' names,
// that someone else owns.
func (r *AdaptiveLoadBalancerReconciler) notOwned(alb *adlbv1.AdaptiveLoadBalancer, err errForeignSlice) mirrorOutcome {
	r.Recorder.Event(alb, corev1.EventTypeWarning, EventNotOwned, err.Error())
	return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonServiceEntryNotOwned, message: err.Error()}
}

// ofAPreviousIncarnation reports whether se is adaptive-lb's ServiceEntry written for an earlier
// AdaptiveLoadBalancer of alb's name, deleted before alb was created: labelled as the
// operator's, controlled by an AdaptiveLoadBalancer of that name with another UID. alb must be
// the live object of that name, which the API server confirms (the cache may still hold the
// earlier one while a new one already wrote the ServiceEntry).
func (r *AdaptiveLoadBalancerReconciler) ofAPreviousIncarnation(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, se *networkingv1.ServiceEntry) (bool, error) {
	ref := metav1.GetControllerOf(se)
	if se.Labels[ManagedByLabel] != ManagedByValue || ref == nil || ref.Kind != "AdaptiveLoadBalancer" ||
		!strings.HasPrefix(ref.APIVersion, adlbv1.GroupVersion.Group+"/") || ref.Name != alb.Name || ref.UID == alb.UID {
		return false, nil
	}
	live := &adlbv1.AdaptiveLoadBalancer{}
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(alb), live); err != nil {
		return false, fmt.Errorf("read AdaptiveLoadBalancer %s/%s from the API server to take over the ServiceEntry of its earlier incarnation: %w", alb.Namespace, alb.Name, err)
	}
	return live.UID == alb.UID, nil
}

// mirrorOwned writes the desired ServiceEntry slices over the existing ones; existing, the
// first, alb controls or takes over.
func (r *AdaptiveLoadBalancerReconciler) mirrorOwned(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, svc *corev1.Service, existing, cached *networkingv1.ServiceEntry, reads sliceReads) (mirrorOutcome, error) {
	set, err := r.ownedSlices(ctx, alb, existing, cached, reads)
	if err != nil {
		return mirrorOutcome{}, err
	}
	// What reads the Service's endpoints and record as a whole reads the union of the slices.
	view := set.view()
	in, err := r.gather(ctx, alb, svc, view)
	var spec *apinetworkingv1.ServiceEntry
	var endpoints []istio.Endpoint
	if err == nil {
		spec, endpoints, err = istio.Build(in)
	}
	if reason := refusalReason(err); reason != "" {
		// The Service or the mesh may have changed into a shape that cannot be mirrored (a port
		// renamed, an exportTo annotation, a second cluster, another owner's ServiceEntry): a
		// ServiceEntry written for the old shape is now wrong, and a frozen copy routes to pods
		// that are gone, so it goes.
		if delErr := r.deleteOwnedServiceEntry(ctx, alb, reason); delErr != nil {
			return mirrorOutcome{}, delErr
		}
		r.Recorder.Event(alb, corev1.EventTypeWarning, reason, err.Error())
		return mirrorOutcome{status: metav1.ConditionFalse, reason: reason, message: err.Error()}, nil
	}
	if errors.Is(err, istio.ErrTooLarge) {
		return r.tooLarge(ctx, alb, existing, reads, err)
	}
	if err != nil {
		return mirrorOutcome{}, err
	}
	replanned, plannedAt := r.Membership.replanWeights(alb, view, endpoints)
	undone := false
	if replanned == nil {
		replanned, plannedAt = r.Membership.undoReplan(alb, endpoints)
		undone = replanned != nil
	}
	if replanned != nil {
		// Endpoints left: the survivors' re-planned weights go out in this same write; or the
		// ones that had left are back: the weights before that re-plan do.
		if in.Weights == nil {
			in.Weights = map[string]uint32{}
		}
		maps.Copy(in.Weights, replanned)
		if spec, endpoints, err = istio.Build(in); err != nil {
			return mirrorOutcome{}, err
		}
		msg := "weights re-planned for the endpoints that stay"
		if undone {
			msg = "the endpoints that had left are back: the weights from before they left are restored"
		}
		log.FromContext(ctx).Info(msg, "endpoints", len(endpoints))
	}
	var stamp time.Time
	if replanned != nil {
		stamp = plannedAt
	}
	count, err := r.writeSlices(ctx, alb, set, spec, endpoints, stamp, reads, WriteReasonEndpoints)
	var foreign errForeignSlice
	switch {
	case errors.As(err, &foreign):
		if _, err := r.deleteSlices(ctx, alb, existing, reads, fmt.Sprintf("ServiceEntry %s, which one of its slices needs, is someone else's", foreign.se.Name)); err != nil {
			return mirrorOutcome{}, err
		}
		return r.notOwned(alb, foreign), nil
	case errors.Is(err, istio.ErrTooLarge):
		return r.tooLarge(ctx, alb, existing, reads, err)
	case err != nil:
		return mirrorOutcome{}, err
	}
	switch {
	case undone:
		r.Membership.Replanned(client.ObjectKeyFromObject(alb), nil, nil)
	case replanned != nil:
		// Only once the write has landed: the status names these weights as re-planned, and
		// the pods that left may come back to the weights before.
		byIP := make(map[string]uint32, len(endpoints))
		for _, e := range endpoints {
			byIP[e.IP] = e.Weight
		}
		r.Membership.Replanned(client.ObjectKeyFromObject(alb), byIP, appliedBefore(existing, in.Pods))
	}
	return mirrorOutcome{
		enforcement: istio.Enforce(in, endpoints),
		status:      metav1.ConditionTrue,
		reason:      adlbv1.ReasonMirrored,
		// No endpoint count here: a message that changes with every endpoint change would defeat
		// the throttle on endpoint-only status writes (the count is in status.endpointCount).
		// The evidence that the mesh is one cluster is said too: it is why the weights are safe.
		message:      fmt.Sprintf("ServiceEntry %s mirrors the ready endpoints of Service %s; the mesh is one cluster: %s", svc.Name, svc.Name, in.Mesh.SingleCluster),
		serviceEntry: svc.Name,
		slices:       count,
		endpoints:    endpoints,
	}, nil
}

// tooLarge removes the Service's slices, which would keep overriding the Kubernetes endpoints
// while every further write fails, so that clients fall back to all endpoints.
func (r *AdaptiveLoadBalancerReconciler) tooLarge(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, existing *networkingv1.ServiceEntry, reads sliceReads, tooLarge error) (mirrorOutcome, error) {
	if _, err := r.deleteSlices(ctx, alb, existing, reads, "the Service is too large to mirror"); err != nil {
		return mirrorOutcome{}, err
	}
	r.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonTooManyEndpoints, tooLarge.Error())
	return mirrorOutcome{status: metav1.ConditionFalse, reason: adlbv1.ReasonTooManyEndpoints, message: tooLarge.Error()}, nil
}

// desiredServiceEntry is what the mirror writes to one slice: its name, its spec, and the
// operator's record of the weights it applied to the slice's endpoints (applied.go).
type desiredServiceEntry struct {
	name string
	// owner and service are the AdaptiveLoadBalancer's and its target's names, which the slice
	// carries as labels (stampLabels): the stale removal and the watchdog find slices by them.
	owner, service string
	spec           *apinetworkingv1.ServiceEntry
	applied        appliedWeights
	// replannedAt, when set, is the time of the re-plan this write carries; otherwise the
	// ServiceEntry keeps the time of its last re-plan.
	replannedAt time.Time
}

// upToDate reports whether the ServiceEntry already has the desired spec and record, and is
// marked as ours, with every label the operator stamps (a stripped one is put back: the stale
// removal and the watchdog find slices by them), and not as another installation's
// (installLabelCurrent).
func (r *AdaptiveLoadBalancerReconciler) upToDate(se *networkingv1.ServiceEntry, want desiredServiceEntry) bool {
	return proto.Equal(&se.Spec, want.spec) && se.Labels[ManagedByLabel] == ManagedByValue &&
		se.Labels[ServiceEntryOwnerLabel] == want.owner && se.Labels[ServiceLabel] == want.service &&
		installLabelCurrent(se.Labels, r.InstallID) && recordCurrent(se, want.applied) &&
		(want.replannedAt.IsZero() || replannedAt(se).Equal(want.replannedAt))
}

// stampRecord writes want's record into se's annotations.
func stampRecord(se *networkingv1.ServiceEntry, want desiredServiceEntry) {
	setAnnotation(se, AppliedWeightsAnnotation, want.applied.String())
	if !want.replannedAt.IsZero() {
		setAnnotation(se, ReplannedAtAnnotation, formatReplannedAt(want.replannedAt))
	}
}

// installLabelCurrent reports whether labels need no write for the installation label alone.
// One naming another installation (the Lease was renamed or moved) is rewritten at once: this
// installation's watchdog would never delete it. One without the label (written by an operator
// older than it) gets it with its next write: every watchdog deletes those, which is safe, and
// restamping them all at once would rewrite every ServiceEntry at the upgrade (10,000 writes and
// as many istiod pushes at 10,000 Services, queued before the endpoint changes).
func installLabelCurrent(labels map[string]string, installID string) bool {
	got, ok := labels[InstallLabel]
	return installID == "" || !ok || got == installID
}

// stampLabels marks se as this operator's, owned by alb.
func (r *AdaptiveLoadBalancerReconciler) stampLabels(se *networkingv1.ServiceEntry, alb *adlbv1.AdaptiveLoadBalancer) {
	if se.Labels == nil {
		se.Labels = map[string]string{}
	}
	se.Labels[ManagedByLabel] = ManagedByValue
	se.Labels[ServiceEntryOwnerLabel] = alb.Name
	se.Labels[ServiceLabel] = alb.Spec.TargetRef.Name
	if r.InstallID != "" {
		se.Labels[InstallLabel] = r.InstallID
	}
}

// conflictWinner returns the name of an older AdaptiveLoadBalancer targeting the same Service,
// or "" when this one is the oldest (ties broken by name, so every replica agrees).
func (r *AdaptiveLoadBalancerReconciler) conflictWinner(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (string, error) {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := r.List(ctx, &list, client.InNamespace(alb.Namespace), client.MatchingFields{indexTargetName: alb.Spec.TargetRef.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("list AdaptiveLoadBalancers targeting %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
	}
	for _, other := range list.Items {
		// One being deleted no longer counts: its ServiceEntry is going, and waiting for the
		// deletion to finish would leave the Service unserved for the garbage collector's delay.
		if other.UID == alb.UID || !other.DeletionTimestamp.IsZero() {
			continue
		}
		if older(&other, alb) {
			return other.Name, nil
		}
	}
	return "", nil
}

func older(a, b *adlbv1.AdaptiveLoadBalancer) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// gather collects the builder's input from the informer caches: no API calls, no lists beyond
// indexed lookups. The slices, pods and nodes are the cache's own objects, not copies (the
// reads run on every endpoint change): istio.Build only reads its input, and nothing else here
// may modify them.
func (r *AdaptiveLoadBalancerReconciler) gather(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, svc *corev1.Service, existing *networkingv1.ServiceEntry) (istio.Input, error) {
	var slices discoveryv1.EndpointSliceList
	if err := r.List(ctx, &slices, client.InNamespace(svc.Namespace), client.MatchingFields{indexSliceService: svc.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return istio.Input{}, fmt.Errorf("list EndpointSlices of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	mesh, err := r.mesh.gather(ctx, r.Client)
	if err != nil {
		return istio.Input{}, err
	}
	others, err := r.otherServiceEntries(ctx, alb, svc)
	if err != nil {
		return istio.Input{}, err
	}
	in := istio.Input{
		Service:       svc,
		Pods:          map[string]*corev1.Pod{},
		Nodes:         map[string]*corev1.Node{},
		ClusterDomain: r.ClusterDomain,
		Ports:         alb.Spec.Ports,
		ExportTo:      alb.Spec.ExportTo,
		MaxEndpoints:  r.MaxEndpoints,
		Mesh:          mesh,
		Others:        others,
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: svc.Namespace}, ns, client.UnsafeDisableDeepCopy); err == nil {
		in.Namespace = ns
	} else if !apierrors.IsNotFound(err) {
		return istio.Input{}, fmt.Errorf("get Namespace %s: %w", svc.Namespace, err)
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		in.Slices = append(in.Slices, s)
		for _, ep := range s.Endpoints {
			if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
				continue
			}
			if _, done := in.Pods[ep.TargetRef.Name]; done {
				continue
			}
			pod := &corev1.Pod{}
			err := r.Get(ctx, types.NamespacedName{Namespace: svc.Namespace, Name: ep.TargetRef.Name}, pod, client.UnsafeDisableDeepCopy)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return istio.Input{}, fmt.Errorf("get Pod %s/%s: %w", svc.Namespace, ep.TargetRef.Name, err)
			}
			in.Pods[pod.Name] = pod
			if pod.Spec.NodeName != "" {
				if _, done := in.Nodes[pod.Spec.NodeName]; !done {
					// Nodes are cached trimmed (trimNode); their labels are all the mirror reads.
					node := &corev1.Node{}
					if err := r.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, node, client.UnsafeDisableDeepCopy); err == nil {
						in.Nodes[node.Name] = node
					} else if !apierrors.IsNotFound(err) {
						return istio.Input{}, fmt.Errorf("get Node %s: %w", pod.Spec.NodeName, err)
					}
				}
			}
		}
	}
	recent := func(ip, pod string) (uint32, bool) {
		return r.Membership.RecentWeight(client.ObjectKeyFromObject(alb), ip, pod)
	}
	in.Weights, in.DefaultWeight = currentWeights(alb, existing, in.Pods, in.Nodes, recent)
	return in, nil
}

// refusalReason is the condition reason for a Service the mirror cannot represent, or "" when
// err is no such refusal. Each refusal removes the ServiceEntry.
func refusalReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, istio.ErrUnsupported):
		return adlbv1.ReasonUnsupported
	case errors.Is(err, istio.ErrNoPorts):
		return adlbv1.ReasonNoPorts
	case errors.Is(err, istio.ErrMultiCluster):
		return adlbv1.ReasonMultiCluster
	case errors.Is(err, istio.ErrAmbientIstioVersion):
		return adlbv1.ReasonAmbientUnsupportedIstioVersion
	case errors.Is(err, istio.ErrConflict):
		return adlbv1.ReasonConflict
	case errors.Is(err, istio.ErrMeshConfig):
		return adlbv1.ReasonMeshConfigInvalid
	}
	return ""
}

// apply creates or updates one slice when, and only when, the desired spec or record differs,
// and returns the version written (existing when up to date).
func (r *AdaptiveLoadBalancerReconciler) apply(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, existing *networkingv1.ServiceEntry, want desiredServiceEntry, reason string) (*networkingv1.ServiceEntry, error) {
	name, spec := want.name, want.spec
	if existing == nil {
		se := &networkingv1.ServiceEntry{
			ObjectMeta: metav1.ObjectMeta{
				Name:      name,
				Namespace: alb.Namespace,
			},
		}
		r.stampLabels(se, alb)
		stampRecord(se, want)
		proto.Merge(&se.Spec, spec)
		if err := controllerutil.SetControllerReference(alb, se, r.Scheme); err != nil {
			return nil, fmt.Errorf("set owner of ServiceEntry %s/%s: %w", alb.Namespace, name, err)
		}
		started := time.Now()
		err := r.Create(ctx, se)
		r.Metrics.ServiceEntryWriteDuration.Observe(time.Since(started).Seconds())
		if err != nil {
			return nil, fmt.Errorf("create ServiceEntry %s/%s: %w", alb.Namespace, name, err)
		}
		r.Versions.remember(se)
		r.Metrics.ServiceEntryWrites.WithLabelValues(reason).Inc()
		r.Recorder.Eventf(alb, corev1.EventTypeNormal, EventServiceEntryCreated, "Created ServiceEntry %s with %d endpoints", name, len(spec.Endpoints))
		log.FromContext(ctx).Info("ServiceEntry created", "serviceEntry", client.ObjectKeyFromObject(se), "endpoints", len(spec.Endpoints), "writeReason", reason)
		return se, nil
	}
	if r.upToDate(existing, want) && metav1.IsControlledBy(existing, alb) {
		return existing, nil
	}
	// An update based on the newest known version (see serviceEntryVersions): it conflicts only
	// when someone else wrote since, and then the caller reads the live object and retries.
	updated := existing.DeepCopy()
	updated.Spec.Reset()
	proto.Merge(&updated.Spec, spec)
	r.stampLabels(updated, alb)
	stampRecord(updated, want)
	if !metav1.IsControlledBy(updated, alb) {
		// Taken over from an earlier AdaptiveLoadBalancer of the same name (mirrorInto checked).
		updated.OwnerReferences = slices.DeleteFunc(updated.OwnerReferences, func(ref metav1.OwnerReference) bool {
			return ref.Controller != nil && *ref.Controller
		})
		if err := controllerutil.SetControllerReference(alb, updated, r.Scheme); err != nil {
			return nil, fmt.Errorf("set owner of ServiceEntry %s/%s: %w", alb.Namespace, name, err)
		}
	}
	started := time.Now()
	err := r.Update(ctx, updated)
	r.Metrics.ServiceEntryWriteDuration.Observe(time.Since(started).Seconds())
	if err != nil {
		return nil, fmt.Errorf("update ServiceEntry %s/%s: %w", alb.Namespace, name, err)
	}
	r.Versions.rememberWrite(updated, existing)
	r.Metrics.ServiceEntryWrites.WithLabelValues(reason).Inc()
	log.FromContext(ctx).Info("ServiceEntry updated", "serviceEntry", client.ObjectKeyFromObject(updated), "endpoints", len(spec.Endpoints), "writeReason", reason)
	return updated, nil
}

// deleteOwnedServiceEntry removes the ServiceEntry this AdaptiveLoadBalancer owns, if any, because
// of reason (a condition reason: why the Service cannot be mirrored).
func (r *AdaptiveLoadBalancerReconciler) deleteOwnedServiceEntry(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, reason string) error {
	key := types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}
	se := &networkingv1.ServiceEntry{}
	err := r.Get(ctx, key, se)
	if apierrors.IsNotFound(err) {
		// The cache may not have seen a ServiceEntry this operator created a moment ago, and its
		// watch event, the operator's own write, starts no reconcile (notOwnWrite): the version
		// remembered from that write stands in for it.
		se, err = r.Versions.newest(key, nil), nil
	}
	if err != nil {
		return fmt.Errorf("get ServiceEntry %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
	}
	_, err = r.deleteSlices(ctx, alb, se, sliceReads{}, fmt.Sprintf("its Service cannot be mirrored (%s)", reason))
	return err
}

// deleteServiceEntry deletes se if alb controls it; why completes the event's message.
func (r *AdaptiveLoadBalancerReconciler) deleteServiceEntry(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, se *networkingv1.ServiceEntry, why string) error {
	if controlled, _, err := r.deleteIfControlled(ctx, alb, se); err != nil || !controlled {
		return err
	}
	r.Recorder.Eventf(alb, corev1.EventTypeNormal, EventServiceEntryDeleted, "Deleted ServiceEntry %s: %s", se.Name, why)
	log.FromContext(ctx).Info("ServiceEntry deleted; traffic falls back to the Kubernetes endpoints", "serviceEntry", client.ObjectKeyFromObject(se), "why", why)
	return nil
}

// deleteIfControlled deletes se if alb controls it, under se's UID as a precondition, and forgets
// the version last written to it. It reports whether alb controlled se and whether the API server
// still had it to delete.
func (r *AdaptiveLoadBalancerReconciler) deleteIfControlled(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, se *networkingv1.ServiceEntry) (controlled, deleted bool, err error) {
	if !metav1.IsControlledBy(se, alb) {
		return false, false, nil
	}
	err = r.Delete(ctx, se, client.Preconditions{UID: &se.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return true, false, fmt.Errorf("delete ServiceEntry %s/%s: %w", se.Namespace, se.Name, err)
	}
	r.Versions.forgetDeletedByOperator(se)
	return true, err == nil, nil
}

// deleteStaleServiceEntries removes the ServiceEntries this AdaptiveLoadBalancer controls under
// another name than its target's. They are left by a spec.targetRef change (immutable at
// admission now, but objects from before that, or from a CRD installed without the rule,
// remain): the old Service's clients would keep the old endpoints forever, and the garbage
// collector never removes them while their owner lives.
func (r *AdaptiveLoadBalancerReconciler) deleteStaleServiceEntries(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) error {
	// Runs on every reconcile: the cache's own objects are only read here (no deep copy of the
	// target's ServiceEntry, up to a megabyte, per endpoint change).
	var owned networkingv1.ServiceEntryList
	if err := r.List(ctx, &owned, client.InNamespace(alb.Namespace), client.MatchingFields{indexServiceEntryController: string(alb.UID)}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list ServiceEntries owned by AdaptiveLoadBalancer %s/%s: %w", alb.Namespace, alb.Name, err)
	}
	for _, cached := range owned.Items {
		if _, slice := istio.SliceIndex(alb.Spec.TargetRef.Name, cached.Name); slice || !metav1.IsControlledBy(cached, alb) {
			continue
		}
		se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: cached.Namespace, Name: cached.Name, UID: cached.UID}}
		if err := r.Delete(ctx, se, client.Preconditions{UID: &se.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ServiceEntry %s/%s, left from an earlier target of AdaptiveLoadBalancer %s: %w", se.Namespace, se.Name, alb.Name, err)
		}
		r.Versions.forgetDeletedByOperator(se)
		r.Recorder.Eventf(alb, corev1.EventTypeNormal, EventServiceEntryDeleted, "Deleted ServiceEntry %s: it mirrors Service %s, which is no longer the target", se.Name, se.Name)
	}
	return nil
}

// forget drops what the reconciler keeps in memory for an AdaptiveLoadBalancer that is gone or
// going: its status throttle, a pending propagation measure, its per-endpoint weight series and
// its membership record (which the weight cycle also prunes, but no cycle runs without a TSDB).
func (r *AdaptiveLoadBalancerReconciler) forget(key types.NamespacedName) {
	r.statusThrottle.retain(func(k types.NamespacedName) bool { return k != key })
	r.failingSince.Delete(key)
	r.Membership.Forget(key)
	r.propagation.begin(key)
	r.Metrics.SetEndpointWeights(key.Namespace, key.Name, nil, nil)
}

// logNotServed logs, once per change, why an AdaptiveLoadBalancer is not served (a conflict, a
// ServiceEntry it does not own, an unsupported or missing Service): these outcomes repeat on
// every reconcile, and only the change of reason or message is news. The previous outcome is
// the EndpointsMirrored condition, which only this reconciler sets.
func logNotServed(logger logr.Logger, alb *adlbv1.AdaptiveLoadBalancer, o mirrorOutcome) {
	if o.status != metav1.ConditionFalse {
		return
	}
	prev := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored)
	if prev != nil && prev.Reason == o.reason && prev.Message == o.message {
		return
	}
	logger.Info("AdaptiveLoadBalancer not served", "reason", o.reason, "message", o.message)
}

// writeStatus computes the mirror's part of the status (see status.go for who owns what) and,
// when it changed, hands it to the status queue (or, without one, writes it under an optimistic
// lock), so that the reconcile's worker is free for the next endpoint change as soon as the
// ServiceEntry is written. A change of the endpoint list alone is written at most once per
// statusEndpointInterval; it then returns how long to wait before the deferred write. The
// throttle decides on the cached object; a write under way completes what was decided.
func (r *AdaptiveLoadBalancerReconciler) writeStatus(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, o mirrorOutcome) (time.Duration, error) {
	now := metav1.NewTime(r.Clock.Now())
	key := client.ObjectKeyFromObject(alb)
	if !o.keepEndpoints && alb.Spec.Mode != adlbv1.ModeDryRun {
		ws, pods := map[string]int{}, map[string]string{}
		for _, e := range o.endpoints {
			ws[e.IP], pods[e.IP] = int(e.Weight), e.Pod
		}
		r.Metrics.SetEndpointWeights(alb.Namespace, alb.Name, ws, pods)
	}
	status := r.mirrorStatus(alb, o, now)
	// A change still in the status queue is not in the cache: a status equal to the cache's may
	// differ from the one about to be written (a ServiceEntry created, then deleted before its
	// status landed), so it is handed over all the same; the write decides on the object.
	if apiequality.Semantic.DeepEqual(&alb.Status, status) && (r.StatusQueue == nil || !r.StatusQueue.holds(key)) {
		return 0, nil
	}
	// An empty ServiceEntry, or the first endpoints after none, is news the ENDPOINTS column
	// must show at once.
	if endpointsOnly(&alb.Status, status) && (alb.Status.EndpointCount == 0) == (status.EndpointCount == 0) {
		if wait := r.statusThrottle.wait(key, r.Clock.Now(), statusEndpointInterval); wait > 0 {
			return wait, nil
		}
	}
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		status := r.mirrorStatus(alb, o, now)
		if apiequality.Semantic.DeepEqual(&alb.Status, status) {
			return false
		}
		alb.Status = *status
		return true
	}
	if r.StatusQueue != nil {
		// The throttle counts from the hand-over: until the write lands, further endpoint-only
		// changes wait for it instead of piling up in the queue.
		r.statusThrottle.wrote(key, r.Clock.Now())
		r.StatusQueue.enqueue(key, statusChange{mutate: mutate, persist: true})
		return 0, nil
	}
	written, err := updateStatus(ctx, r.Client, r.apiReader, alb, mutate)
	if err != nil {
		return 0, err
	}
	if written {
		r.statusThrottle.wrote(key, r.Clock.Now())
	}
	return 0, nil
}

// mirrorStatus is alb's status with the mirror's part set from outcome o at now.
func (r *AdaptiveLoadBalancerReconciler) mirrorStatus(alb *adlbv1.AdaptiveLoadBalancer, o mirrorOutcome, now metav1.Time) *adlbv1.AdaptiveLoadBalancerStatus {
	key := client.ObjectKeyFromObject(alb)
	status := alb.Status.DeepCopy()
	gen := alb.Generation
	status.ObservedGeneration = gen
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: adlbv1.ConditionEndpointsMirrored, Status: o.status, Reason: o.reason, Message: o.message, ObservedGeneration: gen})
	// MetricsAvailable and WeightsApplied belong to the weight cycle: only placeholders
	// while they are absent, so that a new object shows every condition at once.
	if meta.FindStatusCondition(status.Conditions, adlbv1.ConditionMetricsAvailable) == nil {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionUnknown, Reason: adlbv1.ReasonAwaitingMetrics, Message: "no weight cycle has fetched metrics for this Service yet", ObservedGeneration: gen})
	}
	// The mirror decides whether a ServiceEntry exists, so it alone says NoServiceEntry,
	// and replaces that (or an absent condition) by the equal-weights placeholder once the
	// ServiceEntry is written. Every other WeightsApplied value comes from the weight cycle.
	// A spec change also refreshes a condition that only states the mode (equal weights,
	// DryRun, Frozen): without a TSDB no weight cycle runs to do it.
	switch c := meta.FindStatusCondition(status.Conditions, adlbv1.ConditionWeightsApplied); {
	case o.status != metav1.ConditionTrue && !o.keepEndpoints:
		meta.SetStatusCondition(&status.Conditions, placeholderWeightsCondition(alb, false))
	case o.status == metav1.ConditionTrue && (c == nil || c.Reason == adlbv1.ReasonNoServiceEntry ||
		(c.ObservedGeneration != gen && modeOnlyReason(c.Reason))):
		meta.SetStatusCondition(&status.Conditions, placeholderWeightsCondition(alb, true))
	}
	if c := weightsEnforcedCondition(o, gen); c != nil {
		meta.SetStatusCondition(&status.Conditions, *c)
	}
	if !o.keepEndpoints {
		status.ServiceEntry = o.serviceEntry
		status.ServiceEntrySlices = int32(o.slices)
		status.EndpointCount = int32(len(o.endpoints))
		replanned := func(ip string, weight uint32) bool { return r.Membership.ReplannedWeight(key, ip, weight) }
		status.Endpoints, status.EndpointsTruncated = endpointStatus(alb.Status.Endpoints, o.endpoints, now, alb.Spec.Mode == adlbv1.ModeDryRun, replanned)
	}
	meta.SetStatusCondition(&status.Conditions, readyCondition(status.Conditions, gen))
	return status
}

// weightsEnforcedCondition is WeightsEnforced for the mirror's outcome: what the mirror found
// about the clients when it wrote the ServiceEntry, False NoServiceEntry when there is none, and
// nil (unchanged) after an API failure, which decided nothing.
func weightsEnforcedCondition(o mirrorOutcome, gen int64) *metav1.Condition {
	c := &metav1.Condition{Type: adlbv1.ConditionWeightsEnforced, ObservedGeneration: gen}
	switch {
	case o.status == metav1.ConditionTrue && o.enforcement.Reason == "":
		return nil // an outcome that evaluated no clients (none in production) decides nothing
	case o.status == metav1.ConditionTrue:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(o.enforcement.Reason), o.enforcement.Message
		if o.enforcement.Enforced {
			c.Status = metav1.ConditionTrue
		}
	case o.reason == adlbv1.ReasonWriteFailed || o.keepEndpoints:
		return nil
	default:
		none := noServiceEntryEnforced(gen)
		return &none
	}
	return c
}

// noServiceEntryEnforced is WeightsEnforced while there is no ServiceEntry to carry weights.
func noServiceEntryEnforced(gen int64) metav1.Condition {
	return metav1.Condition{Type: adlbv1.ConditionWeightsEnforced, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonNoServiceEntry,
		Message: "no ServiceEntry to weight; see EndpointsMirrored", ObservedGeneration: gen}
}

// modeOnlyReason reports whether a WeightsApplied reason follows from the mode alone.
func modeOnlyReason(reason string) bool {
	return reason == adlbv1.ReasonEqualWeights || reason == adlbv1.ReasonDryRun || reason == adlbv1.ReasonFrozen
}

// placeholderWeightsCondition is WeightsApplied before the weight cycle has reported: equal
// weights when a ServiceEntry exists, NoServiceEntry when there is none to weight.
func placeholderWeightsCondition(alb *adlbv1.AdaptiveLoadBalancer, haveServiceEntry bool) metav1.Condition {
	gen := alb.Generation
	switch {
	case !haveServiceEntry:
		return metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonNoServiceEntry, Message: "no ServiceEntry to weight; see EndpointsMirrored", ObservedGeneration: gen}
	case alb.Spec.Mode == adlbv1.ModeDryRun:
		return metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonDryRun, Message: "mode is DryRun: weights are computed and published, never written", ObservedGeneration: gen}
	case alb.Spec.Mode == adlbv1.ModeFrozen:
		return metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonFrozen, Message: "mode is Frozen: the weights in the ServiceEntry are kept as they are", ObservedGeneration: gen}
	}
	return metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonEqualWeights, Message: "endpoints carry equal weights until a weight cycle runs", ObservedGeneration: gen}
}

// endpointsOnly reports whether two statuses differ only in the mirrored endpoint list.
func endpointsOnly(old, updated *adlbv1.AdaptiveLoadBalancerStatus) bool {
	a, b := old.DeepCopy(), updated.DeepCopy()
	for _, s := range []*adlbv1.AdaptiveLoadBalancerStatus{a, b} {
		s.Endpoints, s.EndpointCount, s.EndpointsTruncated = nil, 0, false
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

// ReasonReplanned is an endpoint's reason in status while its weight is the one the mirror
// re-planned when endpoints left (the weight cycle's reasons replace it at its next write).
const ReasonReplanned = "re-planned for the endpoints that stay when others left"

// endpointStatus lists the mirrored endpoints, keeping each one's LastChange while its weight
// holds. A changed weight that replanned (nil: none) reports as the mirror's re-plan gets
// ReasonReplanned.
func endpointStatus(previous []adlbv1.EndpointStatus, eps []istio.Endpoint, now metav1.Time, dryRun bool, replanned func(ip string, weight uint32) bool) ([]adlbv1.EndpointStatus, bool) {
	prev := make(map[string]adlbv1.EndpointStatus, len(previous))
	for _, p := range previous {
		prev[p.IP] = p
	}
	n := min(len(eps), adlbv1.MaxStatusEndpoints)
	out := make([]adlbv1.EndpointStatus, 0, n)
	for _, e := range eps[:n] {
		w := int32(min(e.Weight, math.MaxInt32))
		st := adlbv1.EndpointStatus{Pod: e.Pod, IP: e.IP, Zone: e.Zone, Weight: w, LastChange: &now}
		if !dryRun && replanned != nil && replanned(e.IP, e.Weight) {
			st.Reason = ReasonReplanned
		}
		if p, ok := prev[e.IP]; ok && p.Pod == e.Pod {
			// The weight cycle's view of the same pod (its signals, its reason and, in DryRun,
			// the weight it computed but never wrote) stays until the next cycle replaces it.
			// Otherwise the endpoint list refresh would put the ServiceEntry's equal weights
			// back into a DryRun status every few seconds.
			if dryRun {
				st.Weight = p.Weight
			}
			if p.Weight == st.Weight {
				st.LastChange, st.Reason = p.LastChange, p.Reason
				st.CPUCores, st.RequestRate = p.CPUCores, p.RequestRate
			}
		}
		out = append(out, st)
	}
	if len(out) == 0 {
		out = nil
	}
	return out, len(eps) > n
}

func errorReason(err error) string {
	switch {
	case errors.As(err, new(*cacheStaleError)):
		return "cache_stale"
	case apierrors.IsConflict(err):
		return "conflict"
	case apierrors.IsTooManyRequests(err):
		return "throttled"
	case apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case apierrors.IsForbidden(err):
		return "forbidden"
	case apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err):
		return "server_error"
	}
	return "other"
}

// requeueAfterError bounds how long a failed reconcile may wait; controller-runtime's rate
// limiter already backs off exponentially up to this.
const requeueAfterError = 5 * time.Minute
