package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/pushmodel"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// Event reasons of the weight cycle.
const (
	EventWeightsShifted   = "WeightsShifted"
	EventFallback         = adlbv1.ReasonFallback
	EventMetricsRecovered = "MetricsRecovered"
)

// largeShift is the weight move, in log space, from which an Event is recorded (a factor 2).
var largeShift = math.Log(2)

// CycleMetrics are the weight cycle's own metrics.
type CycleMetrics struct {
	CycleDuration    prometheus.Histogram
	EstimatedPushes  prometheus.Counter
	LastSuccess      prometheus.Gauge
	DeferredServices prometheus.Gauge
}

// NewCycleMetrics registers the weight cycle's metrics with reg.
func NewCycleMetrics(reg prometheus.Registerer) *CycleMetrics {
	m := &CycleMetrics{
		CycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "adaptivelb_weight_cycle_duration_seconds",
			Help:    "Duration of one weight cycle: metrics fetch, engine and the burst of writes.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		EstimatedPushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "adaptivelb_estimated_istiod_pushes_total",
			Help: "istiod pushes the operator's weight writes cause, by istiod's debounce rule (PILOT_DEBOUNCE_AFTER/MAX).",
		}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "adaptivelb_weight_cycle_last_success_timestamp_seconds",
			Help: "Unix time of the last weight cycle that completed.",
		}),
		DeferredServices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "adaptivelb_weight_writes_deferred",
			Help: "Services whose weight write waits for the next cycle's budget.",
		}),
	}
	m.CycleDuration = register(reg, m.CycleDuration)
	m.EstimatedPushes = register(reg, m.EstimatedPushes)
	m.LastSuccess = register(reg, m.LastSuccess)
	m.DeferredServices = register(reg, m.DeferredServices)
	return m
}

// WeightCycle is the operator's single weight loop: every Tick it fetches the metrics of every
// due AdaptiveLoadBalancer in one batch, runs the weight engine, and writes the changed weights
// as one burst within the budget. Membership stays with the mirror and never waits for it.
type WeightCycle struct {
	Client   client.Client
	Source   metrics.Source
	Recorder record.EventRecorder
	Clock    clock.WithTicker
	Metrics  *Metrics
	Cycle    *CycleMetrics
	// Tick is the global cycle; an AdaptiveLoadBalancer's interval is rounded up to a multiple.
	Tick time.Duration
	// Budget bounds the weight writes per cycle across the cluster; 0 is unlimited.
	Budget int
	// HoldIntervals is how many intervals the last weights survive a metrics outage.
	HoldIntervals int
	// Debounce is istiod's debounce setting, for the push estimate.
	Debounce pushmodel.Config
	// Versions are the ServiceEntry versions the operator wrote, shared with the mirror: a
	// weight write based on the cache alone would conflict with the mirror's last write under
	// endpoint churn. Nil: the cycle keeps its own.
	Versions *ServiceEntryVersions
	// Activity, if set, counts cycles under way; once it is closed none starts.
	Activity *Activity

	mu        sync.Mutex
	states    map[types.NamespacedName]cycle.State
	lastRun   map[types.NamespacedName]time.Time
	debouncer *pushmodel.Debouncer
	// lastStatusWrite is when each AdaptiveLoadBalancer's status was last written by the cycle.
	lastStatusWrite map[types.NamespacedName]time.Time
}

// statusSignalsInterval spaces status writes that would only refresh the per-endpoint CPU and
// request rate: they change every cycle, and at 10,000 AdaptiveLoadBalancers on a 30 s interval
// writing them each time would cost the API server 333 patches per second for numbers nothing
// acts on.
const statusSignalsInterval = 5 * time.Minute

// skipStatusWrite reports whether a status write can be left out: nothing changed, or only the
// per-endpoint signals did and they were written less than statusSignalsInterval ago. It records
// the time of every write it lets through. The cycle calls it with w.mu held.
func (w *WeightCycle) skipStatusWrite(key types.NamespacedName, before, after *adlbv1.AdaptiveLoadBalancerStatus, now time.Time) bool {
	if apiequality.Semantic.DeepEqual(before, after) {
		return true
	}
	if w.lastStatusWrite == nil {
		w.lastStatusWrite = map[types.NamespacedName]time.Time{}
	}
	if last, ok := w.lastStatusWrite[key]; ok && now.Sub(last) < statusSignalsInterval && signalsOnly(before, after) {
		return true
	}
	w.lastStatusWrite[key] = now
	return false
}

// signalsOnly reports whether two statuses differ in the endpoints' CPU and request rate alone.
func signalsOnly(a, b *adlbv1.AdaptiveLoadBalancerStatus) bool {
	strip := func(s *adlbv1.AdaptiveLoadBalancerStatus) *adlbv1.AdaptiveLoadBalancerStatus {
		c := s.DeepCopy()
		for i := range c.Endpoints {
			c.Endpoints[i].CPUCores, c.Endpoints[i].RequestRate = "", ""
		}
		return c
	}
	return apiequality.Semantic.DeepEqual(strip(a), strip(b))
}

// NeedLeaderElection: only the leader writes weights.
func (w *WeightCycle) NeedLeaderElection() bool { return true }

// Start runs the loop until ctx ends (a manager.Runnable).
func (w *WeightCycle) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("weight-cycle")
	ticker := w.Clock.NewTicker(w.Tick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
			if _, err := w.RunOnce(ctx); err != nil {
				logger.Error(err, "weight cycle failed; the next tick retries")
			}
		}
	}
}

// CycleReport summarises one cycle, for tests and logs.
type CycleReport struct {
	Due int
	// Writes are when each weight write of the burst completed; Written names their targets.
	Writes   []time.Time
	Written  []types.NamespacedName
	Outcomes map[types.NamespacedName]cycle.Outcome
	Pushes   int
}

// RunOnce runs one cycle now.
func (w *WeightCycle) RunOnce(ctx context.Context) (CycleReport, error) {
	if !w.Activity.enter() {
		return CycleReport{}, nil // this manager is being replaced
	}
	defer w.Activity.exit()
	start := w.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.states == nil {
		w.states, w.lastRun = map[types.NamespacedName]cycle.State{}, map[types.NamespacedName]time.Time{}
		w.debouncer = pushmodel.NewDebouncer(w.Debounce)
	}
	logger := log.FromContext(ctx).WithName("weight-cycle")
	report := CycleReport{Outcomes: map[types.NamespacedName]cycle.Outcome{}}

	due, err := w.dueTargets(ctx, start)
	if err != nil {
		return report, err
	}
	report.Due = len(due)
	if len(due) == 0 {
		return report, nil
	}
	batches := w.fetch(ctx, start, due)
	var targets []cycle.Target
	for _, d := range due {
		d.observed = d.target(start, batches[d.interval], max(1, w.HoldIntervals))
		targets = append(targets, d.observed)
	}
	prev := map[string]cycle.State{}
	for _, d := range due {
		prev[d.key.String()] = w.states[d.key]
	}
	outcomes, next := cycle.Plan(start, targets, prev, w.Budget)

	// One tight burst: every write of the cycle goes out back to back, well inside one istiod
	// debounce window, then the operator is quiet until the next cycle.
	deferred := 0
	for i, d := range due {
		o := outcomes[i]
		report.Outcomes[d.key] = o
		w.states[d.key] = next[d.key.String()]
		if o.Action != cycle.ActionDeferred {
			w.lastRun[d.key] = start
		} else {
			deferred++
		}
		if o.Action != cycle.ActionWrite {
			continue
		}
		if err := w.writeWeights(ctx, d, o.Decision); err != nil {
			logger.Error(err, "weight write failed", "adaptiveLoadBalancer", d.key)
			w.Metrics.ReconcileErrors.WithLabelValues(errorReason(err)).Inc()
			continue
		}
		// Push estimates need when the writes really reached the API server, not the cycle's clock.
		at := time.Now()
		report.Writes = append(report.Writes, at)
		report.Written = append(report.Written, d.key)
		report.Pushes += len(w.debouncer.Observe(at))
	}
	for i, d := range due {
		if err := w.writeStatus(ctx, d, outcomes[i], start); err != nil {
			logger.Error(err, "status write failed", "adaptiveLoadBalancer", d.key)
		}
	}
	// Close the debounce period the burst opened: its push is due once the quiet time passes.
	if len(report.Writes) > 0 {
		last := report.Writes[len(report.Writes)-1]
		report.Pushes += len(w.debouncer.Advance(last.Add(w.debounceAfter())))
	}
	w.Cycle.EstimatedPushes.Add(float64(report.Pushes))
	w.Cycle.DeferredServices.Set(float64(deferred))
	w.Cycle.CycleDuration.Observe(w.Clock.Since(start).Seconds())
	w.Cycle.LastSuccess.Set(float64(w.Clock.Now().Unix()))
	return report, nil
}

func (w *WeightCycle) debounceAfter() time.Duration {
	if w.Debounce.DebounceAfter > 0 {
		return w.Debounce.DebounceAfter
	}
	return pushmodel.DefaultDebounceAfter
}

// dueTarget is one AdaptiveLoadBalancer due this cycle, with what the engine needs.
type dueTarget struct {
	key       types.NamespacedName
	alb       *adlbv1.AdaptiveLoadBalancer
	se        *networkingv1.ServiceEntry
	settings  weights.Settings
	interval  time.Duration
	pods      map[string]*corev1.Pod // by IP
	podOrder  []string               // IPs in ServiceEntry order
	current   map[string]int         // weight by IP
	lastWrite time.Time
	// observed is what the engine was given this cycle, for the status.
	observed cycle.Target
	// warmup is the slow-start duration of the Service's DestinationRule, if any: Envoy ramps
	// new endpoints up over it, so their early signals do not show their capacity.
	warmup time.Duration
}

func (w *WeightCycle) dueTargets(ctx context.Context, now time.Time) ([]*dueTarget, error) {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := w.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list AdaptiveLoadBalancers: %w", err)
	}
	w.forgetGone(list.Items)
	var due []*dueTarget
	for i := range list.Items {
		alb := &list.Items[i]
		key := client.ObjectKeyFromObject(alb)
		if !alb.DeletionTimestamp.IsZero() {
			continue // its ServiceEntry is being deleted; a weight write must not race that
		}
		interval := 30 * time.Second
		if alb.Spec.Interval != nil {
			interval = alb.Spec.Interval.Duration
		}
		// Intervals are whole multiples of the tick, so every Service's cycle lands on a tick.
		interval = time.Duration(math.Ceil(float64(interval)/float64(w.Tick))) * w.Tick
		st := w.states[key]
		if last, ok := w.lastRun[key]; ok && now.Sub(last) < interval && st.DeferredSince.IsZero() {
			continue
		}
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Status != metav1.ConditionTrue {
			continue // nothing mirrored yet, or a condition the mirror reports
		}
		settings, err := EngineSettings(alb)
		if err != nil {
			continue // rejected at admission in practice; the mirror reports it
		}
		se := &networkingv1.ServiceEntry{}
		if err := w.Client.Get(ctx, types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}, se); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("get ServiceEntry %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
		}
		if !metav1.IsControlledBy(se, alb) {
			continue
		}
		warmup, err := w.warmupOf(ctx, alb)
		if err != nil {
			return nil, err
		}
		d := &dueTarget{key: key, alb: alb, se: se, settings: settings, interval: interval, pods: map[string]*corev1.Pod{}, current: map[string]int{}, warmup: warmup}
		if alb.Status.LastWeightWrite != nil {
			d.lastWrite = alb.Status.LastWeightWrite.Time
		}
		listed, err := w.slicePods(ctx, alb)
		if err != nil {
			return nil, err
		}
		for _, e := range se.Spec.Endpoints {
			d.podOrder = append(d.podOrder, e.Address)
			d.current[e.Address] = int(e.Weight)
			pod, err := w.podOf(ctx, alb.Namespace, e.Address, listed[e.Address])
			if err != nil {
				return nil, err
			}
			if pod != nil {
				d.pods[e.Address] = pod
			}
		}
		due = append(due, d)
	}
	sort.Slice(due, func(i, j int) bool { return due[i].key.String() < due[j].key.String() })
	return due, nil
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
		if err == nil && !pod.Spec.HostNetwork && slices.Contains(podIPs(pod), ip) {
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
	for key := range w.states {
		if !live[key] {
			delete(w.states, key)
		}
	}
	for key := range w.lastRun {
		if !live[key] {
			delete(w.lastRun, key)
		}
	}
	for key := range w.lastStatusWrite {
		if !live[key] {
			delete(w.lastStatusWrite, key)
		}
	}
}

// fetchResult is one batched fetch, shared by every target with the same interval.
type fetchResult struct {
	byPod map[types.NamespacedName]metrics.Observation
	err   error
}

// fetch sends one batched request per distinct interval (normally one): its queries cover every
// due Service's pods, whatever their number.
func (w *WeightCycle) fetch(ctx context.Context, now time.Time, due []*dueTarget) map[time.Duration]fetchResult {
	byInterval := map[time.Duration][]metrics.Pod{}
	for _, d := range due {
		var q metrics.QueryTemplates
		if m := d.alb.Spec.Metrics; m != nil && m.Queries != nil {
			q = metrics.QueryTemplates{CPU: m.Queries.CPU, RequestRate: m.Queries.RequestRate, ErrorRate: m.Queries.ErrorRate, LatencyP99: m.Queries.LatencyP99}
		}
		for _, ip := range d.podOrder {
			if pod, ok := d.pods[ip]; ok {
				byInterval[d.interval] = append(byInterval[d.interval], metrics.Pod{Namespace: pod.Namespace, Name: pod.Name, IP: ip, CPULimitCores: cpuLimit(pod), Queries: q})
			}
		}
	}
	out := map[time.Duration]fetchResult{}
	for interval, pods := range byInterval {
		res := fetchResult{byPod: map[types.NamespacedName]metrics.Observation{}}
		batch, err := w.Source.Fetch(ctx, metrics.Request{Pods: pods, Now: now, Window: 2 * interval, Interval: interval})
		res.err = err
		for _, o := range batch.Observations {
			res.byPod[types.NamespacedName{Namespace: o.Namespace, Name: o.Name}] = o
		}
		out[interval] = res
	}
	return out
}

// cpuLimit sums the CPU limits of the application containers; the sidecar's CPU is not in the
// cAdvisor query either.
func cpuLimit(pod *corev1.Pod) float64 {
	if v, ok := pod.Annotations[CachedCPULimitAnnotation]; ok { // a cached pod: derived already
		if m, err := strconv.ParseInt(v, 10, 64); err == nil {
			return float64(m) / 1000
		}
	}
	total := 0.0
	for _, c := range pod.Spec.Containers {
		if c.Name == "istio-proxy" {
			continue
		}
		l, ok := c.Resources.Limits[corev1.ResourceCPU]
		if !ok {
			return 0 // one unlimited container makes the pod unlimited
		}
		total += l.AsApproximateFloat64()
	}
	return total
}

// target turns a due AdaptiveLoadBalancer and the batch into the planner's input. A whole-batch
// failure (no pod has any signal) is a metrics outage for the hold/fallback policy; a pod
// without fresh CPU and request rate just has no metrics.
func (d *dueTarget) target(now time.Time, res fetchResult, holdIntervals int) cycle.Target {
	t := cycle.Target{
		Key:      d.key.String(),
		Settings: d.settings,
		HoldTime: time.Duration(holdIntervals) * d.interval,
		DryRun:   d.alb.Spec.Mode == adlbv1.ModeDryRun,
	}
	window := 2 * d.interval
	t.WindowSeconds = window.Seconds()
	t.WindowCoverage = 1
	if !d.lastWrite.IsZero() {
		t.WindowCoverage = math.Min(1, now.Sub(d.lastWrite).Seconds()/window.Seconds())
	}
	usable := 0
	for _, ip := range d.podOrder {
		ep := weights.Endpoint{ID: ip, CurrentWeight: d.current[ip]}
		if pod, ok := d.pods[ip]; ok {
			ep.CPULimitCores = cpuLimit(pod)
			warming := d.warmup > 0 && pod.Status.StartTime != nil && now.Sub(pod.Status.StartTime.Time) < d.warmup
			if o, ok := res.byPod[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}]; ok {
				ep.CPUCores, ep.RequestRate = o.CPUCores.Value, o.RequestRate.Value
				ep.ErrorRate, ep.LatencyP99Seconds = o.ErrorRate.Value, o.LatencyP99Seconds.Value
				// A pod still in its DestinationRule warm-up keeps the median weight: Envoy is
				// ramping its traffic up, so its signals say nothing about its capacity yet.
				ep.HasMetrics = o.CPUCores.Usable() && o.RequestRate.Usable() && !warming
				if o.CPUCores.Present || o.RequestRate.Present {
					usable++
				}
			}
		}
		t.Endpoints = append(t.Endpoints, ep)
	}
	if usable == 0 && len(d.podOrder) > 0 {
		t.MetricsErr = res.err
		if t.MetricsErr == nil {
			t.MetricsErr = errors.New("the metrics source returned no sample for any pod of this Service")
		}
	}
	return t
}

// writeWeights patches only the weights of the ServiceEntry's current endpoints; an endpoint the
// mirror added or removed meanwhile is left to the mirror.
func (w *WeightCycle) writeWeights(ctx context.Context, d *dueTarget, decision weights.Decision) error {
	next := decision.Weights()
	key := client.ObjectKeyFromObject(d.se)
	cached := &networkingv1.ServiceEntry{}
	if err := w.Client.Get(ctx, key, cached); err != nil {
		return fmt.Errorf("get ServiceEntry %s/%s: %w", d.se.Namespace, d.se.Name, err)
	}
	if w.Versions == nil { // the cycle holds w.mu here
		w.Versions = &ServiceEntryVersions{}
	}
	se := w.Versions.newest(key, cached)
	base := se.DeepCopy()
	changed := false
	for _, e := range se.Spec.Endpoints {
		if wgt, ok := next[e.Address]; ok && uint32(wgt) != e.Weight {
			e.Weight = uint32(wgt)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	istio.LimitWeightSum(se.Spec.Endpoints)
	// Optimistic lock: a membership write may have landed since the read; then the mirror's
	// version wins and the next cycle retries.
	if err := w.Client.Patch(ctx, se, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			w.Versions.forget(key) // someone else wrote since: the next cycle starts from the cache
		}
		return fmt.Errorf("patch weights of ServiceEntry %s/%s: %w", se.Namespace, se.Name, err)
	}
	w.Versions.remember(se)
	w.Metrics.ServiceEntryWrites.WithLabelValues(WriteReasonWeights).Inc()
	return nil
}

// writeStatus publishes the cycle's outcome: conditions, per-endpoint weights and reasons, events.
func (w *WeightCycle) writeStatus(ctx context.Context, d *dueTarget, o cycle.Outcome, now time.Time) error {
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := w.Client.Get(ctx, d.key, alb); err != nil {
		return client.IgnoreNotFound(err)
	}
	base := alb.DeepCopy()
	gen := alb.Generation
	metricsCond := metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonMetricsOK, Message: "metrics fetched for this Service's pods", ObservedGeneration: gen}
	var weightsCond metav1.Condition
	switch {
	case o.Err != nil:
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonWriteFailed, Message: o.Err.Error(), ObservedGeneration: gen}
	case o.Fallback:
		metricsCond = metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonMetricsFailed, Message: o.Reason, ObservedGeneration: gen}
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonFallback, Message: o.Reason, ObservedGeneration: gen}
	case o.Action == cycle.ActionHold:
		metricsCond = metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonMetricsFailed, Message: o.Reason, ObservedGeneration: gen}
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonWeightsApplied, Message: "last weights held while metrics are unavailable", ObservedGeneration: gen}
	case o.Action == cycle.ActionDryRun:
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonDryRun, Message: "mode is DryRun: " + o.Reason + " (not written)", ObservedGeneration: gen}
	case o.Action == cycle.ActionDeferred:
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse, Reason: adlbv1.ReasonDeferred, Message: o.Reason, ObservedGeneration: gen}
	default:
		weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonWeightsApplied, Message: o.Reason, ObservedGeneration: gen}
	}
	meta.SetStatusCondition(&alb.Status.Conditions, metricsCond)
	meta.SetStatusCondition(&alb.Status.Conditions, weightsCond)
	reasons := map[string]weights.Result{}
	for _, r := range o.Decision.Endpoints {
		reasons[r.ID] = r
	}
	signals := map[string]weights.Endpoint{}
	for _, e := range d.observed.Endpoints {
		if e.HasMetrics {
			signals[e.ID] = e
		}
	}
	nowT := metav1.NewTime(now)
	for i := range alb.Status.Endpoints {
		e := &alb.Status.Endpoints[i]
		r, ok := reasons[e.IP]
		if !ok {
			continue
		}
		e.Reason = r.Reason
		e.CPUCores, e.RequestRate = "", ""
		if sig, ok := signals[e.IP]; ok {
			e.CPUCores = adlbv1.Decimal(strconv.FormatFloat(sig.CPUCores, 'f', 3, 64))
			e.RequestRate = adlbv1.Decimal(strconv.FormatFloat(sig.RequestRate, 'f', 1, 64))
		}
		if o.Action == cycle.ActionWrite || o.Action == cycle.ActionDryRun {
			if int32(r.Weight) != e.Weight {
				e.Weight = int32(r.Weight)
				e.LastChange = &nowT
			}
		}
	}
	if o.Action == cycle.ActionWrite {
		alb.Status.LastWeightWrite = &nowT
	}
	if o.Action == cycle.ActionWrite || o.Action == cycle.ActionDryRun {
		ws, pods := map[string]int{}, map[string]string{}
		for _, r := range o.Decision.Endpoints {
			ws[r.ID] = r.Weight
			if p, ok := d.pods[r.ID]; ok {
				pods[r.ID] = p.Name
			}
		}
		w.Metrics.SetEndpointWeights(alb.Namespace, alb.Name, ws, pods)
	}
	if w.skipStatusWrite(d.key, &base.Status, &alb.Status, now) {
		return nil
	}
	if err := w.Client.Status().Patch(ctx, alb, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	switch {
	case o.FallbackStarted:
		w.Recorder.Event(alb, corev1.EventTypeWarning, EventFallback, o.Reason)
	case o.Recovered:
		w.Recorder.Event(alb, corev1.EventTypeNormal, EventMetricsRecovered, "metrics are back; adaptive weights resume")
	case o.Action == cycle.ActionWrite && o.Need >= largeShift:
		w.Recorder.Eventf(alb, corev1.EventTypeNormal, EventWeightsShifted, "an endpoint's weight moved by a factor of %.1f: %s", math.Exp(o.Need), o.Reason)
	}
	return nil
}

// warmupOf returns the warm-up (slow start) duration a DestinationRule in the Service's namespace
// sets for the Service's host, or 0.
func (w *WeightCycle) warmupOf(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (time.Duration, error) {
	var rules networkingv1.DestinationRuleList
	if err := w.Client.List(ctx, &rules, client.InNamespace(alb.Namespace)); err != nil {
		return 0, fmt.Errorf("list DestinationRules in %s: %w", alb.Namespace, err)
	}
	svc := alb.Spec.TargetRef.Name
	for _, dr := range rules.Items {
		h := dr.Spec.Host
		if h != svc && h != svc+"."+alb.Namespace && !strings.HasPrefix(h, svc+"."+alb.Namespace+".svc") {
			continue
		}
		lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer()
		if d := lb.GetWarmup().GetDuration(); d != nil {
			return d.AsDuration(), nil
		}
		if d := lb.GetWarmupDurationSecs(); d != nil {
			return d.AsDuration(), nil
		}
	}
	return 0, nil
}
