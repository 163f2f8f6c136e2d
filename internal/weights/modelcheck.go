package weights

import (
	"fmt"
	"math"
)

// This file is the tail algorithm's check of its model against what it measures. The model plans
// a split; the next windows show what the split did. Two measurements can overrule the model:
//
//   - a hot group: a group of pods the weights loaded above the fleet's mean CPU utilization that
//     runs near its CPU limit. A pod at its limit is throttled every CFS period and queues without
//     bound, whatever the model predicted for it; Envoy's least-request then spills its excess onto
//     the others, so the served shares understate how much the weights send it and the share
//     feedback alone corrects too little, too late.
//   - a tail the model does not explain: more of a group's requests are slower than a histogram
//     bound than the calibrated model predicts for the load the group carries, by more than
//     sampling noise allows.
//
// Either raises the distrust the engine carries from cycle to cycle (Input.ModelDistrust): the
// target shares move from the model's optimum toward the capacity split, which loads every pod to
// the same fraction of its limit and needs no model. Distrust decays again over clean windows in
// which the measurement agrees with the model.

// hotUtilization is the fraction of its CPU limit from which a group counts as at its limit: at
// 90% a CFS-limited pod with variable request sizes is throttled in most periods.
const hotUtilization = 0.9

// hotExcess is how far above the fleet's mean utilization a hot group must be for the weights to
// be the cause: when every pod is that busy the fleet is overloaded and no split helps, but the
// capacity split still spreads the load most evenly.
const hotExcess = 0.03

// distrustRecovery is how much distrust one clean window removes: four clean windows (two
// minutes at the default interval) return full trust after an overrule.
const distrustRecovery = 0.25

// mispredictionDistrust is the distrust a tail the model does not explain adds.
const mispredictionDistrust = 0.5

// Beyond sampling noise, for the tail check: the measured count above a bound must exceed the
// predicted count by tailCheckZ standard deviations (binomial), and be at least tailCheckRatio
// times it. Bounds where the model expects fewer than tailCheckMinExpected slow requests carry too
// little evidence either way.
const (
	tailCheckZ           = 4
	tailCheckRatio       = 2
	tailCheckMinExpected = 5
	// tailCheckMaxFraction limits the check to the tail: bounds the model expects more than this
	// fraction of the requests above say more about the body of the distribution, which the
	// calibration fits.
	tailCheckMaxFraction = 0.1
)

// modelVerdict is what one window's measurements say about the model.
type modelVerdict struct {
	// hot is true when a group the weights loaded above the fleet's mean sits at its CPU limit.
	hot bool
	// mispredicted is true when a group's measured tail is heavier than the model explains.
	mispredicted bool
	// evidence says which group disagreed and by how much, for the decision's reason.
	evidence string
}

// checkModel compares each group's measurements over the window with its model. It needs the
// groups the tail split was planned with (their members, costs and calibrated models).
func checkModel(endpoints []Endpoint, groups []*podGroup, limit func(Endpoint) float64) modelVerdict {
	var fleetCPU, fleetLimit float64
	type groupLoad struct {
		cpu, limit, rate float64
	}
	loads := make([]groupLoad, len(groups))
	for gi, g := range groups {
		for _, i := range g.members {
			ep := endpoints[i]
			loads[gi].cpu += ep.CPUCores
			loads[gi].limit += limit(ep)
			loads[gi].rate += ep.RequestRate
		}
		fleetCPU += loads[gi].cpu
		fleetLimit += loads[gi].limit
	}
	if fleetLimit <= 0 {
		return modelVerdict{}
	}
	fleetUtilization := fleetCPU / fleetLimit
	var v modelVerdict
	// The coolest group's latency, in units of its own cost, is what a pod of this Service
	// shows when it is not near its limit.
	coolest := -1
	for gi := range groups {
		if groupStretch(endpoints, groups[gi]) > 0 && (coolest < 0 || loads[gi].cpu/loads[gi].limit < loads[coolest].cpu/loads[coolest].limit) {
			coolest = gi
		}
	}
	// The hottest group is named: it is the one to relieve first.
	hottest := -1
	for gi, g := range groups {
		u := loads[gi].cpu / loads[gi].limit
		stretch := groupStretch(endpoints, g)
		// Near its limit, or queueing so hard that the window's average CPU must understate
		// its load now (a load that rose within the window: a flash crowd seen through a
		// lagging TSDB).
		near := u >= hotUtilization || stretch >= severeStretch
		if !near || u < fleetUtilization+hotExcess || (hottest >= 0 && u <= loads[hottest].cpu/loads[hottest].limit) {
			continue
		}
		// And its latency shows it: a queue stretches its p99 beyond what the coolest group's
		// shows for its cost. Small, even requests queue little even at 92%.
		if coolest >= 0 && coolest != gi && stretch >= hotStretchRatio*groupStretch(endpoints, groups[coolest]) {
			hottest = gi
		}
	}
	if hottest >= 0 {
		g := groups[hottest]
		v.hot = true
		v.evidence = fmt.Sprintf("%s at %.0f%% of its CPU limit, above the fleet's %.0f%%, with a p99 of %s", describeGroup(g), 100*loads[hottest].cpu/loads[hottest].limit, 100*fleetUtilization, formatSeconds(groupStretch(endpoints, g)*g.cost))
		return v
	}
	// A tail the model underestimates matters where the weights loaded a group beyond the fleet's
	// mean: moving toward the capacity split relieves that group. A group loaded below the mean
	// would only get more from the capacity split.
	for gi, g := range groups {
		if loads[gi].cpu/loads[gi].limit < fleetUtilization+hotExcess {
			continue
		}
		perPod := loads[gi].rate / float64(len(g.members))
		if msg, bad := tailUnexplained(endpoints, g, perPod); bad {
			v.mispredicted = true
			v.evidence = msg
			return v
		}
	}
	return v
}

// hotMinCoverage is the share of the window that must lie under the current weights for a hot
// group to be acted on before a clean window (as for an overloaded endpoint's cut).
const hotMinCoverage = overloadMinCoverage

// hotStretchRatio is how much longer, in units of its cost, a group's p99 must be than the
// coolest group's for its latency to count as risen with its load.
const hotStretchRatio = 2

// severeStretch is the p99, in units of a group's own cost per request, beyond which a group
// counts as at its limit whatever its average CPU over the window: even a request-size CV of 1.5
// under CFS throttling keeps the p99 within about ten costs; fifty is a queue.
const severeStretch = 50

// groupStretch is the group's mean p99 latency in units of its cost per request; 0 when no
// member reports a p99.
func groupStretch(endpoints []Endpoint, g *podGroup) float64 {
	var sum float64
	n := 0
	for _, i := range g.members {
		if p := endpoints[i].LatencyP99Seconds; p > 0 && finite(p) {
			sum += p
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n) / g.cost
}

// tailUnexplained tests a group's pooled latency histogram against its calibrated model at the
// load each member carries: at every bound in the tail, the measured count above it must not
// exceed the model's expectation beyond sampling noise.
func tailUnexplained(endpoints []Endpoint, g *podGroup, perPodRate float64) (string, bool) {
	bounds, counts := pooledHistogram(endpoints, g.members)
	var total float64
	for _, c := range counts {
		total += c
	}
	if total <= 0 {
		return "", false
	}
	u := g.loadScale * perPodRate / g.capacity
	above := total
	for b, ub := range bounds {
		above -= counts[b]
		if math.IsInf(ub, 1) {
			break
		}
		p := g.model.tail(ub/g.cost, u)
		if p <= 0 || p > tailCheckMaxFraction {
			continue
		}
		expected := total * p
		if expected < tailCheckMinExpected {
			continue
		}
		z := (above - expected) / math.Sqrt(expected*(1-p))
		if z > tailCheckZ && above > tailCheckRatio*expected {
			return fmt.Sprintf("%s: %.2f%% of its requests slower than %s where the model predicts %.2f%%", describeGroup(g), 100*above/total, formatSeconds(ub), 100*p), true
		}
	}
	return "", false
}

// nextDistrust is the distrust to carry into the next cycle, given this window's verdict.
// settled tells whether the window was observed entirely under the current weights at a settled
// load: only such a window can show that the model agrees with the split in force.
func nextDistrust(previous float64, v modelVerdict, settled bool) float64 {
	d := clamp(previous, 0, 1)
	if math.IsNaN(d) {
		d = 0
	}
	switch {
	case v.hot:
		return 1
	case v.mispredicted:
		return math.Min(1, d+mispredictionDistrust)
	case settled:
		return math.Max(0, d-distrustRecovery)
	}
	return d
}

// judgeModel turns one window's verdict into the distrust to carry on, whether the window
// overrules the model now (the correction then goes out past the dead band, the gain gate and the
// settle rules, with the whole correction at once), and whether it resets the weights to the
// capacity split (the first overrule to distrust the model fully).
//
// A window that straddles a weight change, or that was measured while the load swung, holds no
// evidence for or against the split in force, with one exception: a hot group the model still
// trusts, in a window observed mostly under the current weights (coverage at least
// hotMinCoverage: with the TSDB's lag, a window can lie wholly before the last write and show
// the split that write replaced). That group must not wait for a clean window; the write that
// relieves it is then the overrule, and the windows that straddle it are not judged again.
func judgeModel(previous float64, v modelVerdict, settled bool, coverage float64) (distrust float64, overrule, reset bool) {
	if !settled && !(v.hot && previous < 1 && coverage >= hotMinCoverage) {
		return previous, false, false
	}
	distrust = nextDistrust(previous, v, settled)
	overrule = distrust > previous || (v.hot && settled)
	reset = v.hot && previous < 1
	return distrust, overrule, reset
}

// blendTowardCapacity moves target shares from the model's toward the capacity algorithm's
// (the square-root rule at its planning load, which needs no latency model) by the distrust: 0
// keeps the model's, 1 is the capacity algorithm's.
func blendTowardCapacity(model, capacity []float64, ok []bool, distrust float64) []float64 {
	if distrust <= 0 {
		return model
	}
	out := make([]float64, len(model))
	for i := range model {
		if ok[i] {
			out[i] = (1-distrust)*model[i] + distrust*capacity[i]
		}
	}
	return out
}

// describeGroup names a group for a reason: its size and cost per request.
func describeGroup(g *podGroup) string {
	noun := "pods"
	if len(g.members) == 1 {
		noun = "pod"
	}
	return fmt.Sprintf("the group of %d %s costing %s of CPU per request", len(g.members), noun, formatSeconds(g.cost))
}

// formatSeconds writes a duration in seconds the way a status message reads best.
func formatSeconds(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2gs", s)
	case s >= 0.001:
		return fmt.Sprintf("%.3gms", s*1000)
	}
	return fmt.Sprintf("%.3gµs", s*1e6)
}
