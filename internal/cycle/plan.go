// Package cycle plans one weight cycle for every opted-in Service: it runs the weight engine,
// applies the metrics-outage policy, and decides which writes go out now within the
// cluster-wide write budget and which carry over.
//
// It is pure: the operator gathers the inputs (endpoints, current weights, metrics) and performs
// the writes; this package only decides. Time is passed in.
package cycle

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// Action says what the operator must do with one Service this cycle.
type Action string

const (
	// ActionWrite: new weights must be written now.
	ActionWrite Action = "Write"
	// ActionNone: the weights did not move beyond the dead band; nothing to write.
	ActionNone Action = "None"
	// ActionHold: the metrics failed; the last applied weights stay until the hold time runs out.
	ActionHold Action = "Hold"
	// ActionDeferred: a write is needed but the cycle's budget is spent; it carries over.
	ActionDeferred Action = "Deferred"
	// ActionDryRun: weights were computed for status and metrics only.
	ActionDryRun Action = "DryRun"
)

// Target is one AdaptiveLoadBalancer due this cycle.
type Target struct {
	// Key identifies the target (namespace/name); it orders ties deterministically.
	Key string
	// Endpoints carry this cycle's observations and, in CurrentWeight, the weights now applied.
	Endpoints []weights.Endpoint
	Settings  weights.Settings
	// MetricsErr is non-nil when the metrics for this target could not be fetched at all.
	MetricsErr error
	// HoldTime is how long the last weights stay in place after metrics fail (default 5 intervals).
	HoldTime time.Duration
	DryRun   bool
	// WindowCoverage is the share of the metrics window observed under the current weights.
	WindowCoverage float64
	// WindowSeconds is the length of the metrics window (0: unknown).
	WindowSeconds float64
	// RecentPeakRequestRate is the Service's highest request rate over the recent past (0: unknown).
	RecentPeakRequestRate float64
	// PeerGroups names each endpoint's peer group (the instance type of its node), by endpoint
	// ID; "" or absent is no group. See keepWithoutMetrics.
	PeerGroups map[string]string
	// Known marks the endpoints whose weight came from their own metrics in an earlier cycle.
	Known map[string]bool
	// Replan: the endpoint set shrank since these observations were made; see weights.Input.Replan.
	Replan bool
	// ProjectedRequestRate is the Service's rate expected by the time the next cycle's weights
	// take over (0: unknown); see weights.Input.ProjectedRequestRate.
	ProjectedRequestRate float64
	// SurgeFactor is the tail algorithm's surge bound learned from the Service's load history
	// (0: Settings.Tail.SurgeFactor); see weights.Input.SurgeFactor.
	SurgeFactor float64
	// LoadHistory is what the Service's past load says about how fast it rises (zero: unknown);
	// see weights.Input.LoadHistory.
	LoadHistory weights.LoadHistory
	// Slices says which ServiceEntry object (slice) holds each endpoint, by endpoint ID: a
	// write patches each slice whose weights change, and the budget counts those objects. Nil:
	// the Service is one object.
	Slices map[string]int
}

// State is what the planner remembers about a target between cycles; the operator stores it.
type State struct {
	// LastGoodMetrics is when metrics were last fetched successfully.
	LastGoodMetrics time.Time
	// FallenBack is true while the target runs on equal weights because metrics are gone.
	FallenBack bool
	// DeferredSince is when a needed write was first deferred by the budget; zero if none is pending.
	DeferredSince time.Time
	// ModelDistrust is the tail algorithm's distrust of its model after the last decision
	// (weights.Decision.ModelDistrust), carried into the next one.
	ModelDistrust float64
}

// Outcome is the plan for one target.
type Outcome struct {
	Key      string
	Action   Action
	Decision weights.Decision
	// Need is how far the decided weights are from the applied ones: the largest |log(new/old)|.
	// The budget serves the largest needs first.
	Need float64
	// Objects is how many ServiceEntry objects a write patches: the slices with an endpoint
	// whose weight changes (at least 1). The budget is counted in them.
	Objects int
	// Fallback is true when the decision resets weights to equal because metrics are gone.
	Fallback bool
	// FallbackStarted is true on the cycle the fallback begins (the operator records an Event).
	FallbackStarted bool
	// Recovered is true on the cycle metrics return after a fallback.
	Recovered bool
	Reason    string
	// Err is set when the engine rejected the target's input; the target is left untouched.
	Err error
}

// Plan decides this cycle for every target. budget bounds the ServiceEntry objects the
// ActionWrite outcomes patch (0 means unlimited; see applyBudget). It returns one outcome per
// target, in input order, and the new states.
func Plan(now time.Time, targets []Target, states map[string]State, budget int) ([]Outcome, map[string]State) {
	return PlanAfterUrgent(now, targets, states, budget, 0)
}

// PlanAfterUrgent is Plan when urgent writes of urgentSpent objects went out since the last cycle, outside
// any plan (the reliefs of the checks between cycles): like the urgent writes of a plan, they
// were never held for the budget, and they count against it, so the other writes of this cycle
// get what they left.
func PlanAfterUrgent(now time.Time, targets []Target, states map[string]State, budget, urgentSpent int) ([]Outcome, map[string]State) {
	outcomes := make([]Outcome, len(targets))
	decided := make([]State, len(targets))
	// Each target's decision depends on its own input and state only, so the targets are
	// decided in parallel: the tail algorithm's search costs about a quarter of a millisecond
	// per Service. One CPU is left to the endpoint mirror, which must never wait behind the
	// weights (and a burst on every CPU would spend the container's CFS quota for it).
	// Results are stored by index, so the plan is the same whatever the order the workers
	// finish in.
	workers := max(1, min(runtime.GOMAXPROCS(0)-1, len(targets)))
	var nextTarget atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(nextTarget.Add(1) - 1)
				if i >= len(targets) {
					return
				}
				outcomes[i], decided[i] = decide(now, targets[i], states[targets[i].Key])
			}
		}()
	}
	wg.Wait()
	next := make(map[string]State, len(targets))
	for i, t := range targets {
		next[t.Key] = decided[i]
	}
	applyBudget(now, outcomes, targets, states, next, budget, max(0, urgentSpent))
	return outcomes, next
}

func decide(now time.Time, t Target, st State) (Outcome, State) {
	out := Outcome{Key: t.Key}
	if t.MetricsErr != nil {
		if !st.FallenBack && !st.LastGoodMetrics.IsZero() && now.Sub(st.LastGoodMetrics) < t.HoldTime {
			out.Action = ActionHold
			out.Reason = fmt.Sprintf("metrics unavailable since %s: holding the last weights for up to %s: %v",
				st.LastGoodMetrics.UTC().Format(time.RFC3339), t.HoldTime, t.MetricsErr)
			out.Decision = keep(t.Endpoints)
			return out, st
		}
		// The hold time ran out (or metrics never worked): equal weights are the safe default,
		// Envoy's own balancing then applies as if the operator were not there.
		eps := make([]weights.Endpoint, len(t.Endpoints))
		copy(eps, t.Endpoints)
		for i := range eps {
			eps[i].HasMetrics = false
		}
		if !decideWith(&out, weights.Input{Endpoints: eps}, t.Settings) {
			return out, st
		}
		out.Fallback = true
		out.FallbackStarted = !st.FallenBack
		out.Reason = fmt.Sprintf("metrics unavailable for longer than the hold time %s: weights reset to equal: %v", t.HoldTime, t.MetricsErr)
		st.FallenBack = true
	} else {
		in := weights.Input{
			Endpoints:             t.Endpoints,
			WindowCoverage:        t.WindowCoverage,
			WindowSeconds:         t.WindowSeconds,
			RecentPeakRequestRate: t.RecentPeakRequestRate,
			Replan:                t.Replan,
			ProjectedRequestRate:  t.ProjectedRequestRate,
			ModelDistrust:         st.ModelDistrust,
			SurgeFactor:           t.SurgeFactor,
			LoadHistory:           t.LoadHistory,
		}
		if !decideWith(&out, in, t.Settings) {
			return out, st
		}
		if !judgedModel(t, out.Decision) {
			// Too few measurements to check the model against: the distrust the last verdicts
			// left stands, for the next cycle, the status and a new leader alike.
			out.Decision.ModelDistrust = st.ModelDistrust
		}
		if !t.DryRun {
			// In DryRun the pods carry the mirror's equal weights, not the engine's: what the
			// measurements say of that split is no verdict on the model.
			st.ModelDistrust = out.Decision.ModelDistrust
		}
		keepWithoutMetrics(&out.Decision, t)
		out.Recovered = st.FallenBack
		out.Reason = out.Decision.Reason
		st.LastGoodMetrics = now
		st.FallenBack = false
	}
	out.Need = need(t.Endpoints, out.Decision)
	out.Objects = objectsWritten(t, out.Decision)
	switch {
	case !out.Decision.Changed:
		out.Action = ActionNone
		st.DeferredSince = time.Time{}
	case t.DryRun:
		out.Action = ActionDryRun
		st.DeferredSince = time.Time{}
	default:
		out.Action = ActionWrite
	}
	return out, st
}

// judgedModel reports whether the engine's decision rests on enough measurements to judge the
// tail algorithm's model (weights.Decision.ModelDistrust): with fewer than two measured
// endpoints, or none at all, the engine returns equal weights and no verdict, and its distrust
// of 0 would be taken for a model proven right.
func judgedModel(t Target, d weights.Decision) bool {
	return len(t.Endpoints) > 0 && d.Reason != weights.ReasonTooFewWithData
}

// decideWith runs the engine into out; on an engine error it records it, leaves the target alone
// and returns false.
func decideWith(out *Outcome, in weights.Input, s weights.Settings) bool {
	d, err := weights.Compute(in, s)
	if err != nil {
		out.Err, out.Action, out.Reason = err, ActionNone, err.Error()
		return false
	}
	out.Decision = d
	return true
}

// Reasons for endpoints without usable metrics (see keepWithoutMetrics).
const (
	ReasonNoMetricsKept     = "no usable metrics: last weight kept"
	ReasonNoMetricsPeers    = "no usable metrics: median weight of its instance type"
	ReasonNoMetricsNoPeers  = "no usable metrics and no peer of its instance type: weight kept"
	ReasonTooFewWeightsKept = "fewer than two endpoints with usable metrics: weights kept"
)

// keepWithoutMetrics decides the weights of the endpoints without usable metrics, instead of
// the engine's median of all endpoints: that median overloads a pod on a slow machine whose
// signals went missing (a NaN, a scrape gap) or that just joined. The rule is the mirror's:
//   - a known endpoint (its weight came from its own metrics before) keeps its current weight;
//   - a new one gets the median decided weight of the endpoints with metrics in its peer group
//     (the same instance type serves at the same speed);
//   - without such peers it keeps the weight it has, which the mirror gave it by the same rule.
//
// When fewer than two endpoints have metrics the engine falls back to equal weights; here every
// endpoint keeps its weight instead, as no new information justifies a change.
func keepWithoutMetrics(d *weights.Decision, t Target) {
	keepWithoutMetricsOf(d, t.Endpoints, t.Settings, t.PeerGroups, t.Known)
}

// KeepWithoutMetrics applies the planner's rule for the endpoints without usable metrics (see
// keepWithoutMetrics) to an engine decision, as Plan does after the engine: the simulator calls it
// so that its controller decides what the operator's would.
func KeepWithoutMetrics(d *weights.Decision, endpoints []weights.Endpoint, s weights.Settings, peerGroups map[string]string, known map[string]bool) {
	keepWithoutMetricsOf(d, endpoints, s, peerGroups, known)
}

func keepWithoutMetricsOf(d *weights.Decision, endpoints []weights.Endpoint, settings weights.Settings, peerGroups map[string]string, known map[string]bool) {
	t := Target{Endpoints: endpoints, Settings: settings, PeerGroups: peerGroups, Known: known}
	if len(d.Endpoints) != len(t.Endpoints) {
		return
	}
	withMetrics := 0
	for _, e := range t.Endpoints {
		if e.HasMetrics {
			withMetrics++
		}
	}
	if withMetrics == len(t.Endpoints) {
		return
	}
	clampWeight := func(w int) int { return min(max(w, t.Settings.MinWeight, 1), t.Settings.MaxWeight) }
	if withMetrics < 2 {
		for i, e := range t.Endpoints {
			if e.CurrentWeight > 0 {
				d.Endpoints[i].Weight, d.Endpoints[i].Reason = clampWeight(e.CurrentWeight), ReasonTooFewWeightsKept
			}
		}
		d.Reason = ReasonTooFewWeightsKept
	} else {
		peers := map[string][]int{}
		for i, e := range t.Endpoints {
			if g := t.PeerGroups[e.ID]; e.HasMetrics && g != "" {
				peers[g] = append(peers[g], d.Endpoints[i].Weight)
			}
		}
		for i, e := range t.Endpoints {
			if e.HasMetrics {
				continue
			}
			switch g := t.PeerGroups[e.ID]; {
			case t.Known[e.ID] && e.CurrentWeight > 0:
				d.Endpoints[i].Weight, d.Endpoints[i].Reason = clampWeight(e.CurrentWeight), ReasonNoMetricsKept
			case g != "" && len(peers[g]) > 0:
				d.Endpoints[i].Weight, d.Endpoints[i].Reason = clampWeight(medianInt(peers[g])), ReasonNoMetricsPeers
			case e.CurrentWeight > 0:
				d.Endpoints[i].Weight, d.Endpoints[i].Reason = clampWeight(e.CurrentWeight), ReasonNoMetricsNoPeers
			}
		}
	}
	d.Changed = false
	for i, e := range t.Endpoints {
		if d.Endpoints[i].Weight != e.CurrentWeight {
			d.Changed = true
		}
	}
}

func medianInt(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// keep returns a decision that leaves every weight as it is.
func keep(eps []weights.Endpoint) weights.Decision {
	d := weights.Decision{Endpoints: make([]weights.Result, len(eps)), Reason: "weights held"}
	for i, e := range eps {
		d.Endpoints[i] = weights.Result{ID: e.ID, Weight: e.CurrentWeight, Reason: "held: metrics unavailable"}
	}
	return d
}

// objectsWritten is how many ServiceEntry objects writing d patches: the slices holding an
// endpoint whose weight changes, at least 1 (a write that changes nothing is not made).
func objectsWritten(t Target, d weights.Decision) int {
	if len(t.Slices) == 0 {
		return 1
	}
	changed := map[int]bool{}
	for i, r := range d.Endpoints {
		if i < len(t.Endpoints) && r.Weight != t.Endpoints[i].CurrentWeight {
			changed[t.Slices[r.ID]] = true
		}
	}
	return max(len(changed), 1)
}

// need is the largest relative move, in log space so that halving and doubling weigh the same.
// An endpoint without a weight yet counts as the largest possible need.
func need(eps []weights.Endpoint, d weights.Decision) float64 {
	n := 0.0
	for i, r := range d.Endpoints {
		cur := eps[i].CurrentWeight
		if cur <= 0 {
			return math.Inf(1)
		}
		n = math.Max(n, math.Abs(math.Log(float64(r.Weight)/float64(cur))))
	}
	return n
}

// urgent reports whether a write moves toward safe weights and so must never wait for the budget:
// a fallback to equal weights, or weights moved toward the capacity split because the
// measurements overruled the tail algorithm's model (a group the weights loaded to its limit).
func (o Outcome) urgent() bool { return o.Fallback || o.Decision.ModelOverruled != "" }

// applyBudget keeps the budget's worth of writes, chosen by priority, and defers the rest. The
// budget counts ServiceEntry objects written (Outcome.Objects), the unit the API server and
// istiod pay for: a 10,000-endpoint Service in 100 slices spends 100, a 20-pod one 1.
// Order: urgent writes first (they restore safe weights), then writes carried over from earlier
// cycles, oldest first, so nothing starves behind Services that keep moving; then the largest
// need; then the key, so the choice is deterministic. A fallback is never deferred: it fails
// open, the safe direction, and deferring it would keep weights computed from metrics that are
// gone (at 10,000 Services and a budget of 50 per 5 s tick, a cluster-wide metrics outage would
// take 17 minutes beyond the hold time to reach the last Service). Nor is a write that relieves a
// group the measurements found at its CPU limit (weights.Decision.ModelOverruled): the budget
// must not leave pods throttled that the weights loaded. Nor is a relief between cycles, which
// moves a pod whose latency or CPU jumped toward the capacity split and is written outside any
// plan. Urgent writes count against the budget, spent ones (the reliefs since the last cycle)
// first; the other writes get what they leave. A write that does not fit what is left waits,
// and a later, smaller one that fits goes; a write larger than the whole budget goes when it is
// the first of the cycle's non-urgent writes, alone, so that a Service larger than the budget
// is written at all (it is first once it has waited longest).
func applyBudget(now time.Time, outs []Outcome, targets []Target, prev, next map[string]State, budget, spent int) {
	var writes []int
	for i, o := range outs {
		if o.Action == ActionWrite {
			writes = append(writes, i)
		}
	}
	since := func(i int) time.Time {
		if s := prev[targets[i].Key].DeferredSince; !s.IsZero() {
			return s
		}
		return now
	}
	sort.SliceStable(writes, func(a, b int) bool {
		oa, ob := outs[writes[a]], outs[writes[b]]
		if oa.urgent() != ob.urgent() {
			return oa.urgent()
		}
		if sa, sb := since(writes[a]), since(writes[b]); !sa.Equal(sb) {
			return sa.Before(sb)
		}
		if oa.Need != ob.Need {
			return oa.Need > ob.Need
		}
		return oa.Key < ob.Key
	})
	firstNonUrgent := true
	for _, i := range writes {
		key := targets[i].Key
		st := next[key]
		objects := max(outs[i].Objects, 1)
		fits := budget <= 0 || outs[i].urgent() || spent+objects <= budget || (firstNonUrgent && objects > budget && spent < budget)
		if !outs[i].urgent() {
			firstNonUrgent = false
		}
		if fits {
			spent += objects
			st.DeferredSince = time.Time{}
		} else {
			outs[i].Action = ActionDeferred
			outs[i].Reason = fmt.Sprintf("write budget of %d ServiceEntry objects per cycle spent (this write patches %d); carried over to the next cycle (%s)", budget, objects, outs[i].Reason)
			if st.DeferredSince.IsZero() {
				st.DeferredSince = since(i)
			}
		}
		next[key] = st
	}
}
