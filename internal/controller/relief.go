package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// The check between cycles. A cycle plans from a window of two intervals (a minute by default);
// a pod that slows down (a neighbour takes its cores) queues from the first second. Every
// FastCheckInterval the check reads each pod's newest signals over a short window (two scrapes)
// in one batched fetch for every Service, and weights.Relieve cuts the weight of a pod whose
// latency or CPU has jumped since the last cycle, at once, moving the others toward the capacity
// split when the pod queues (the others may rise, by a cycle's step at most). The next cycle plans
// from there and raises a relieved pod's weight slowly (weights.Endpoint.Relieved), as the
// Horizontal Pod Autoscaler scales up at once and down slowly. The check runs on the weight cycle's goroutine and writes
// through the cycle's write path; its writes are urgent (never held for the write budget, which
// they count against) and never delay the mirror's.

// DefaultFastCheckWindow is the window of the check's rates when WeightCycle.FastCheckWindow is
// zero: two scrapes at Istio's usual 15 s, the shortest that holds two samples on every TSDB.
const DefaultFastCheckWindow = 30 * time.Second

// CheckReport summarises one check between cycles, for tests and logs.
type CheckReport struct {
	// Checked are the AdaptiveLoadBalancers the check judged.
	Checked []types.NamespacedName
	// Relieved are the decisions whose weights were written, by AdaptiveLoadBalancer.
	Relieved map[types.NamespacedName]weights.Decision
	// Failed are the AdaptiveLoadBalancers whose inputs could not be read or whose relief could
	// not be written, and why.
	Failed map[types.NamespacedName]error
}

func (w *WeightCycle) checkWindow() time.Duration {
	if w.FastCheckWindow > 0 {
		return w.FastCheckWindow
	}
	return DefaultFastCheckWindow
}

// checkTimeout bounds one check: no longer than its interval, as the next one reads newer data
// anyway, nor than a cycle.
func (w *WeightCycle) checkTimeout() time.Duration {
	if w.FastCheckInterval <= 0 {
		return w.timeout()
	}
	return min(w.timeout(), max(w.FastCheckInterval, time.Second))
}

// RunCheck runs one check between cycles now: gather the Services the check serves, fetch their
// pods' short-window signals in one batch, evaluate each against its last cycle, write the
// reliefs. It returns an error only when the AdaptiveLoadBalancers cannot be listed.
func (w *WeightCycle) RunCheck(ctx context.Context) (CheckReport, error) {
	report := CheckReport{Relieved: map[types.NamespacedName]weights.Decision{}, Failed: map[types.NamespacedName]error{}}
	if !w.Activity.enter() {
		return report, nil // this manager is being replaced
	}
	defer w.Activity.exit()
	now := w.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.reliefs) == 0 {
		return report, nil // no cycle has observed a Service yet: nothing to judge a jump against
	}
	defer func() { w.Cycle.CheckDuration.Observe(w.Clock.Since(now).Seconds()) }()
	logger := log.FromContext(ctx)
	statusCtx, cancelStatus := context.WithTimeout(context.WithoutCancel(ctx), w.timeout())
	defer cancelStatus()
	ctx, cancel := context.WithTimeout(ctx, w.checkTimeout())
	defer cancel()

	targets, err := w.checkTargets(ctx, &report)
	if err != nil {
		return report, err
	}
	if len(targets) == 0 {
		return report, nil
	}
	window := w.checkWindow()
	// A sample older than the window tells nothing of it: stale beyond the window.
	res := w.fetchBatch(ctx, now, targets, window, window/2)
	if res.err != nil {
		// The cycle reports metrics faults; a check only judges the pods whose signals it has.
		logger.V(1).Info("the check between cycles could not read every signal; pods without them are not judged", "error", res.err.Error())
	}
	for _, d := range targets {
		report.Checked = append(report.Checked, d.key)
		observed, health := d.target(now, res, window, 1, nil, w.Membership)
		m := w.reliefs[d.key]
		// A pod relieved a moment ago is not raised by another pod's relief.
		m.markEndpoints(d, observed.Endpoints, now, health.dataEnd, window)
		// The weights in force must have been settled over the window and a scrape before it
		// (the window holds two scrapes) for a pod's CPU per request to be judged.
		lastWrite := d.lastWrite
		if m.wroteAt.After(lastWrite) {
			lastWrite = m.wroteAt
		}
		in := weights.ReliefInput{
			Endpoints:      observed.Endpoints,
			Baseline:       m.baselineFor(d),
			WindowSeconds:  window.Seconds(),
			Answered:       m.answered(d, health.dataEnd, window),
			WeightsSettled: lastWrite.IsZero() || !lastWrite.Add(pushDelay).After(health.dataEnd.Add(-window-window/2)),
		}
		decision, err := weights.Relieve(in, d.settings)
		if err != nil {
			report.Failed[d.key] = err
			logger.Error(err, "the check between cycles cannot judge this Service", "adaptiveLoadBalancer", d.key)
			continue
		}
		if !decision.Changed {
			continue
		}
		// The mirror's re-plan starts from the last cycle's weights, which this relief replaces:
		// until the next cycle, endpoints that leave keep the others' weights as they are. Forgot
		// before the write, so that no re-plan between the two undoes the relief; a write that
		// fails leaves the mirror without a re-plan until the next cycle, which is safe (the
		// survivors keep their weights).
		w.Membership.ForgetPlan(d.key)
		reached, err := w.writeWeights(ctx, d, decision, true)
		if err != nil {
			if reached.patched > 0 {
				// Some slices carry the relief: the next checks and cycles must know their pods
				// were cut, or they would judge them again on windows that predate the cut.
				w.rememberRelief(d, decision, d.current, w.Clock.Now())
			}
			report.Failed[d.key] = err
			if errors.Is(err, errSupersededByReplan) {
				logger.Info("relief not written: endpoints left since the check read the ServiceEntry, and the mirror re-planned; the next check judges the new membership", "adaptiveLoadBalancer", d.key)
				continue
			}
			w.Metrics.ReconcileErrors.WithLabelValues(errorReason(err)).Inc()
			logger.Error(err, "relief write failed; the ServiceEntry keeps its weights and the next check retries", "adaptiveLoadBalancer", d.key, "reason", decision.Reason)
			continue
		}
		wroteAt := w.Clock.Now()
		report.Relieved[d.key] = decision
		w.rememberRelief(d, decision, d.current, wroteAt)
		w.reliefWrites += reached.patched
		w.Cycle.Reliefs.Inc()
		w.Cycle.EstimatedPushes.Add(float64(len(w.debouncer.Observe(time.Now()))))
		w.writeReliefStatus(statusCtx, d, decision, wroteAt)
	}
	return report, nil
}

// checkTargets gathers the Services the check serves now: Active ones with the capacity or tail
// algorithm whose endpoints are mirrored, that a cycle has observed (their baseline), whose
// interval is longer than the check's (otherwise every check is a cycle), and that are not
// falling back to equal weights for a metrics outage (a relief would leave the fail-open state
// behind the cycle's back). One Service's unreadable inputs skip it, not the others.
func (w *WeightCycle) checkTargets(ctx context.Context, report *CheckReport) ([]*dueTarget, error) {
	var list adlbv1.AdaptiveLoadBalancerList
	if err := w.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list AdaptiveLoadBalancers: %w", err)
	}
	var out []*dueTarget
	nodes := map[string]nodeFacts{}
	for i := range list.Items {
		alb := &list.Items[i]
		key := client.ObjectKeyFromObject(alb)
		m, observed := w.reliefs[key]
		if !observed || len(m.baseline) == 0 || !alb.DeletionTimestamp.IsZero() || w.states[key].FallenBack ||
			(alb.Spec.Mode != "" && alb.Spec.Mode != adlbv1.ModeActive) {
			continue
		}
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Status != metav1.ConditionTrue {
			continue
		}
		settings, err := EngineSettings(alb)
		if err != nil || (settings.Algorithm != weights.AlgorithmCapacity && settings.Algorithm != weights.AlgorithmTail) {
			continue
		}
		interval := w.roundedInterval(alb)
		if interval <= w.FastCheckInterval {
			continue
		}
		gatherCtx, cancel := context.WithTimeout(ctx, max(w.timeout()/10, time.Second))
		d, err := w.gather(gatherCtx, alb, settings, interval, nodes)
		cancel()
		switch {
		case err != nil:
			report.Failed[key] = err
			log.FromContext(ctx).Info("the check between cycles cannot read this Service's inputs; the next check retries", "adaptiveLoadBalancer", key, "error", err.Error())
		case d != nil:
			out = append(out, d)
		}
	}
	return out, nil
}

// roundedInterval is alb's interval, rounded up to a whole number of ticks as the cycle runs it.
func (w *WeightCycle) roundedInterval(alb *adlbv1.AdaptiveLoadBalancer) time.Duration {
	interval := 30 * time.Second
	if alb.Spec.Interval != nil {
		interval = alb.Spec.Interval.Duration
	}
	return time.Duration(math.Ceil(float64(interval)/float64(w.Tick))) * w.Tick
}
