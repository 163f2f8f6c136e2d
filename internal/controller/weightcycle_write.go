package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// errSupersededByReplan: the mirror re-planned the weights for a newer membership since the
// cycle read the ServiceEntry; the cycle's decision counts endpoints that left.
var errSupersededByReplan = errors.New("the endpoint mirror re-planned the weights since this cycle planned")

// weightWrite is what a weight write reached: the weight each address now has in the slices
// the write patched or found already carrying the decision, and how many slices it patched.
// After a failure part-way it holds the slices written before the failure.
type weightWrite struct {
	weights map[string]int
	patched int
}

// writeWeights patches the weights of the ServiceEntry slices' current endpoints to decision's,
// each slice with the operator's record of its own endpoints in the same write, and only the
// slices whose weights change; an endpoint the mirror added or removed meanwhile is left to the
// mirror. The weight sum is limited over the union of the slices, which istiod merges into one
// cluster. With yieldToReplan, it writes nothing and returns errSupersededByReplan when a slice
// it would patch carries a re-plan newer than the one the cycle planned from: checked on the
// versions patched under an optimistic lock, so that a re-plan written after the check makes the
// patch conflict instead of being overwritten (the cycle then yields to it too), and a re-plan
// whose write failed is not yielded to. A failure part-way leaves the slices written so far
// with the new weights: the error says how many, what it returns lists them (the membership
// records them too), and the next cycle writes the rest.
func (w *WeightCycle) writeWeights(ctx context.Context, d *dueTarget, decision weights.Decision, yieldToReplan bool) (weightWrite, error) {
	next := decision.Weights()
	if w.Versions == nil { // the cycle holds w.mu here
		w.Versions = &ServiceEntryVersions{}
	}
	type pending struct {
		se, base *networkingv1.ServiceEntry
	}
	var all []pending
	var entries []*apinetworkingv1.WorkloadEntry
	for _, listed := range d.slices {
		key := client.ObjectKeyFromObject(listed)
		cached := &networkingv1.ServiceEntry{}
		if err := w.Client.Get(ctx, key, cached); err != nil {
			return weightWrite{}, fmt.Errorf("get ServiceEntry %s/%s: %w", key.Namespace, key.Name, err)
		}
		se := w.Versions.newest(key, cached)
		if yieldToReplan && replannedAt(se).After(d.replannedAt) {
			return weightWrite{}, errSupersededByReplan
		}
		all = append(all, pending{se: se, base: se.DeepCopy()})
		for _, e := range se.Spec.Endpoints {
			if wgt, ok := next[e.Address]; ok {
				e.Weight = uint32(wgt)
			}
			entries = append(entries, e)
		}
	}
	istio.LimitWeightSum(entries)
	reached := weightWrite{weights: map[string]int{}}
	var err error
	for _, p := range all {
		if !proto.Equal(&p.se.Spec, &p.base.Spec) {
			if err = w.patchWeights(ctx, d, p.se, p.base, yieldToReplan); err != nil {
				break
			}
			reached.patched++
		}
		for _, e := range p.se.Spec.Endpoints {
			reached.weights[e.Address] = int(e.Weight)
		}
	}
	if reached.patched > 0 {
		w.Membership.Weighted(d.key, reached.weights)
		w.Metrics.ServiceEntryWrites.WithLabelValues(WriteReasonWeights).Add(float64(reached.patched))
	}
	switch {
	case err != nil && reached.patched > 0:
		return reached, fmt.Errorf("%w (the weights reached %d of the Service's %d ServiceEntry slices; the next cycle writes the rest)", err, reached.patched, len(all))
	case err != nil:
		return weightWrite{}, err
	}
	return reached, nil
}

// patchWeights writes one slice's new weights, se (changed from base), with its record.
func (w *WeightCycle) patchWeights(ctx context.Context, d *dueTarget, se, base *networkingv1.ServiceEntry, yieldToReplan bool) error {
	key := client.ObjectKeyFromObject(se)
	applied, ok := readApplied(se)
	if !ok {
		applied = appliedWeights{}
	}
	for _, e := range se.Spec.Endpoints {
		if pod := d.slicePod[e.Address]; pod != "" {
			applied[pod] = e.Weight
		}
	}
	setAnnotation(se, AppliedWeightsAnnotation, applied.String())
	// Optimistic lock: a membership write may have landed since the read; then the mirror's
	// version wins and the next cycle retries.
	if err := w.Client.Patch(ctx, se, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			// Someone else wrote since: the next cycle starts from the cache, unless the mirror
			// has remembered its newer write meanwhile.
			w.Versions.forgetIf(key, base.ResourceVersion)
			if yieldToReplan && w.replannedSince(ctx, key, d.replannedAt) {
				return errSupersededByReplan // the write that won carries the mirror's re-plan
			}
		}
		return fmt.Errorf("patch weights of ServiceEntry %s/%s: %w", se.Namespace, se.Name, err)
	}
	w.Versions.rememberWrite(se, base)
	return nil
}

// replannedSince reports whether the ServiceEntry key, read from the API server, carries a
// re-plan newer than the one at planned.
func (w *WeightCycle) replannedSince(ctx context.Context, key client.ObjectKey, planned time.Time) bool {
	reader := w.APIReader
	if reader == nil {
		reader = w.Client
	}
	live := &networkingv1.ServiceEntry{}
	return reader.Get(ctx, key, live) == nil && replannedAt(live).After(planned)
}

// writeBurst carries out the plan: it records each target's new state and writes the weights
// of every target whose outcome is a write, in one tight burst: back to back, well inside one
// istiod debounce window, then the operator is quiet until the next cycle. An outcome whose
// write was superseded by the mirror's re-plan, or failed, is amended in place. It returns how
// many targets the budget deferred.
func (w *WeightCycle) writeBurst(ctx context.Context, start time.Time, due []*dueTarget, outcomes []cycle.Outcome, prev, next map[string]cycle.State, report *CycleReport) int {
	deferred := 0
	for i, d := range due {
		o := &outcomes[i]
		if o.Err == nil {
			// The mirror re-plans from these when endpoints leave before the next cycle.
			w.Membership.RecordPlan(d.alb, 2*d.interval, d.observed, next[d.key.String()].ModelDistrust)
		}
		w.states[d.key] = next[d.key.String()]
		if o.Action == cycle.ActionWrite && ctx.Err() != nil {
			// The cycle's deadline passed before this write: it waits for the next cycle, as one
			// the budget defers.
			o.Action = cycle.ActionDeferred
			o.Reason = fmt.Sprintf("the weight cycle's deadline (%s) passed before this write; carried over to the next cycle (%s)", w.timeout(), o.Reason)
			st := w.states[d.key]
			if st.DeferredSince.IsZero() {
				st.DeferredSince = start
			}
			w.states[d.key] = st
		}
		if o.Action != cycle.ActionDeferred {
			w.lastRun[d.key] = start
		} else {
			deferred++
			w.notFallenBack(d, prev)
		}
		var wroteAt time.Time // on the cycle's clock, which the checks read
		if o.Action == cycle.ActionWrite {
			// A fallback to equal weights is written whatever the mirror re-planned.
			reached, err := w.writeWeights(ctx, d, o.Decision, !o.Fallback)
			if errors.Is(err, errSupersededByReplan) {
				o.Action = cycle.ActionNone
				o.Reason = "endpoints left while this cycle planned: the weights the mirror re-planned for the endpoints that stay are kept until the next cycle"
			} else {
				if err != nil {
					// The status must say what the ServiceEntry really has: the slices written
					// before the failure (d.reached) carry the new weights, the others their old.
					w.Metrics.ReconcileErrors.WithLabelValues(errorReason(err)).Inc()
					d.writeErr, d.reached = err, reached.weights
					w.notFallenBack(d, prev)
				}
				if reached.patched > 0 {
					// The status says so (lastWeightWrite) through the status queue; until it
					// lands, the next cycle's window counts from here.
					if w.weightsWrittenAt == nil {
						w.weightsWrittenAt = map[types.NamespacedName]time.Time{}
					}
					w.weightsWrittenAt[d.key] = start
					// Push estimates need when the writes really reached the API server, not the cycle's clock.
					at := time.Now()
					report.Writes = append(report.Writes, at)
					report.Pushes += len(w.debouncer.Observe(at))
					wroteAt = w.Clock.Now()
				}
				if err == nil {
					report.Written = append(report.Written, d.key)
				}
			}
		}
		// The next checks judge each pod against what this cycle observed.
		w.rememberCycle(d, *o, start, wroteAt)
		if d.health.complete > 0 {
			if w.known[d.key] == nil {
				w.known[d.key] = map[string]bool{}
			}
			for _, e := range d.observed.Endpoints {
				if pod, ok := d.pods[e.ID]; ok && e.HasMetrics {
					w.known[d.key][pod.Name] = true
				}
			}
		}
		report.Outcomes[d.key] = *o
	}
	return deferred
}

// notFallenBack keeps d's planner state as it was before this cycle as far as the fallback goes:
// a fallback not written has not begun, and is reported and announced with the write that lands.
func (w *WeightCycle) notFallenBack(d *dueTarget, prev map[string]cycle.State) {
	st := w.states[d.key]
	st.FallenBack = prev[d.key.String()].FallenBack
	w.states[d.key] = st
}
