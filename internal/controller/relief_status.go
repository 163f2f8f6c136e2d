package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// EventRelieved is the Event of a relief: a pod degraded (its neighbour took its cores, its node
// throttles), which the operator answered at once; a Warning, since the pod is worth a look.
const EventRelieved = adlbv1.ReasonRelieved

// writeReliefStatus says what a relief written at wroteAt did: status.lastRelief and
// lastWeightWrite, each relieved endpoint's weight and reason, and WeightsApplied=True Relieved
// with the evidence. WeightsApplied is the weight path's condition, the cycle's and its checks':
// the next cycle reports its own decision. It also records the Event, the log line and the
// endpoints' weight gauges. It writes only while the mirror reports the ServiceEntry, and only
// the weight path's part of the status, under an optimistic lock, through the status queue when
// one runs.
func (w *WeightCycle) writeReliefStatus(ctx context.Context, d *dueTarget, decision weights.Decision, wroteAt time.Time) {
	ws, pods := map[string]int{}, map[string]string{}
	for _, r := range decision.Endpoints {
		ws[r.ID] = r.Weight
		if p, ok := d.pods[r.ID]; ok {
			pods[r.ID] = p.Name
		}
	}
	w.Metrics.SetEndpointWeights(d.key.Namespace, d.key.Name, ws, pods)
	reason := shorten(decision.Reason, 1000)
	log.FromContext(ctx).Info("relieved between cycles", "adaptiveLoadBalancer", d.key, "reason", decision.Reason)
	w.Recorder.Event(d.alb, corev1.EventTypeWarning, EventRelieved, shorten(decision.Reason, 1000))

	at := metav1.NewTime(wroteAt)
	results := map[string]weights.Result{}
	for _, r := range decision.Endpoints {
		results[r.ID] = r
	}
	mutate := func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Status != metav1.ConditionTrue {
			return false
		}
		alb.Status.LastWeightWrite = &at
		alb.Status.LastRelief = &adlbv1.Relief{Time: at, Reason: reason}
		for i := range alb.Status.Endpoints {
			e := &alb.Status.Endpoints[i]
			r, ok := results[e.IP]
			if !ok || r.Reason == "" {
				continue // not relieved: the cycle's reason and weight stand
			}
			e.Reason = r.Reason
			if int32(r.Weight) != e.Weight {
				e.Weight, e.LastChange = int32(r.Weight), &at
			}
		}
		meta.SetStatusCondition(&alb.Status.Conditions, metav1.Condition{Type: adlbv1.ConditionWeightsApplied, Status: metav1.ConditionTrue,
			Reason: adlbv1.ReasonRelieved, Message: shorten(decision.Reason, 600), ObservedGeneration: alb.Generation})
		return true
	}
	w.submitStatus(ctx, d.key, statusChange{mutate: mutate, done: func(_ *adlbv1.AdaptiveLoadBalancer, wrote bool, _ error) {
		if wrote {
			w.statusThrottle.wrote(d.key, wroteAt)
		}
	}})
}
