package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
	Client client.Client
	// APIReader reads the API server directly, after a status write conflict; nil: Client.
	APIReader client.Reader
	Source    metrics.Source
	Recorder  record.EventRecorder
	Clock     clock.WithTicker
	Metrics   *Metrics
	Cycle     *CycleMetrics
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
	// Membership is the mirror's record of when each endpoint was in its ServiceEntry; the
	// cycle counts an endpoint's signals over that time only. Nil: the whole window.
	Membership *Membership
	// Activity, if set, counts cycles under way; once it is closed none starts.
	Activity *Activity
	// AllowQueryOverrides lets spec.metrics.queries replace the operator's queries. Off, they are
	// ignored and MetricsAvailable says so: the queries run with the operator's TSDB
	// credentials, and whoever may create an AdaptiveLoadBalancer could otherwise read any
	// series through status, or slow every Service's cycle with costly queries.
	AllowQueryOverrides bool

	mu        sync.Mutex
	states    map[types.NamespacedName]cycle.State
	lastRun   map[types.NamespacedName]time.Time
	debouncer *pushmodel.Debouncer
	// known holds, per AdaptiveLoadBalancer, the pods whose weight came from their own metrics:
	// while their metrics are missing they keep their last weight.
	known map[types.NamespacedName]map[string]bool
	// lastStatusWrite is when each AdaptiveLoadBalancer's status was last written by the cycle.
	lastStatusWrite map[types.NamespacedName]time.Time
	// writtenPeak is the status.recentPeak the cycle last wrote for each AdaptiveLoadBalancer:
	// the API server prunes the field under a CRD older than it (crds/ not applied on upgrade),
	// and comparing with the nil it reads back would write the status every cycle.
	writtenPeak map[types.NamespacedName]*adlbv1.RecentPeak
	// rateHistory holds, per AdaptiveLoadBalancer, the Service's request rate of each cycle
	// within the last peakRateWindow, oldest first: the engine plans for their maximum.
	rateHistory map[types.NamespacedName][]rateObservation
}

// rateObservation is the Service's total request rate one cycle observed.
type rateObservation struct {
	at   time.Time
	rate float64
}

// peakRateWindow is how far back the recent peak request rate reaches: long enough to remember
// a burst through a few quiet cycles, short enough that a Service whose traffic fell for good
// is soon planned for its new level.
const peakRateWindow = 10 * time.Minute

// recentPeak records this cycle's rate of the Service (when observed), drops the observations
// older than peakRateWindow and returns the highest left. It returns 0, unknown, while the history
// holds nothing from before this cycle: one rate cannot tell a steady load from the quiet half of a
// burst, and the engine plans with its margin for an unknown peak instead. The simulator's
// controller does the same (its first cycle has no full window). The cycle holds w.mu.
func (w *WeightCycle) recentPeak(key types.NamespacedName, now time.Time, rate float64, observed bool) float64 {
	if w.rateHistory == nil {
		w.rateHistory = map[types.NamespacedName][]rateObservation{}
	}
	h := w.rateHistory[key]
	drop := 0
	for drop < len(h) && !h[drop].at.After(now.Add(-peakRateWindow)) {
		drop++
	}
	h = slices.Delete(h, 0, drop)
	if observed {
		h = append(h, rateObservation{at: now, rate: rate})
	}
	if len(h) == 0 {
		delete(w.rateHistory, key)
		return 0
	}
	w.rateHistory[key] = h
	if !h[0].at.Before(now) {
		return 0
	}
	peak := 0.0
	for _, o := range h {
		peak = max(peak, o.rate)
	}
	return peak
}

// peakObservation is the highest rate in key's history (the latest of equal ones). The cycle
// holds w.mu.
func (w *WeightCycle) peakObservation(key types.NamespacedName) (rateObservation, bool) {
	h := w.rateHistory[key]
	if len(h) == 0 {
		return rateObservation{}, false
	}
	peak := h[0]
	for _, o := range h[1:] {
		if o.rate >= peak.rate {
			peak = o
		}
	}
	return peak, true
}

// seedPeak starts key's rate history from status.recentPeak, which the previous leader wrote,
// when it is still within peakRateWindow: otherwise a new leader would plan for its first
// cycle's rate for the next ten minutes, less cautiously than for an unknown peak. A time
// ahead of this process's clock (the other node's clock runs ahead) counts as now. The cycle
// holds w.mu.
func (w *WeightCycle) seedPeak(key types.NamespacedName, alb *adlbv1.AdaptiveLoadBalancer, now time.Time) {
	p := alb.Status.RecentPeak
	if p == nil || len(w.rateHistory[key]) > 0 {
		return
	}
	rate, err := strconv.ParseFloat(string(p.RequestRate), 64)
	if err != nil || rate <= 0 {
		return
	}
	at := p.ObservedAt.Time
	if at.After(now) {
		at = now
	}
	if !at.After(now.Add(-peakRateWindow)) {
		return
	}
	if w.rateHistory == nil {
		w.rateHistory = map[types.NamespacedName][]rateObservation{}
	}
	w.rateHistory[key] = []rateObservation{{at: at, rate: rate}}
}

// recentPeakStatus is status.recentPeak for the observation peak, or nil when there is none or
// its rate does not fit the schema's Decimal (a negative rate or one of 10^14 per second and
// more, which only a wrong query gives): the API server would refuse the whole status write,
// conditions and all, every cycle while that rate is in the window.
func recentPeakStatus(peak rateObservation, observed bool) *adlbv1.RecentPeak {
	if !observed || !(peak.rate >= 0) {
		return nil
	}
	rate := strconv.FormatFloat(peak.rate, 'f', 1, 64)
	if len(rate) > maxDecimalLength {
		return nil
	}
	return &adlbv1.RecentPeak{RequestRate: adlbv1.Decimal(rate), ObservedAt: metav1.NewTime(peak.at)}
}

// maxDecimalLength is the schema's MaxLength of a Decimal (api/v1alpha1).
const maxDecimalLength = 16

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
	if w.writtenPeak == nil {
		w.writtenPeak = map[types.NamespacedName]*adlbv1.RecentPeak{}
	}
	if last, ok := w.lastStatusWrite[key]; ok && now.Sub(last) < statusSignalsInterval && signalsOnly(w.withWrittenPeak(key, before), after) {
		return true
	}
	w.lastStatusWrite[key] = now
	if after.RecentPeak != nil {
		w.writtenPeak[key] = after.RecentPeak.DeepCopy()
	}
	return false
}

// withWrittenPeak is the status as the cycle last wrote it as far as recentPeak goes: when the
// API server returned none (it prunes the field under a CRD that lacks it), the one written.
func (w *WeightCycle) withWrittenPeak(key types.NamespacedName, status *adlbv1.AdaptiveLoadBalancerStatus) *adlbv1.AdaptiveLoadBalancerStatus {
	written, ok := w.writtenPeak[key]
	if status.RecentPeak != nil || !ok {
		return status
	}
	c := status.DeepCopy()
	c.RecentPeak = written
	return c
}

// signalsOnly reports whether two statuses differ in the endpoints' CPU and request rate alone,
// and in a recent peak that did not rise by more than peakRewriteFactor: a new leader seeding
// from a peak a little below the true one plans almost as cautiously, and a peak that fell is
// on the safe side, so neither is worth a status write of its own every cycle.
func signalsOnly(a, b *adlbv1.AdaptiveLoadBalancerStatus) bool {
	strip := func(s *adlbv1.AdaptiveLoadBalancerStatus) *adlbv1.AdaptiveLoadBalancerStatus {
		c := s.DeepCopy()
		for i := range c.Endpoints {
			c.Endpoints[i].CPUCores, c.Endpoints[i].RequestRate = "", ""
		}
		return c
	}
	sa, sb := strip(a), strip(b)
	if minorPeakChange(a.RecentPeak, b.RecentPeak) {
		sa.RecentPeak, sb.RecentPeak = nil, nil
	}
	return apiequality.Semantic.DeepEqual(sa, sb)
}

// peakRewriteFactor is how far the recent peak must rise above the one in status to be written
// at once.
const peakRewriteFactor = 1.1

// minorPeakChange reports whether the recent peak went from old to updated without rising by
// more than peakRewriteFactor; a first peak is no minor change.
func minorPeakChange(old, updated *adlbv1.RecentPeak) bool {
	if updated == nil {
		return true
	}
	if old == nil {
		return false
	}
	o, errO := strconv.ParseFloat(string(old.RequestRate), 64)
	u, errU := strconv.ParseFloat(string(updated.RequestRate), 64)
	return errO == nil && errU == nil && u <= o*peakRewriteFactor
}

// NeedLeaderElection: only the leader writes weights.
func (w *WeightCycle) NeedLeaderElection() bool { return true }

// Start runs the loop until ctx ends (a manager.Runnable).
func (w *WeightCycle) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("weight-cycle")
	ctx = log.IntoContext(ctx, logger)
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
	// Inputs are what the planner and the engine were given for each due AdaptiveLoadBalancer.
	Inputs map[types.NamespacedName]cycle.Target
	Pushes int
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
		w.known = map[types.NamespacedName]map[string]bool{}
		w.debouncer = pushmodel.NewDebouncer(w.Debounce)
	}
	logger := log.FromContext(ctx)
	report := CycleReport{Outcomes: map[types.NamespacedName]cycle.Outcome{}, Inputs: map[types.NamespacedName]cycle.Target{}}

	// Re-plans the mirror writes from here on answer a membership this cycle may not plan for.
	replanSeq := w.Membership.ReplanSeq()
	due, idle, err := w.dueTargets(ctx, start)
	if err != nil {
		return report, err
	}
	for _, t := range idle {
		w.writeIdleStatus(ctx, t)
	}
	report.Due = len(due)
	if len(due) == 0 {
		return report, nil
	}
	batches := w.fetch(ctx, start, due)
	var targets []cycle.Target
	for _, d := range due {
		// Weights the mirror re-planned when endpoints left count as a write for the coverage.
		if at := w.Membership.LastReplan(d.key); at.After(d.lastWrite) {
			d.lastWrite = at
		}
		d.observed, d.health = d.target(start, batches[d.interval], max(1, w.HoldIntervals), w.known[d.key], w.Membership)
		if _, planned := w.states[d.key]; !planned {
			// A new leader, or the first cycle: continue from the peak the status recorded.
			w.seedPeak(d.key, d.alb, start)
		}
		d.observed.RecentPeakRequestRate = w.recentPeak(d.key, start, d.serviceRate, d.health.rateObserved)
		d.peak, d.hasPeak = w.peakObservation(d.key)
		report.Inputs[d.key] = d.observed
		targets = append(targets, d.observed)
	}
	prev := map[string]cycle.State{}
	for _, d := range due {
		st, ok := w.states[d.key]
		if !ok {
			// A new leader, or the first cycle: continue the previous leader's hold period
			// from what its status says, instead of resetting the weights at the first failure.
			st = seedState(d.alb, start, d.interval)
		}
		prev[d.key.String()] = st
	}
	outcomes, next := cycle.Plan(start, targets, prev, w.Budget)

	// One tight burst: every write of the cycle goes out back to back, well inside one istiod
	// debounce window, then the operator is quiet until the next cycle.
	deferred := 0
	for i, d := range due {
		o := &outcomes[i]
		if o.Err == nil {
			// The mirror re-plans from these when endpoints leave before the next cycle.
			w.Membership.RecordPlan(d.alb, 2*d.interval, d.observed)
		}
		w.states[d.key] = next[d.key.String()]
		if o.Action != cycle.ActionDeferred {
			w.lastRun[d.key] = start
		} else {
			deferred++
		}
		if o.Action == cycle.ActionWrite {
			// A fallback to equal weights is written whatever the mirror re-planned.
			err := w.writeWeights(ctx, d, o.Decision, !o.Fallback, replanSeq)
			if errors.Is(err, errSupersededByReplan) {
				o.Action = cycle.ActionNone
				o.Reason = "endpoints left while this cycle planned: the weights the mirror re-planned for the endpoints that stay are kept until the next cycle"
			} else if err != nil {
				// Nothing was applied: the status must say so and keep the weights and the
				// lastWeightWrite the ServiceEntry really has.
				w.Metrics.ReconcileErrors.WithLabelValues(errorReason(err)).Inc()
				d.writeErr = err
				// A fallback not written has not begun: its event comes with the write that lands.
				st := w.states[d.key]
				st.FallenBack = prev[d.key.String()].FallenBack
				w.states[d.key] = st
			} else {
				// Push estimates need when the writes really reached the API server, not the cycle's clock.
				at := time.Now()
				report.Writes = append(report.Writes, at)
				report.Written = append(report.Written, d.key)
				report.Pushes += len(w.debouncer.Observe(at))
			}
		}
		if d.health.complete > 0 {
			if w.known[d.key] == nil {
				w.known[d.key] = map[string]bool{}
			}
			for _, e := range d.observed.Endpoints {
				if e.HasMetrics {
					w.known[d.key][e.ID] = true
				}
			}
		}
		report.Outcomes[d.key] = *o
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

// seedState rebuilds the planner's state from an AdaptiveLoadBalancer's status, for a target
// this process has not planned yet. Metrics that were good when the previous leader last wrote
// the status are taken as good until now (the hold period then starts at the first failure); a
// hold in progress continues from when it began; a fallback stays a fallback.
func seedState(alb *adlbv1.AdaptiveLoadBalancer, now time.Time, interval time.Duration) cycle.State {
	var st cycle.State
	if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionWeightsApplied); c != nil && c.Reason == adlbv1.ReasonFallback {
		st.FallenBack = true
		return st
	}
	m := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionMetricsAvailable)
	switch {
	case m == nil:
	case m.Status == metav1.ConditionTrue || m.Reason == adlbv1.ReasonQueryFailed:
		// QueryFailed: an optional signal failed, the ones the engine needs were good.
		st.LastGoodMetrics = now
	case m.Reason == adlbv1.ReasonMetricsFailed || m.Reason == adlbv1.ReasonMetricsStale:
		// The condition turned False at the first failed cycle, one interval after the last good one.
		st.LastGoodMetrics = m.LastTransitionTime.Add(-interval)
	}
	return st
}

func (w *WeightCycle) debounceAfter() time.Duration {
	if w.Debounce.DebounceAfter > 0 {
		return w.Debounce.DebounceAfter
	}
	return pushmodel.DefaultDebounceAfter
}

// dueTarget is one AdaptiveLoadBalancer due this cycle, with what the engine needs.
type dueTarget struct {
	key      types.NamespacedName
	alb      *adlbv1.AdaptiveLoadBalancer
	se       *networkingv1.ServiceEntry
	settings weights.Settings
	interval time.Duration
	queries  metrics.QueryTemplates
	// overridesIgnored: the spec has query overrides and the operator does not allow them.
	overridesIgnored bool
	pods             map[string]*corev1.Pod // by IP
	podOrder         []string               // IPs in ServiceEntry order
	current          map[string]int         // weight by IP
	peerGroup        map[string]string      // instance type by IP
	nodeCPU          map[string]float64     // allocatable CPU of the pod's node by IP, when known
	lastWrite        time.Time
	// observed is what the engine was given this cycle, and health what the metrics were like.
	observed cycle.Target
	health   metricsHealth
	// writeErr is the failure of this cycle's weight write.
	writeErr error
	// serviceRate is the Service's request rate this cycle: the sum of its pods' usable rates.
	serviceRate float64
	// peak is the highest of the Service's rates within peakRateWindow, for status.recentPeak;
	// hasPeak is false when none was observed.
	peak    rateObservation
	hasPeak bool
	// warmup is the slow-start duration of the Service's DestinationRule, if any: Envoy ramps
	// new endpoints up over it, so their early signals do not show their capacity.
	warmup time.Duration
}

// idleTarget is an AdaptiveLoadBalancer the cycle does not weight because its mode is Frozen;
// the cycle still owns its WeightsApplied condition.
type idleTarget struct {
	alb       *adlbv1.AdaptiveLoadBalancer
	condition metav1.Condition
}

func (w *WeightCycle) dueTargets(ctx context.Context, now time.Time) ([]*dueTarget, []idleTarget, error) {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := w.Client.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list AdaptiveLoadBalancers: %w", err)
	}
	w.forgetGone(list.Items)
	var due []*dueTarget
	var idle []idleTarget
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
		c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored)
		if c == nil || c.Status != metav1.ConditionTrue {
			continue // nothing mirrored yet, or a condition the mirror reports
		}
		if alb.Spec.Mode == adlbv1.ModeFrozen {
			idle = append(idle, idleTarget{alb: alb, condition: metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue,
				Reason: adlbv1.ReasonFrozen, Message: "mode is Frozen: the weights in the ServiceEntry are kept as they are", ObservedGeneration: alb.Generation}})
			// A later switch back to Active starts a new hold history.
			delete(w.states, key)
			continue
		}
		settings, err := EngineSettings(alb)
		if err != nil {
			continue // rejected at admission in practice; the mirror reports it
		}
		se := &networkingv1.ServiceEntry{}
		if err := w.Client.Get(ctx, types.NamespacedName{Namespace: alb.Namespace, Name: alb.Spec.TargetRef.Name}, se); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the mirror has just deleted it, or is about to create it
			}
			return nil, nil, fmt.Errorf("get ServiceEntry %s/%s: %w", alb.Namespace, alb.Spec.TargetRef.Name, err)
		}
		if !metav1.IsControlledBy(se, alb) {
			continue
		}
		warmup, err := w.warmupOf(ctx, alb)
		if err != nil {
			return nil, nil, err
		}
		d := &dueTarget{key: key, alb: alb, se: se, settings: settings, interval: interval, pods: map[string]*corev1.Pod{},
			current: map[string]int{}, peerGroup: map[string]string{}, nodeCPU: map[string]float64{}, warmup: warmup}
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
		listed, err := w.slicePods(ctx, alb)
		if err != nil {
			return nil, nil, err
		}
		for _, e := range se.Spec.Endpoints {
			d.podOrder = append(d.podOrder, e.Address)
			d.current[e.Address] = int(e.Weight)
			pod, err := w.podOf(ctx, alb.Namespace, e.Address, listed[e.Address])
			if err != nil {
				return nil, nil, err
			}
			if pod != nil {
				d.pods[e.Address] = pod
				facts, err := w.node(ctx, pod.Spec.NodeName, nodes)
				if err != nil {
					return nil, nil, err
				}
				if facts.instanceType != "" {
					d.peerGroup[e.Address] = facts.instanceType
				}
				if facts.cpuCores > 0 {
					d.nodeCPU[e.Address] = facts.cpuCores
				}
			}
		}
		due = append(due, d)
	}
	sort.Slice(due, func(i, j int) bool { return due[i].key.String() < due[j].key.String() })
	return due, idle, nil
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

// observationKey identifies one fetched observation: the same pod under two Services with
// different queries is observed twice, once per set of queries.
type observationKey struct {
	queries metrics.QueryTemplates
	pod     types.NamespacedName
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
	dropGone(w.states, live)
	dropGone(w.lastRun, live)
	dropGone(w.lastStatusWrite, live)
	dropGone(w.writtenPeak, live)
	dropGone(w.known, live)
	dropGone(w.rateHistory, live)
}

// dropGone deletes the entries of AdaptiveLoadBalancers that are not live.
func dropGone[V any](m map[types.NamespacedName]V, live map[types.NamespacedName]bool) {
	maps.DeleteFunc(m, func(key types.NamespacedName, _ V) bool { return !live[key] })
}

// fetchResult is one batched fetch, shared by every target with the same interval.
type fetchResult struct {
	observations map[observationKey]metrics.Observation
	err          error
}

// fetch sends one batched request per distinct interval (normally one): its queries cover every
// due Service's pods, whatever their number.
func (w *WeightCycle) fetch(ctx context.Context, now time.Time, due []*dueTarget) map[time.Duration]fetchResult {
	byInterval := map[time.Duration][]metrics.Pod{}
	requested := map[time.Duration]map[observationKey]bool{}
	for _, d := range due {
		if requested[d.interval] == nil {
			requested[d.interval] = map[observationKey]bool{}
		}
		for _, ip := range d.podOrder {
			pod, ok := d.pods[ip]
			if !ok {
				continue
			}
			k := observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
			if requested[d.interval][k] {
				continue
			}
			requested[d.interval][k] = true
			byInterval[d.interval] = append(byInterval[d.interval], metrics.Pod{Namespace: pod.Namespace, Name: pod.Name, IP: ip, CPULimitCores: cpuLimit(pod), Queries: d.queries})
		}
	}
	out := map[time.Duration]fetchResult{}
	for interval, pods := range byInterval {
		res := fetchResult{observations: map[observationKey]metrics.Observation{}}
		batch, err := w.Source.Fetch(ctx, metrics.Request{Pods: pods, Now: now, Window: 2 * interval, Interval: interval})
		res.err = err
		// The source returns one observation per request entry, each under the entry's queries.
		for _, o := range batch.Observations {
			res.observations[observationKey{queries: o.Queries, pod: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}}] = o
		}
		out[interval] = res
	}
	return out
}

// latencyBuckets hands a pod's fetched latency histogram to the engine; nil when there is none.
func latencyBuckets(fetched []metrics.LatencyBucket) []weights.LatencyBucket {
	if len(fetched) == 0 {
		return nil
	}
	out := make([]weights.LatencyBucket, len(fetched))
	for i, b := range fetched {
		out[i] = weights.LatencyBucket{UpperBoundSeconds: b.UpperBoundSeconds, Count: b.Count}
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

// metricsHealth sums up one target's metrics for its condition, its log lines and its events.
type metricsHealth struct {
	pods int
	// complete counts the pods with every signal the algorithm needs, usable (present, finite
	// and fresh). None at all is a metrics outage.
	complete int
	// stale counts the pods whose needed signals are all present, some of them too old; age
	// is the youngest of their stale samples' ages and threshold the limit.
	stale          int
	age, threshold time.Duration
	// failed lists the signals whose query failed for every pod (not a per-pod fault such as
	// no series, NaN or a stale sample), and failure one of those errors.
	failed  []metrics.Signal
	failure error
	// detail is every distinct error seen, for the log and the event; never in a condition.
	detail []string
	// rateObserved: some pod's request rate was usable, and serviceRate sums them.
	rateObserved bool
	// histogramFailure is the failure of the latency-histogram query, when it failed for the
	// Service's pods: the engine does without the histograms.
	histogramFailure error
}

// minMembershipShare is the share of the metrics window an endpoint must have spent in the
// ServiceEntry for its signals to count; below it the endpoint is treated as without metrics.
const minMembershipShare = 0.5

// neededSignals are the signals the weight engine cannot do without: the CPU cost per request
// needs both. Error rate and latency only refine it.
var neededSignals = []metrics.Signal{metrics.SignalCPU, metrics.SignalRequestRate}

// queryFailure reports whether a sample's error is the failure of its whole query rather than
// a fault of one pod's data.
func queryFailure(err error) bool {
	// No series at all is not a failure of the query: a Service without latency histograms
	// has no p99, and a missing needed signal is an outage anyway.
	return err != nil && !errors.Is(err, metrics.ErrNoData) && !errors.Is(err, metrics.ErrStale) &&
		!errors.Is(err, metrics.ErrNonFinite) && !errors.Is(err, metrics.ErrDuplicateSeries)
}

// target turns a due AdaptiveLoadBalancer and the batch into the planner's input. A metrics
// outage, for the hold/fallback policy, is "no pod has every signal the algorithm needs": one
// missing signal (only the Istio series, or only CPU) is as much an outage as a TSDB down.
func (d *dueTarget) target(now time.Time, res fetchResult, holdIntervals int, known map[string]bool, membership *Membership) (cycle.Target, metricsHealth) {
	t := cycle.Target{
		Key:        d.key.String(),
		Settings:   d.settings,
		HoldTime:   time.Duration(holdIntervals) * d.interval,
		DryRun:     d.alb.Spec.Mode == adlbv1.ModeDryRun,
		PeerGroups: d.peerGroup,
		Known:      known,
	}
	window := 2 * d.interval
	t.WindowSeconds = window.Seconds()
	t.WindowCoverage = 1
	if !d.lastWrite.IsZero() {
		t.WindowCoverage = math.Min(1, now.Sub(d.lastWrite).Seconds()/window.Seconds())
	}
	h := metricsHealth{threshold: 2 * d.interval}
	seen := map[string]bool{}
	note := func(err error) {
		if err == nil {
			return
		}
		if msg := err.Error(); !seen[msg] && len(h.detail) < 20 {
			seen[msg] = true
			h.detail = append(h.detail, msg)
		}
	}
	signalOK := map[metrics.Signal]bool{}
	var signalErr map[metrics.Signal]error
	for _, ip := range d.podOrder {
		ep := weights.Endpoint{ID: ip, CurrentWeight: d.current[ip]}
		pod, ok := d.pods[ip]
		if !ok {
			t.Endpoints = append(t.Endpoints, ep)
			continue
		}
		h.pods++
		ep.CPULimitCores = cpuLimit(pod)
		ep.NodeCPUCores = d.nodeCPU[ip]
		warming := d.warmup > 0 && pod.Status.StartTime != nil && now.Sub(pod.Status.StartTime.Time) < d.warmup
		o, found := res.observations[observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}]
		if !found {
			// The whole fetch failed (an invalid request, a freshness template that does not render).
			failure := res.err
			if failure == nil {
				failure = errors.New("the metrics source returned nothing for this pod")
			}
			o = metrics.Observation{CPUCores: metrics.Sample{Err: failure}, RequestRate: metrics.Sample{Err: failure}, ErrorRate: metrics.Sample{Err: failure}, LatencyP99Seconds: metrics.Sample{Err: failure}}
		}
		for _, sig := range metrics.Signals {
			sample := o.Sample(sig)
			note(sample.Err)
			if !queryFailure(sample.Err) {
				signalOK[sig] = true
			} else if signalErr == nil || signalErr[sig] == nil {
				if signalErr == nil {
					signalErr = map[metrics.Signal]error{}
				}
				signalErr[sig] = sample.Err
			}
		}
		ep.CPUCores, ep.RequestRate = o.CPUCores.Value, o.RequestRate.Value
		ep.LatencyBuckets = latencyBuckets(o.LatencyBuckets)
		if queryFailure(o.LatencyBucketsErr) {
			note(o.LatencyBucketsErr) // for the log; the engine does without the histogram
			if h.histogramFailure == nil {
				h.histogramFailure = o.LatencyBucketsErr
			}
		}
		if o.RequestRate.Usable() {
			// The whole window's rate, whatever the pod's time in the ServiceEntry: it is
			// what the Service served.
			d.serviceRate += o.RequestRate.Value
			h.rateObserved = true
		}
		ep.ErrorRate, ep.LatencyP99Seconds = o.ErrorRate.Value, o.LatencyP99Seconds.Value
		complete, stale := true, false
		for _, sig := range neededSignals {
			sample := o.Sample(sig)
			if sample.Usable() {
				continue
			}
			complete = false
			var se *metrics.StaleError
			if sample.Present && errors.As(sample.Err, &se) {
				stale = true
				if !se.Unknown && (h.age == 0 || se.Age < h.age) {
					h.age = se.Age
				}
			} else {
				stale = false
				break
			}
		}
		if complete {
			h.complete++
		} else if stale {
			h.stale++
		}
		// Only the time in the ServiceEntry counts: a pod out of it for part of the window
		// (readiness flapping, just joined) served nothing then, which is no sign of spare
		// capacity. Its rates are taken over its time in; too little time in says too little.
		inWindow := membership.Share(d.key, ip, now.Add(-window), now)
		if inWindow < 1 && inWindow >= minMembershipShare {
			ep.CPUCores, ep.RequestRate, ep.ErrorRate = ep.CPUCores/inWindow, ep.RequestRate/inWindow, ep.ErrorRate/inWindow
		}
		// A pod still in its DestinationRule warm-up keeps its weight: Envoy is ramping its
		// traffic up, so its signals say nothing about its capacity yet.
		ep.HasMetrics = complete && !warming && inWindow >= minMembershipShare
		t.Endpoints = append(t.Endpoints, ep)
	}
	for _, sig := range metrics.Signals {
		if h.pods > 0 && !signalOK[sig] {
			h.failed = append(h.failed, sig)
			if h.failure == nil {
				h.failure = signalErr[sig]
			}
		}
	}
	if h.complete == 0 && h.pods > 0 {
		t.MetricsErr = errors.New(h.outageSummary(d.settings.Algorithm))
	}
	return t, h
}

// outageSummary says in one short line why no pod has usable metrics; the full errors go to
// the log and an event.
func (h metricsHealth) outageSummary(alg weights.Algorithm) string {
	needed := fmt.Sprintf("no pod has every signal the %s algorithm needs (%s)", alg, signalList(neededSignals))
	switch {
	case h.stale == h.pods:
		return fmt.Sprintf("%s: every pod's newest sample is too old (%s, limit %s = 2× interval); %s", needed, h.age.Round(time.Second), h.threshold, staleHint)
	case len(h.failed) > 0:
		return fmt.Sprintf("%s: %s query failed: %s", needed, signalList(h.failed), shorten(h.failure.Error(), 160))
	}
	return needed + ": " + shorten(strings.Join(h.detail, "; "), 200)
}

// staleHint says what to change when samples arrive too old.
const staleHint = "the TSDB may answer in the past (VictoriaMetrics: -search.latencyOffset, default 30s): lower it or raise spec.interval; see docs/metrics.md"

func signalList(sigs []metrics.Signal) string {
	names := make([]string, len(sigs))
	for i, s := range sigs {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// shorten keeps a condition message bounded: the details belong in events and logs.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// writeWeights patches only the weights of the ServiceEntry's current endpoints; an endpoint the
// mirror added or removed meanwhile is left to the mirror.
// errSupersededByReplan: the mirror re-planned the weights for a newer membership since the
// cycle read the ServiceEntry; the cycle's decision counts endpoints that left.
var errSupersededByReplan = errors.New("the endpoint mirror re-planned the weights since this cycle planned")

// writeWeights writes decision's weights. With yieldToReplan, it writes nothing and returns
// errSupersededByReplan when the mirror has re-planned key's weights since ReplanSeq gave
// replanSeq: checked after reading the version to patch, so that a re-plan written after the
// check makes the patch conflict instead of being overwritten.
func (w *WeightCycle) writeWeights(ctx context.Context, d *dueTarget, decision weights.Decision, yieldToReplan bool, replanSeq uint64) error {
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
	if yieldToReplan && w.Membership.ReplannedSince(d.key, replanSeq) {
		return errSupersededByReplan
	}
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
	w.Membership.Weighted(d.key, next)
	w.Metrics.ServiceEntryWrites.WithLabelValues(WriteReasonWeights).Inc()
	return nil
}

// conditions turns one target's cycle into its MetricsAvailable and WeightsApplied conditions.
// Messages stay short (a few hundred bytes): the full errors go to events and the log.
func (d *dueTarget) conditions(o cycle.Outcome, gen int64) (metricsCond, weightsCond metav1.Condition) {
	h := d.health
	metricsCond = metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonMetricsOK, Message: "metrics fetched for this Service's pods", ObservedGeneration: gen}
	switch {
	case h.pods > 0 && h.complete == 0:
		reason := adlbv1.ReasonMetricsFailed
		if h.stale == h.pods {
			reason = adlbv1.ReasonMetricsStale
		}
		metricsCond.Status, metricsCond.Reason, metricsCond.Message = metav1.ConditionFalse, reason, h.outageSummary(d.settings.Algorithm)
	case len(h.failed) > 0:
		metricsCond.Status, metricsCond.Reason = metav1.ConditionFalse, adlbv1.ReasonQueryFailed
		metricsCond.Message = fmt.Sprintf("%s query failed for every pod: %s; the weights use the signals that work", signalList(h.failed), shorten(h.failure.Error(), 200))
	case h.complete < h.pods:
		metricsCond.Message = fmt.Sprintf("metrics fetched; %d of %d pods without usable metrics keep their weight", h.pods-h.complete, h.pods)
		if h.stale > 0 {
			metricsCond.Message += fmt.Sprintf(" (%d stale: newest sample %s old, limit %s; %s)", h.stale, h.age.Round(time.Second), h.threshold, staleHint)
		}
	}
	if d.overridesIgnored {
		const ignored = "spec.metrics.queries ignored: the operator runs without --allow-query-overrides, so the default queries are used"
		if metricsCond.Status == metav1.ConditionTrue {
			metricsCond.Reason, metricsCond.Message = adlbv1.ReasonQueryOverridesIgnored, ignored+"; "+metricsCond.Message
		} else {
			metricsCond.Message = shorten(metricsCond.Message, 400) + "; " + ignored
		}
	}
	weightsCond = metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonWeightsApplied, Message: o.Reason, ObservedGeneration: gen}
	switch {
	case d.writeErr != nil:
		weightsCond.Status, weightsCond.Reason = metav1.ConditionFalse, adlbv1.ReasonWriteFailed
		weightsCond.Message = "the weight write failed; the ServiceEntry keeps its weights and the next cycle retries: " + shorten(d.writeErr.Error(), 200)
	case o.Err != nil:
		weightsCond.Status, weightsCond.Reason, weightsCond.Message = metav1.ConditionFalse, adlbv1.ReasonWriteFailed, shorten(o.Err.Error(), 300)
	case o.Fallback:
		weightsCond.Reason = adlbv1.ReasonFallback
	case o.Action == cycle.ActionHold:
		weightsCond.Message = fmt.Sprintf("last weights held while metrics are unavailable (for up to %s)", d.observed.HoldTime)
	case o.Action == cycle.ActionDryRun:
		weightsCond.Status, weightsCond.Reason, weightsCond.Message = metav1.ConditionFalse, adlbv1.ReasonDryRun, "mode is DryRun: "+o.Reason+" (not written)"
	case o.Action == cycle.ActionDeferred:
		weightsCond.Status, weightsCond.Reason = metav1.ConditionFalse, adlbv1.ReasonDeferred
	}
	weightsCond.Message = shorten(weightsCond.Message, 600)
	if h.histogramFailure != nil && weightsCond.Status == metav1.ConditionTrue {
		// Only in the message, and by reason rather than the full error (which can change every
		// cycle): the weights are still applied, so Ready stays True and the status is not
		// rewritten each cycle; the error itself is in the log and the query-error counter.
		weightsCond.Message += fmt.Sprintf("; the latency-histogram query failed (%s): the weights are computed without latency histograms (adaptivelb_metrics_query_errors_total{signal=\"latencyHistogram\"}; the weight cycle's log has the error)",
			metrics.Reason(h.histogramFailure))
	}
	return metricsCond, weightsCond
}

// writeStatus publishes the cycle's outcome: conditions, per-endpoint weights and reasons,
// events and log lines. It writes only the weight cycle's part of the status, under an
// optimistic lock (status.go).
func (w *WeightCycle) writeStatus(ctx context.Context, d *dueTarget, o cycle.Outcome, now time.Time) error {
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := w.Client.Get(ctx, d.key, alb); err != nil {
		return client.IgnoreNotFound(err)
	}
	applied := d.writeErr == nil && o.Action == cycle.ActionWrite
	if applied || (o.Action == cycle.ActionDryRun && d.writeErr == nil) {
		ws, pods := map[string]int{}, map[string]string{}
		for _, r := range o.Decision.Endpoints {
			ws[r.ID] = r.Weight
			if p, ok := d.pods[r.ID]; ok {
				pods[r.ID] = p.Name
			}
		}
		w.Metrics.SetEndpointWeights(alb.Namespace, alb.Name, ws, pods)
	}
	var oldMetrics, metricsCond, weightsCond metav1.Condition
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		// The mirror may have deleted the ServiceEntry since this cycle read it (the Service
		// became unsupported, say): WeightsApplied is then the mirror's NoServiceEntry, and a
		// report on weights of a ServiceEntry that is gone would contradict it.
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Status != metav1.ConditionTrue {
			return false
		}
		before := alb.Status.DeepCopy()
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionMetricsAvailable); c != nil {
			oldMetrics = *c
		}
		metricsCond, weightsCond = d.conditions(o, alb.Generation)
		meta.SetStatusCondition(&alb.Status.Conditions, metricsCond)
		meta.SetStatusCondition(&alb.Status.Conditions, weightsCond)
		if d.writeErr == nil {
			d.setEndpoints(&alb.Status, o, now)
		}
		if applied {
			t := metav1.NewTime(now)
			alb.Status.LastWeightWrite = &t
		}
		if p := recentPeakStatus(d.peak, d.hasPeak); p != nil {
			alb.Status.RecentPeak = p
		}
		meta.SetStatusCondition(&alb.Status.Conditions, readyCondition(alb.Status.Conditions, alb.Generation))
		return !w.skipStatusWrite(d.key, before, &alb.Status, now)
	}
	_, err := updateStatus(ctx, w.Client, w.APIReader, alb, mutate)
	w.tell(ctx, alb, d, o, oldMetrics, metricsCond)
	return err
}

// setEndpoints writes the cycle's part of each endpoint's status: its reason and signals, and
// its weight when it was written (or, in DryRun, would be).
func (d *dueTarget) setEndpoints(status *adlbv1.AdaptiveLoadBalancerStatus, o cycle.Outcome, now time.Time) {
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
	for i := range status.Endpoints {
		e := &status.Endpoints[i]
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
		if (o.Action == cycle.ActionWrite || o.Action == cycle.ActionDryRun) && int32(r.Weight) != e.Weight {
			e.Weight = int32(r.Weight)
			e.LastChange = &nowT
		}
	}
}

// tell logs each decision of the cycle once, at info level with the object's key, and records
// the events: a weight write, a write failure, the start of an outage or of stale metrics, a
// failing query, the fallback to equal weights and the recovery. Errors in full go here, not
// into the conditions.
func (w *WeightCycle) tell(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, d *dueTarget, o cycle.Outcome, oldMetrics, metricsCond metav1.Condition) {
	logger := log.FromContext(ctx).WithValues("adaptiveLoadBalancer", d.key)
	details := strings.Join(d.health.detail, "; ")
	switch {
	case d.writeErr != nil:
		logger.Error(d.writeErr, "weight write failed; the ServiceEntry keeps its weights and the next cycle retries")
		w.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonWriteFailed, shorten("weight write failed: "+d.writeErr.Error(), 1000))
	case o.Action == cycle.ActionWrite:
		logger.Info("weights written", "reason", o.Reason, "endpoints", len(o.Decision.Endpoints), "largestChangeFactor", strconv.FormatFloat(math.Exp(o.Need), 'f', 2, 64), "fallback", o.Fallback)
	}
	if metricsCond.Reason != oldMetrics.Reason {
		switch metricsCond.Reason {
		case adlbv1.ReasonMetricsOK:
			if oldMetrics.Status == metav1.ConditionFalse {
				logger.Info("metrics recovered", "previously", oldMetrics.Reason)
			}
		case adlbv1.ReasonMetricsStale:
			logger.Info("metrics stale: no pod has a recent enough sample; weights held, then reset to equal after the hold time", "newestSampleAge", d.health.age.String(), "limit", d.health.threshold.String(), "hint", staleHint)
			w.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonMetricsStale, shorten(metricsCond.Message, 1000))
		case adlbv1.ReasonMetricsFailed:
			logger.Info("metrics outage: no pod has every signal the algorithm needs; weights held, then reset to equal after the hold time", "holdTime", d.observed.HoldTime.String(), "errors", details)
			w.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonMetricsFailed, shorten(metricsCond.Message+". Errors: "+details, 1000))
		case adlbv1.ReasonQueryFailed:
			logger.Info("a query fails for every pod; the weights use the signals that work", "signals", signalList(d.health.failed), "errors", details)
			w.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonQueryFailed, shorten(metricsCond.Message+". Errors: "+details, 1000))
		}
	}
	switch {
	case o.FallbackStarted && d.writeErr == nil:
		logger.Info("metrics unavailable for longer than the hold time: weights reset to equal", "holdTime", d.observed.HoldTime.String())
		w.Recorder.Event(alb, corev1.EventTypeWarning, EventFallback, shorten(o.Reason, 1000))
	case o.Recovered:
		w.Recorder.Event(alb, corev1.EventTypeNormal, EventMetricsRecovered, "metrics are back; adaptive weights resume")
	case o.Action == cycle.ActionWrite && d.writeErr == nil && o.Need >= largeShift:
		w.Recorder.Eventf(alb, corev1.EventTypeNormal, EventWeightsShifted, "an endpoint's weight moved by a factor of %.1f: %s", math.Exp(o.Need), o.Reason)
	}
}

// writeIdleStatus sets the WeightsApplied condition of a Frozen AdaptiveLoadBalancer; it writes
// only when the condition changes.
func (w *WeightCycle) writeIdleStatus(ctx context.Context, t idleTarget) {
	alb := t.alb.DeepCopy()
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		c := t.condition
		c.ObservedGeneration = alb.Generation
		return meta.SetStatusCondition(&alb.Status.Conditions, c)
	}
	if _, err := updateStatus(ctx, w.Client, w.APIReader, alb, mutate); err != nil {
		log.FromContext(ctx).Error(err, "status write failed", "adaptiveLoadBalancer", client.ObjectKeyFromObject(alb))
	}
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
