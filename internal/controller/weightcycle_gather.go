package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// dueTarget is one AdaptiveLoadBalancer due this cycle, with what the engine needs.
type dueTarget struct {
	key      types.NamespacedName
	alb      *adlbv1.AdaptiveLoadBalancer
	se       *networkingv1.ServiceEntry   // the union of the slices (unionView): read only
	slices   []*networkingv1.ServiceEntry // the ServiceEntry slices, the first named as the Service
	settings weights.Settings
	interval time.Duration
	queries  metrics.QueryTemplates
	// overridesIgnored: the spec has query overrides and the operator does not allow them.
	overridesIgnored bool
	pods             map[string]*corev1.Pod // by IP
	podOrder         []string               // IPs in ServiceEntry order
	current          map[string]int         // applied weight by IP (the operator's record, else the ServiceEntry's)
	slicePod         map[string]string      // the pod the EndpointSlices list at each IP, by which the record names it
	peerGroup        map[string]string      // instance type by IP
	nodeCPU          map[string]float64     // allocatable CPU of the pod's node by IP, when known
	lastWrite        time.Time
	// replannedAt is the time of the mirror's last re-plan in the ServiceEntry this cycle read:
	// a later one in the version it writes to means the mirror re-planned since (writeWeights).
	replannedAt time.Time
	// observed is what the engine was given this cycle, and health what the metrics were like.
	observed cycle.Target
	health   metricsHealth
	// writeErr is the failure of this cycle's weight write; reached, after a failure part-way
	// over the slices, the weights by address of the slices written before it (nil: none).
	writeErr error
	reached  map[string]int
	// serviceRate is the Service's request rate this cycle: the sum of its pods' usable rates.
	serviceRate float64
	// peak is the highest of the Service's rates within peakRateWindow, for status.recentPeak;
	// hasPeak is false when none was observed.
	peak    rateObservation
	hasPeak bool
	// surge is the tail algorithm's surge bound in force for this cycle, and why.
	surge surgeInForce
	// warmup is the slow-start duration of the Service's DestinationRule, if any: Envoy ramps
	// new endpoints up over it, so their early signals do not show their capacity. warmupErr
	// says why it is unknown (then 0).
	warmup    time.Duration
	warmupErr error
}

// idleTarget is an AdaptiveLoadBalancer the cycle does not weight because its mode is Frozen;
// the cycle still owns its MetricsAvailable and WeightsApplied conditions.
type idleTarget struct {
	alb        *adlbv1.AdaptiveLoadBalancer
	conditions []metav1.Condition
}

// frozenConditions are a Frozen AdaptiveLoadBalancer's MetricsAvailable and WeightsApplied.
var frozenConditions = []metav1.Condition{
	{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionUnknown, Reason: adlbv1.ReasonFrozen, Message: "mode is Frozen: no metrics are fetched"},
	{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonFrozen, Message: "mode is Frozen: the weights in the ServiceEntry are kept as they are"},
}

// failedTarget is a due AdaptiveLoadBalancer whose inputs the cycle could not read.
type failedTarget struct {
	alb *adlbv1.AdaptiveLoadBalancer
	err error
}

// gathered is what one cycle gathered: the targets to plan, the Frozen ones, and the ones whose
// inputs could not be read. One target's failure never stops the others'.
type gathered struct {
	due    []*dueTarget
	idle   []idleTarget
	failed []failedTarget
}

func (w *WeightCycle) dueTargets(ctx context.Context, now time.Time) (gathered, error) {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := w.Client.List(ctx, &list); err != nil {
		return gathered{}, fmt.Errorf("list AdaptiveLoadBalancers: %w", err)
	}
	w.forgetGone(list.Items)
	var g gathered
	present := make(map[types.NamespacedName]bool, len(list.Items))
	for i := range list.Items {
		present[client.ObjectKeyFromObject(&list.Items[i])] = true
	}
	w.Membership.Retain(present) // forgetGone above dropped the cycle's own state
	nodes := map[string]nodeFacts{}
	for i := range list.Items {
		alb := &list.Items[i]
		key := client.ObjectKeyFromObject(alb)
		if !alb.DeletionTimestamp.IsZero() {
			continue // its ServiceEntry is being deleted; a weight write must not race that
		}
		// Intervals are whole multiples of the tick, so every Service's cycle lands on a tick.
		interval := w.roundedInterval(alb)
		st := w.states[key]
		if last, ok := w.lastRun[key]; ok && now.Sub(last) < interval && st.DeferredSince.IsZero() {
			continue
		}
		c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored)
		if c == nil || c.Status != metav1.ConditionTrue {
			continue // nothing mirrored yet, or a condition the mirror reports
		}
		if alb.Spec.Mode == adlbv1.ModeFrozen {
			g.idle = append(g.idle, idleTarget{alb: alb, conditions: frozenConditions})
			// A later switch back to Active starts a new hold history.
			delete(w.states, key)
			continue
		}
		settings, err := EngineSettings(alb)
		if err != nil {
			continue // rejected at admission in practice; the mirror reports it
		}
		// One Service's reads may take a tenth of the cycle at most: a read that blocks (an
		// informer that cannot sync) must not use up the others' time.
		gatherCtx, cancel := context.WithTimeout(ctx, max(w.timeout()/10, time.Second))
		d, err := w.gather(gatherCtx, alb, settings, interval, nodes)
		cancel()
		switch {
		case err != nil:
			g.failed = append(g.failed, failedTarget{alb: alb, err: err})
		case d != nil:
			g.due = append(g.due, d)
		}
	}
	sort.Slice(g.due, func(i, j int) bool { return g.due[i].key.String() < g.due[j].key.String() })
	return g, nil
}

// gather reads what the engine needs for one due AdaptiveLoadBalancer: its ServiceEntry, the
// pods at its addresses and their nodes, and its Service's warm-up. It returns nil when there is
// nothing to weight (no ServiceEntry of its own yet). nodes memoises the cycle's node reads.
func (w *WeightCycle) gather(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, settings weights.Settings, interval time.Duration, nodes map[string]nodeFacts) (*dueTarget, error) {
	se := &networkingv1.ServiceEntry{}
	if err := w.Client.Get(ctx, types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}, se); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil // the mirror has just deleted it, or is about to create it
		}
		return nil, fmt.Errorf("get ServiceEntry %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
	}
	if !metav1.IsControlledBy(se, alb) {
		return nil, nil
	}
	sliced, err := w.serviceEntrySlices(ctx, alb, se)
	if err != nil {
		return nil, err
	}
	w.newestSlices(sliced)
	se = unionView(sliced)
	d := &dueTarget{key: client.ObjectKeyFromObject(alb), alb: alb, se: se, slices: sliced, settings: settings, interval: interval, pods: map[string]*corev1.Pod{},
		current: map[string]int{}, peerGroup: map[string]string{}, nodeCPU: map[string]float64{}}
	if w.Warmups != nil {
		// Unknown warm-ups are no reason to stop: new pods' first signals are still discounted by
		// their time in the ServiceEntry (minMembershipShare); WeightsApplied says what is missing.
		d.warmup, d.warmupErr = w.Warmups.Warmup(ctx, alb)
	}
	if m := alb.Spec.Metrics; m != nil && m.Queries != nil {
		q := metrics.QueryTemplates{CPU: m.Queries.CPU, RequestRate: m.Queries.RequestRate, ErrorRate: m.Queries.ErrorRate, LatencyP99: m.Queries.LatencyP99}
		if w.AllowQueryOverrides {
			d.queries = q
		} else if q != (metrics.QueryTemplates{}) {
			d.overridesIgnored = true
		}
	}
	if alb.Status.LastWeightWrite != nil {
		d.lastWrite = alb.Status.LastWeightWrite.Time
	}
	if at := w.weightsWrittenAt[d.key]; at.After(d.lastWrite) {
		d.lastWrite = at // the status that says so may still be in the status queue
	}
	d.replannedAt = replannedAt(se)
	listed, err := w.slicePods(ctx, alb)
	if err != nil {
		return nil, err
	}
	d.slicePod = listed
	applied, recorded := readApplied(se)
	for _, e := range se.Spec.Endpoints {
		d.podOrder = append(d.podOrder, e.Address)
		d.current[e.Address] = int(e.Weight)
		if weight, ok := applied[listed[e.Address]]; recorded && ok {
			d.current[e.Address] = int(weight) // a weight edited by someone else is not the operator's
		}
		pod, err := w.podOf(ctx, alb.Namespace, e.Address, listed[e.Address])
		if err != nil {
			return nil, err
		}
		if pod == nil {
			continue
		}
		d.pods[e.Address] = pod
		facts, err := w.node(ctx, pod.Spec.NodeName, nodes)
		if err != nil {
			return nil, err
		}
		if facts.instanceType != "" {
			d.peerGroup[e.Address] = facts.instanceType
		}
		if facts.cpuCores > 0 {
			d.nodeCPU[e.Address] = facts.cpuCores
		}
	}
	return d, nil
}

// serviceEntrySlices lists the ServiceEntry slices of alb's target: primary, then the further
// ones alb controls, in number order.
func (w *WeightCycle) serviceEntrySlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, primary *networkingv1.ServiceEntry) ([]*networkingv1.ServiceEntry, error) {
	var list networkingv1.ServiceEntryList
	if err := w.Client.List(ctx, &list, client.InNamespace(alb.Namespace), client.MatchingFields{indexServiceEntryController: string(alb.UID)}); err != nil {
		return nil, fmt.Errorf("list the ServiceEntry slices of AdaptiveLoadBalancer %s/%s: %w", alb.Namespace, alb.Name, err)
	}
	out := []*networkingv1.ServiceEntry{primary}
	for _, se := range list.Items {
		if n, ok := istio.SliceIndex(primary.Name, se.Name); ok && n > 0 && metav1.IsControlledBy(se, alb) {
			out = append(out, se)
		}
	}
	slices.SortFunc(out[1:], func(a, b *networkingv1.ServiceEntry) int {
		i, _ := istio.SliceIndex(primary.Name, a.Name)
		j, _ := istio.SliceIndex(primary.Name, b.Name)
		return i - j
	})
	return out, nil
}

// newestSlices replaces each cached slice that the operator's own writes have superseded with
// the version the API server answered: the weight path plans from the weights in force, and a
// check between cycles may write a moment before a cycle (or a cycle before a check), sooner
// than the informer delivers the write.
func (w *WeightCycle) newestSlices(sliced []*networkingv1.ServiceEntry) {
	if w.Versions == nil {
		return
	}
	for i, s := range sliced {
		if w.Versions.lagging(s) {
			sliced[i] = w.Versions.newest(client.ObjectKeyFromObject(s), s)
		}
	}
}

// nodeFacts is what the weight cycle reads of a node.
type nodeFacts struct {
	instanceType string
	// cpuCores is the node's allocatable CPU; 0 when unknown.
	cpuCores float64
}

// node returns the instance type and allocatable CPU of a node (from the trimmed cache),
// memoised for the cycle in seen. A node that is gone gives no facts.
func (w *WeightCycle) node(ctx context.Context, nodeName string, seen map[string]nodeFacts) (nodeFacts, error) {
	if nodeName == "" {
		return nodeFacts{}, nil
	}
	if f, ok := seen[nodeName]; ok {
		return f, nil
	}
	node := &corev1.Node{}
	if err := w.Client.Get(ctx, types.NamespacedName{Name: nodeName}, node, client.UnsafeDisableDeepCopy); err != nil && !apierrors.IsNotFound(err) {
		return nodeFacts{}, fmt.Errorf("get Node %s: %w", nodeName, err)
	}
	f := nodeFacts{instanceType: node.Labels[InstanceTypeLabel]}
	if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		f.cpuCores = cpu.AsApproximateFloat64()
	}
	seen[nodeName] = f
	return f, nil
}

// slicePods maps each address of the Service's EndpointSlices to the pod the slice names for it.
func (w *WeightCycle) slicePods(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (map[string]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := w.Client.List(ctx, &list, client.InNamespace(alb.Namespace), client.MatchingFields{indexSliceService: alb.Spec.TargetRef.Name}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of Service %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
				continue
			}
			for _, addr := range ep.Addresses {
				out[addr] = ep.TargetRef.Name
			}
		}
	}
	return out, nil
}

// podOf finds the pod behind an endpoint address: the one the Service's EndpointSlice names, as
// long as it still has that address; otherwise the only pod with that IP. Host-network pods
// share their node's IP and are never candidates (the IP index leaves them out), and an IP
// that two pods claim (one reused before the other's status caught up) gives no pod rather
// than a guess: without a pod the endpoint just has no metrics this cycle.
func (w *WeightCycle) podOf(ctx context.Context, namespace, ip, listed string) (*corev1.Pod, error) {
	if listed != "" {
		pod := &corev1.Pod{}
		err := w.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: listed}, pod)
		if err == nil && slices.Contains(endpointIPs(pod), ip) {
			return pod, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get Pod %s/%s: %w", namespace, listed, err)
		}
	}
	var pods corev1.PodList
	if err := w.Client.List(ctx, &pods, client.InNamespace(namespace), client.MatchingFields{indexPodIP: ip}); err != nil {
		return nil, fmt.Errorf("find the pod of %s: %w", ip, err)
	}
	if len(pods.Items) != 1 {
		return nil, nil
	}
	return &pods.Items[0], nil
}

// forgetGone drops the cycle's state (hold timers, last run, status throttle) of every
// AdaptiveLoadBalancer not in present or marked for deletion, so deleted ones cost no memory
// and one re-created under the same name starts afresh. The cycle holds w.mu.
func (w *WeightCycle) forgetGone(present []adlbv1.AdaptiveLoadBalancer) {
	live := make(map[types.NamespacedName]bool, len(present))
	for i := range present {
		if present[i].DeletionTimestamp.IsZero() {
			live[client.ObjectKeyFromObject(&present[i])] = true
		}
	}
	dropGone(w.states, live)
	dropGone(w.lastRun, live)
	w.statusThrottle.retain(func(key types.NamespacedName) bool { return live[key] })
	w.writtenMu.Lock()
	dropGone(w.writtenPeak, live)
	dropGone(w.writtenSurge, live)
	w.writtenMu.Unlock()
	dropGone(w.weightsWrittenAt, live)
	dropGone(w.known, live)
	dropGone(w.rateHistory, live)
	dropGone(w.reliefs, live)
	w.History.retain(live)
}

// dropGone deletes the entries of AdaptiveLoadBalancers that are not live.
func dropGone[V any](m map[types.NamespacedName]V, live map[types.NamespacedName]bool) {
	maps.DeleteFunc(m, func(key types.NamespacedName, _ V) bool { return !live[key] })
}
