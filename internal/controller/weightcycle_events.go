package controller

import (
	"context"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
)

// Event reasons of the weight cycle.
const (
	EventWeightsShifted   = "WeightsShifted"
	EventFallback         = adlbv1.ReasonFallback
	EventMetricsRecovered = "MetricsRecovered"
	EventModelOverruled   = adlbv1.ReasonModelOverruled
)

// largeShift is the weight move, in log space, from which an Event is recorded (a factor 2).
var largeShift = math.Log(2)

// tell logs each decision of the cycle once, at info level with the object's key, and records
// the events: a weight write, a write failure, the start of an outage or of stale metrics, a
// failing query, the fallback to equal weights and the recovery. Errors in full go here, not
// into the conditions.
func (w *WeightCycle) tell(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, d *dueTarget, o cycle.Outcome, oldMetrics, metricsCond metav1.Condition) {
	logger := log.FromContext(ctx).WithValues("adaptiveLoadBalancer", d.key)
	details := strings.Join(d.health.detail, "; ")
	switch {
	case d.writeErr != nil:
		logger.Error(d.writeErr, "weight write failed; the ServiceEntry slices it did not reach keep their weights and the next cycle retries", "endpointsReached", len(d.reached))
		w.Recorder.Event(alb, corev1.EventTypeWarning, adlbv1.ReasonWriteFailed, shorten("weight write failed: "+d.writeErr.Error(), 1000))
	case o.Action == cycle.ActionWrite:
		logger.Info("weights written", "reason", o.Reason, "endpoints", len(o.Decision.Endpoints), "largestChangeFactor", strconv.FormatFloat(math.Exp(o.Need), 'f', 2, 64), "fallback", o.Fallback,
			"modelDistrust", o.Decision.ModelDistrust, "modelOverruled", o.Decision.ModelOverruled)
		if o.Decision.ModelOverruled != "" {
			w.Cycle.ModelOverrules.Inc()
			w.Recorder.Event(alb, corev1.EventTypeNormal, EventModelOverruled, shorten("measurements overruled the latency model: "+o.Decision.ModelOverruled+"; weights moved toward the capacity split", 1000))
		}
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
	case o.FallbackStarted && o.Action == cycle.ActionWrite && d.writeErr == nil:
		// Announced with the write that resets the weights, not before it (nor when they were
		// equal already: nothing was reset).
		logger.Info("metrics unavailable for longer than the hold time: weights reset to equal", "holdTime", d.observed.HoldTime.String())
		w.Recorder.Event(alb, corev1.EventTypeWarning, EventFallback, shorten(o.Reason, 1000))
	case o.Recovered:
		w.Recorder.Event(alb, corev1.EventTypeNormal, EventMetricsRecovered, "metrics are back; adaptive weights resume")
	case o.Action == cycle.ActionWrite && d.writeErr == nil && o.Need >= largeShift:
		w.Recorder.Eventf(alb, corev1.EventTypeNormal, EventWeightsShifted, "an endpoint's weight moved by a factor of %.1f: %s", math.Exp(o.Need), o.Reason)
	}
}
