package controller

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

// conditions turns one target's cycle into its MetricsAvailable and WeightsApplied conditions.
// Messages stay short (a few hundred bytes): the full errors go to events and the log.
func (d *dueTarget) conditions(o cycle.Outcome, gen int64, prevMetricsReason string) (metricsCond, weightsCond metav1.Condition) {
	h := d.health
	metricsCond = metav1.Condition{Type: adlbv1.ConditionMetricsAvailable, Status: metav1.ConditionTrue, Reason: adlbv1.ReasonMetricsOK, Message: "metrics fetched for this Service's pods", ObservedGeneration: gen}
	// A Service that never had usable metrics and whose pods have no series at all yet, within the
	// hold time after its creation (the planner holds from then: seedState), awaits its first
	// scrape: no outage yet. A TSDB that fails or answers stale samples is reported at once.
	awaiting := (prevMetricsReason == "" || prevMetricsReason == adlbv1.ReasonAwaitingMetrics) && o.Action == cycle.ActionHold &&
		h.pods > 0 && h.unscraped == h.pods
	switch {
	case awaiting:
		metricsCond.Status, metricsCond.Reason = metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics
		metricsCond.Message = fmt.Sprintf("no usable metrics yet for this Service's pods (%s); reported as an outage if none arrive within %s of its creation",
			shorten(h.outageSummary(d.settings.Algorithm), 300), d.observed.HoldTime)
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
		if len(d.reached) > 0 {
			weightsCond.Message = "the weight write failed part-way: the ServiceEntry slices it reached carry the new weights, the others keep theirs, and the next cycle writes the rest: " + shorten(d.writeErr.Error(), 200)
		}
	case o.Err != nil:
		weightsCond.Status, weightsCond.Reason, weightsCond.Message = metav1.ConditionFalse, adlbv1.ReasonWriteFailed, shorten(o.Err.Error(), 300)
	case o.Action == cycle.ActionDeferred:
		// Also a fallback: it is reported, and announced, once its write has gone out.
		weightsCond.Status, weightsCond.Reason = metav1.ConditionFalse, adlbv1.ReasonDeferred
	case o.Fallback:
		weightsCond.Reason = adlbv1.ReasonFallback
	case awaiting:
		weightsCond.Reason, weightsCond.Message = adlbv1.ReasonEqualWeights, "no usable metrics yet: the endpoints keep the weights the mirror gave them (equal for a new Service) until metrics arrive"
	case o.Decision.ModelOverruled != "" && o.Action == cycle.ActionWrite:
		weightsCond.Reason = adlbv1.ReasonModelOverruled
	case o.Action == cycle.ActionHold:
		weightsCond.Message = fmt.Sprintf("last weights held while metrics are unavailable (for up to %s)", d.observed.HoldTime)
	case o.Action == cycle.ActionDryRun:
		weightsCond.Status, weightsCond.Reason, weightsCond.Message = metav1.ConditionFalse, adlbv1.ReasonDryRun, "mode is DryRun: "+o.Reason+" (not written)"
	}
	weightsCond.Message = shorten(weightsCond.Message, 600)
	if d.warmupErr != nil && weightsCond.Status == metav1.ConditionTrue {
		// Stable words (see errWarmupsUnknown), so the status is not rewritten every cycle.
		weightsCond.Message += "; " + shorten(d.warmupErr.Error(), 200)
	}
	if h.histogramFailure != nil && weightsCond.Status == metav1.ConditionTrue {
		// Only in the message, and by reason rather than the full error (which can change every
		// cycle): the weights are still applied, so Ready stays True and the status is not
		// rewritten each cycle; the error itself is in the log and the query-error counter.
		weightsCond.Message += fmt.Sprintf("; the latency-histogram query failed (%s): the weights are computed without latency histograms (adaptivelb_metrics_query_errors_total{signal=\"latencyHistogram\"}; the weight cycle's log has the error)",
			metrics.Reason(h.histogramFailure))
	}
	return metricsCond, weightsCond
}

// shorten keeps a condition message bounded: the details belong in events and logs.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
