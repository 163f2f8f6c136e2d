package controller

import (
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
)

// seedState rebuilds the planner's state from an AdaptiveLoadBalancer's status, for a target
// this process has not planned yet. Metrics that were good when the previous leader last wrote
// the status are taken as good until now (the hold period then starts at the first failure); a
// hold in progress continues from when it began; a fallback stays a fallback; a Service still
// awaiting its first metrics holds from its creation.
func seedState(alb *adlbv1.AdaptiveLoadBalancer, now time.Time, interval time.Duration) cycle.State {
	var st cycle.State
	// The tail algorithm's distrust of its model: a new leader must not plan from a model the
	// previous one had just found at fault.
	if mc := alb.Status.ModelCheck; mc != nil {
		if v, err := strconv.ParseFloat(string(mc.Distrust), 64); err == nil && v > 0 && v <= 1 {
			st.ModelDistrust = v
		}
	}
	if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionWeightsApplied); c != nil && c.Reason == adlbv1.ReasonFallback {
		st.FallenBack = true
		return st
	}
	m := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionMetricsAvailable)
	switch {
	case m == nil || m.Reason == adlbv1.ReasonAwaitingMetrics:
		// No cycle has had usable metrics for it yet: its hold time counts from its creation, so
		// that a new Service is not in an outage before the TSDB has scraped its pods.
		st.LastGoodMetrics = alb.CreationTimestamp.Time
	case m.Reason == adlbv1.ReasonFrozen:
		// Back from Frozen, which fetched no metrics: a hold starts at the first failure.
		st.LastGoodMetrics = now
	case m.Status == metav1.ConditionTrue || m.Reason == adlbv1.ReasonQueryFailed:
		// QueryFailed: an optional signal failed, the ones the engine needs were good.
		st.LastGoodMetrics = now
	case m.Reason == adlbv1.ReasonMetricsFailed || m.Reason == adlbv1.ReasonMetricsStale:
		// The condition turned False at the first failed cycle, one interval after the last good one.
		st.LastGoodMetrics = m.LastTransitionTime.Add(-interval)
	}
	return st
}

// evaluate turns each due target's gathered facts and fetched metrics into the planner's input
// (d.observed), with the health of its metrics and the Service's recent peak rate.
func (w *WeightCycle) evaluate(start time.Time, due []*dueTarget, batches map[time.Duration]fetchResult, report *CycleReport) {
	for _, d := range due {
		// Weights the mirror re-planned when endpoints left count as a write for the coverage.
		if d.replannedAt.After(d.lastWrite) {
			d.lastWrite = d.replannedAt
		}
		window := 2 * d.interval
		d.observed, d.health = d.target(start, batches[d.interval], window, max(1, w.HoldIntervals), d.knownEndpoints(w.known[d.key]), w.Membership)
		// A relief's write counts as a weight write for the window's coverage, and its cuts
		// for the pods it relieved (restored slowly) and answered (not halved again).
		if relief := w.markRelieved(d, start, d.health.dataEnd, window); relief.After(d.lastWrite) {
			d.lastWrite = relief
			d.observed.WindowCoverage = windowCoverage(d.health.dataEnd, d.lastWrite, window)
		}
		d.surge = w.surgeBoundFor(d, start)
		d.observed.SurgeFactor, d.observed.LoadHistory = d.surge.input, d.surge.engineHistory()
		if _, planned := w.states[d.key]; !planned {
			// A new leader, or the first cycle: continue from the peak the status recorded.
			w.seedPeak(d.key, d.alb, start)
		}
		d.observed.RecentPeakRequestRate = w.recentPeak(d.key, start, d.serviceRate, d.health.rateObserved)
		d.observed.ProjectedRequestRate = w.projectedRate(d.key, start.Sub(d.health.dataEnd), d.interval)
		d.peak, d.hasPeak = w.peakObservation(d.key)
		report.Inputs[d.key] = d.observed
	}
}

// plan runs the planner over the due targets. It returns one outcome per target (in due's
// order), the states the planner started from and the ones it decided, by target key.
func (w *WeightCycle) plan(start time.Time, due []*dueTarget) ([]cycle.Outcome, map[string]cycle.State, map[string]cycle.State) {
	targets := make([]cycle.Target, 0, len(due))
	prev := map[string]cycle.State{}
	for _, d := range due {
		targets = append(targets, d.observed)
		st, ok := w.states[d.key]
		if !ok {
			// A new leader, or the first cycle: continue the previous leader's hold period
			// from what its status says, instead of resetting the weights at the first failure.
			st = seedState(d.alb, start, d.interval)
		}
		prev[d.key.String()] = st
	}
	// The reliefs written since the last cycle went out whatever the budget, and count against it.
	outcomes, next := cycle.PlanAfterUrgent(start, targets, prev, w.Budget, w.reliefWrites)
	w.reliefWrites = 0
	return outcomes, prev, next
}

// knownEndpoints marks, by endpoint IP, the endpoints whose pod's weight came from its own
// metrics in an earlier cycle (knownPods, by pod name): a pod that took over another's address
// inherits nothing.
func (d *dueTarget) knownEndpoints(knownPods map[string]bool) map[string]bool {
	out := map[string]bool{}
	for ip, pod := range d.pods {
		if knownPods[pod.Name] {
			out[ip] = true
		}
	}
	return out
}
