package controller

import (
	"context"
	"strconv"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// writeStatus publishes the cycle's outcome: conditions, per-endpoint weights and reasons,
// events and log lines. It changes only the weight cycle's part of the status, under an
// optimistic lock (status.go), through the status queue when one runs; the events and log lines
// follow the status write, as before the queue.
func (w *WeightCycle) writeStatus(ctx context.Context, d *dueTarget, o cycle.Outcome, now time.Time) {
	applied := d.writeErr == nil && o.Action == cycle.ActionWrite
	// A write that failed part-way changed the slices it reached (d.reached): what it wrote is
	// reported, the rest keeps what it had.
	partly := d.writeErr != nil && len(d.reached) > 0
	if applied || partly || (o.Action == cycle.ActionDryRun && d.writeErr == nil) {
		ws, pods := map[string]int{}, map[string]string{}
		for _, r := range o.Decision.Endpoints {
			ws[r.ID] = r.Weight
			if partly {
				ws[r.ID] = d.current[r.ID]
				if reached, ok := d.reached[r.ID]; ok {
					ws[r.ID] = reached
				}
			}
			if p, ok := d.pods[r.ID]; ok {
				pods[r.ID] = p.Name
			}
		}
		w.Metrics.SetEndpointWeights(d.key.Namespace, d.key.Name, ws, pods)
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
		metricsCond, weightsCond = d.conditions(o, alb.Generation, oldMetrics.Reason)
		meta.SetStatusCondition(&alb.Status.Conditions, metricsCond)
		meta.SetStatusCondition(&alb.Status.Conditions, weightsCond)
		switch {
		case d.writeErr == nil:
			d.setEndpoints(&alb.Status, o, now, nil)
		case partly:
			d.setEndpoints(&alb.Status, o, now, d.reached)
		}
		if applied || partly {
			// The next cycle's metrics window counts from the weights' change, all of it or part.
			t := metav1.NewTime(now)
			alb.Status.LastWeightWrite = &t
		}
		if p := recentPeakStatus(d.peak, d.hasPeak); p != nil {
			alb.Status.RecentPeak = p
		}
		alb.Status.SurgeBound = surgeBoundStatus(d.surge)
		alb.Status.ModelCheck = modelCheckStatus(alb.Status.ModelCheck, o, applied, now)
		meta.SetStatusCondition(&alb.Status.Conditions, readyCondition(alb.Status.Conditions, alb.Generation))
		return !w.skipStatusWrite(d.key, before, &alb.Status, now)
	}
	w.submitStatus(ctx, d.key, statusChange{mutate: mutate, done: func(alb *adlbv1.AdaptiveLoadBalancer, _ bool, _ error) {
		if alb != nil {
			w.tell(ctx, alb, d, o, oldMetrics, metricsCond)
		}
	}})
}

// submitStatus hands a status change of key to the status queue or, when none runs, writes it
// now (read from the cache, written under an optimistic lock) and reports it to c.done.
func (w *WeightCycle) submitStatus(ctx context.Context, key types.NamespacedName, c statusChange) {
	if w.Status != nil {
		w.Status.enqueue(key, c)
		return
	}
	alb, wrote, err := writeStatusChanges(ctx, w.Client, w.APIReader, key, []statusChange{c})
	if err != nil {
		log.FromContext(ctx).Error(err, "status write failed", "adaptiveLoadBalancer", key)
	}
	if c.done != nil {
		c.done(alb, wrote, err)
	}
}

// modelCheckStatus is status.modelCheck after the cycle's outcome o: the distrust the planner
// carries on, and the overrule when its write went out (a write that failed relieved nothing).
// It stays absent while the model was never distrusted, and is kept as it is when the engine did
// not decide (held or failed metrics, an engine error).
func modelCheckStatus(old *adlbv1.ModelCheck, o cycle.Outcome, applied bool, now time.Time) *adlbv1.ModelCheck {
	if o.Err != nil || o.Action == cycle.ActionHold || o.Fallback {
		return old
	}
	distrust := o.Decision.ModelDistrust
	overruled := o.Decision.ModelOverruled != "" && applied
	if old == nil && distrust == 0 && !overruled {
		return nil
	}
	mc := &adlbv1.ModelCheck{}
	if old != nil {
		mc = old.DeepCopy()
	}
	mc.Distrust = adlbv1.Decimal(strconv.FormatFloat(distrust, 'f', 2, 64))
	if overruled {
		t := metav1.NewTime(now)
		mc.LastOverrule, mc.LastOverruleReason = &t, shorten(o.Decision.ModelOverruled, 300)
	}
	return mc
}

// setEndpoints writes the cycle's part of each endpoint's status: its reason and signals, and
// its weight when it was written (or, in DryRun, would be). With reached (a write that failed
// part-way), only the endpoints of the slices it wrote, at the weights it wrote.
func (d *dueTarget) setEndpoints(status *adlbv1.AdaptiveLoadBalancerStatus, o cycle.Outcome, now time.Time, reached map[string]int) {
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
		if reached != nil {
			weight, written := reached[e.IP]
			if !written {
				continue // its slice was not written: its weight and reason stand
			}
			r.Weight = weight
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

// writeIdleStatus sets the conditions the weight cycle owns on a Frozen AdaptiveLoadBalancer:
// WeightsApplied says the weights are kept, and MetricsAvailable that none are fetched (not the
// last outage, which a Frozen object would otherwise report, Ready=False, long after it ended).
// It writes only when a condition changes.
func (w *WeightCycle) writeIdleStatus(ctx context.Context, t idleTarget) {
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		changed := false
		for _, c := range t.conditions {
			c.ObservedGeneration = alb.Generation
			changed = meta.SetStatusCondition(&alb.Status.Conditions, c) || changed
		}
		return changed
	}
	w.submitStatus(ctx, client.ObjectKeyFromObject(t.alb), statusChange{mutate: mutate})
}

// statusSignalsInterval spaces status writes that would only refresh the per-endpoint CPU and
// request rate: they change every cycle, and at 10,000 AdaptiveLoadBalancers on a 30 s interval
// writing them each time would cost the API server 333 patches per second for numbers nothing
// acts on.
const statusSignalsInterval = 5 * time.Minute

// skipStatusWrite reports whether a status write can be left out: nothing changed, or only the
// per-endpoint signals did and they were written less than statusSignalsInterval ago. It records
// the time of every write it lets through. The status change calls it, on the status queue's
// goroutine when one runs.
func (w *WeightCycle) skipStatusWrite(key types.NamespacedName, before, after *adlbv1.AdaptiveLoadBalancerStatus, now time.Time) bool {
	if apiequality.Semantic.DeepEqual(before, after) {
		return true
	}
	w.writtenMu.Lock()
	defer w.writtenMu.Unlock()
	if w.writtenPeak == nil {
		w.writtenPeak = map[types.NamespacedName]*adlbv1.RecentPeak{}
	}
	if w.writtenSurge == nil {
		w.writtenSurge = map[types.NamespacedName]*adlbv1.SurgeBound{}
	}
	if w.statusThrottle.wait(key, now, statusSignalsInterval) > 0 && signalsOnly(w.withWritten(key, before), after) {
		return true
	}
	w.statusThrottle.wrote(key, now)
	if after.RecentPeak != nil {
		w.writtenPeak[key] = after.RecentPeak.DeepCopy()
	}
	if after.SurgeBound != nil {
		w.writtenSurge[key] = after.SurgeBound.DeepCopy()
	}
	return false
}

// withWritten is the status as the cycle last wrote it as far as recentPeak and surgeBound go:
// when the API server returned none (it prunes a field under a CRD that lacks it), the one
// written. w.writtenMu is held.
func (w *WeightCycle) withWritten(key types.NamespacedName, status *adlbv1.AdaptiveLoadBalancerStatus) *adlbv1.AdaptiveLoadBalancerStatus {
	peak, hasPeak := w.writtenPeak[key]
	surge, hasSurge := w.writtenSurge[key]
	if (status.RecentPeak != nil || !hasPeak) && (status.SurgeBound != nil || !hasSurge) {
		return status
	}
	c := status.DeepCopy()
	if c.RecentPeak == nil && hasPeak {
		c.RecentPeak = peak
	}
	if c.SurgeBound == nil && hasSurge {
		c.SurgeBound = surge
	}
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

// writeFailedStatus reports a target whose inputs the cycle could not read: WeightsApplied turns
// False (InputsUnavailable) until a cycle reads them again. Only while the mirror reports the
// ServiceEntry: otherwise WeightsApplied is its NoServiceEntry.
func (w *WeightCycle) writeFailedStatus(ctx context.Context, f failedTarget) {
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Status != metav1.ConditionTrue {
			return false
		}
		return meta.SetStatusCondition(&alb.Status.Conditions, metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionFalse,
			Reason: adlbv1.ReasonInputsUnavailable, ObservedGeneration: alb.Generation,
			Message: "the weight cycle could not read this Service's inputs; its weights are left as they are and the next cycle retries: " + shorten(f.err.Error(), 300)})
	}
	w.submitStatus(ctx, client.ObjectKeyFromObject(f.alb), statusChange{mutate: mutate})
}
