package weights

import (
	"fmt"
	"math"
	"strings"
)

// This file is the check between two cycles. A cycle plans from a window of a minute; a pod that
// slows down (a neighbour takes its cores) or that a surge of load overloads queues from the first
// second on. Between cycles the caller reads every pod's newest signals over a short window (two
// scrapes) and Relieve cuts the weight of each pod whose latency or CPU has jumped since the last
// cycle, at once. It cuts the pods that jumped; when one of them queues, it moves the others
// toward the capacity split with it, and those may rise, by at most a cycle's step and never one
// whose cost or latency is rising too. A relief is written only when it lowers a jumped pod's
// share. Restoring a relieved pod waits for a cycle and its whole window, and the cycle raises its
// weight slowly (Endpoint.Relieved), as the Horizontal Pod Autoscaler scales up fast and down
// slowly, the other way round. When the measurement and the plan disagree, the loop corrects
// toward the safe split at once and restores the plan with care.

// Reasons of a relief.
const (
	ReasonRelievedLatency = "latency jumped since the last cycle: weight cut at once"
	ReasonRelievedCPU     = "CPU jumped to its limit since the last cycle: weight cut at once"
	ReasonRelievedCost    = "CPU per request jumped since the last cycle: weight cut with its capacity at once"
	ReasonReliefSafeSplit = "moved to the capacity split while a pod is relieved"
)

// costJumped reports whether an endpoint's CPU per request rose by reliefCostJump or more since
// its baseline, measured over at least reliefMinRequests requests in the short window while the
// pod's own rate held within reliefSteadyLoad of its baseline, so that the rise is neither noise
// nor the skew of two counters scraped at different instants across a change of its load: a pod
// whose node lost cores to a neighbour, or that runs on throttled hardware, needs more CPU time
// per request before any queue shows.
func costJumped(ep, base Endpoint, windowSeconds float64) bool {
	return ep.RequestRate*windowSeconds >= reliefMinRequests &&
		math.Abs(ep.RequestRate/base.RequestRate-1) <= reliefSteadyLoad &&
		ep.CPUCores/ep.RequestRate >= (1+reliefCostJump)*base.CPUCores/base.RequestRate
}

// Relief thresholds. A pod is judged when it runs at least reliefExcess above the fleet's
// utilization, or, for a latency or cost jump, when the short window holds reliefMinRequests of
// its requests and the fleet's load held (a pod whose cores a neighbour took queues with its CPU
// flat, and costs more per request before it is busier than its peers). Its CPU has jumped when it runs at hotUtilization of its limit or more and its
// utilization rose by reliefCPUJump more than the fleet's since the last cycle; its latency has
// jumped when its p99, in units of its own cost per request, exceeds OverloadLatencyRatio times
// the median pod's and reliefLatencyJump times its own p99 of the last cycle. Both compare the
// pod with itself and with the fleet, so a pod the plan runs hot, one slow by nature, or a load
// that rose for every pod is not cut for being what it was.
const (
	reliefExcess = 0.1
	// reliefCostJump is the rise of CPU per request that counts as a jump: far beyond the
	// sampling error of a cost measured over a short window (about 2% for a pod serving 100
	// requests a second with a request-size CV of 1), and beyond the skew between the CPU and
	// request counters' scrapes while the load moves. 15% relieved a steady seed-fib pod whose
	// short window read 17% above its cycle's (23.6 → 24.3 ms); 25% missed each step of a pod
	// slowing by a fifth at a time (slow-steps-rising-load 77.8 ms, 20%: 65.8).
	reliefCostJump = 0.2
	// reliefMinRequests is how many requests a short window's CPU per request must stand on.
	reliefMinRequests = 500
	// reliefSteadyLoad is how far the fleet's rate, and the pod's, may have moved since the last
	// cycle for its CPU per request to be judged.
	reliefSteadyLoad  = 0.15
	reliefCPUJump     = 0.1
	reliefLatencyJump = 3
	// A relief multiplies a weight by at most reliefFactorMax and at least reliefFactorMin: it
	// at least halves the pod's share, and never takes more than 15/16 of it on a short window's
	// estimate.
	reliefFactorMax = 0.5
	reliefFactorMin = 1.0 / 16
	// reliefRestoreStep is the most a cycle raises a relieved endpoint's weight by.
	reliefRestoreStep = 1.5
	// reliefWeightMoved is how far a pod's weight (against the median pod's move), or its share
	// in a relief, must move to count as raised or cut: beyond the rounding of integer weights.
	reliefWeightMoved = 0.05
)

// ReliefInput is one Service between two cycles.
type ReliefInput struct {
	// Endpoints are the endpoints' signals over the short window, ending at the newest data the
	// TSDB holds, with the weights in force in CurrentWeight.
	Endpoints []Endpoint
	// Baseline is what the last cycle observed of each endpoint, by ID. An endpoint without a
	// baseline is not judged: a jump needs a before.
	Baseline map[string]Endpoint
	// WindowSeconds is the short window's length. Without it (0) a pod's CPU per request is not
	// judged: how many requests stand behind it is unknown.
	WindowSeconds float64
	// WeightsSettled says the weights in force reached the clients a scrape interval or more
	// before the short window began. Only then is a pod's CPU per request judged: the CPU and
	// request counters are scraped at different instants, and across a change of the pod's load
	// their short-window ratio is skewed by the change (a pod whose weight tripled can read three
	// times its cost for one check).
	WeightsSettled bool
	// Answered marks, by ID, the endpoints whose weight a write lowered after the short window's
	// middle: the window still shows the jump that write answered, so they are not judged again.
	Answered map[string]bool
}

// Relieve cuts the weight of every endpoint whose latency or CPU has jumped since the last cycle:
// one that queues at least by half, toward the capacity split, with the others moved toward it
// too (none raised beyond a cycle's step, none that is slowing or was relieved a moment ago);
// one that only got slower in proportion to its cost. The decision is Changed only when a jumped
// pod's share falls; its Reason names the pods and the evidence (or why no relief was written).
// With the capacity and tail algorithms only.
func Relieve(in ReliefInput, s Settings) (Decision, error) {
	if err := s.Validate(); err != nil {
		return Decision{}, fmt.Errorf("invalid weight settings: %w", err)
	}
	eps := in.Endpoints
	d := Decision{Endpoints: make([]Result, len(eps)), Reason: "no endpoint's latency or CPU jumped"}
	for i, ep := range eps {
		d.Endpoints[i] = Result{ID: ep.ID, Weight: ep.CurrentWeight}
	}
	if s.Algorithm != AlgorithmCapacity && s.Algorithm != AlgorithmTail {
		return d, nil
	}
	ok := make([]bool, len(eps))
	var limits []float64
	for i, ep := range eps {
		base, known := in.Baseline[ep.ID]
		good, _ := usable(ep, s.Capacity.MinRequestRate)
		baseGood, _ := usable(base, s.Capacity.MinRequestRate)
		ok[i] = good && known && baseGood && ep.CurrentWeight > 0
		if ok[i] && ep.CPULimitCores > 0 {
			limits = append(limits, ep.CPULimitCores)
		}
	}
	if countTrue(ok) < 2 {
		return d, nil
	}
	fallbackLimit := 1.0
	if len(limits) > 0 {
		fallbackLimit = median(limits)
	}
	limit := func(ep Endpoint) float64 {
		if ep.CPULimitCores > 0 {
			return ep.CPULimitCores
		}
		return fallbackLimit
	}
	// The median stretch (p99 over cost per request) says how slow a pod of this Service is
	// when nothing is wrong with it.
	stretchOf := func(ep Endpoint) float64 {
		if ep.LatencyP99Seconds > 0 && finite(ep.LatencyP99Seconds) {
			return ep.LatencyP99Seconds / (ep.CPUCores / ep.RequestRate)
		}
		return 0
	}
	var stretches, baseStretches []float64
	for i, ep := range eps {
		if !ok[i] {
			continue
		}
		if x := stretchOf(ep); x > 0 {
			stretches = append(stretches, x)
		}
		if x := stretchOf(in.Baseline[ep.ID]); x > 0 {
			baseStretches = append(baseStretches, x)
		}
	}
	medianStretch, baseMedianStretch := 0.0, 0.0
	if len(stretches) >= 3 {
		medianStretch = median(stretches)
	}
	if len(baseStretches) >= 3 {
		baseMedianStretch = median(baseStretches)
	}
	ratio := s.Capacity.OverloadLatencyRatio
	// The fleet's utilization, now and at the last cycle: a pod is relieved for what sets it
	// apart from the others, not for a load that rose for all (that is the cycle's to plan for).
	var cpu, lim, baseCPU, baseLim, total, baseTotal float64
	for i, ep := range eps {
		if !ok[i] {
			continue
		}
		base := in.Baseline[ep.ID]
		cpu += ep.CPUCores
		lim += limit(ep)
		baseCPU += base.CPUCores
		baseLim += limit(base)
		total += ep.RequestRate
		baseTotal += base.RequestRate
	}
	fleet, fleetBase := cpu/lim, baseCPU/baseLim
	if fleet >= hotUtilization || baseTotal <= 0 {
		return d, nil // the whole fleet is at its limit: no split relieves it
	}
	// CPU per request is judged only on a steady load: the CPU and request counters are scraped
	// at different instants, and while the load moves a short window's ratio of the two moves too.
	steady := math.Abs(total/baseTotal-1) <= reliefSteadyLoad
	// How each pod's own weight moved since the last cycle, against the median pod's move: a
	// cycle that raised a pod loaded it by design (its CPU rising is the plan, not a jump), and
	// a cycle that cut a pod already answered what it saw of it. Against the median, not as a
	// share: a share moves when any other pod's weight does, and halving one pod of eight would
	// read as a raise of all the others. A pod raised from 0 rose.
	moved := weightMoves(eps, ok, in.Baseline)
	weightRose := func(i int) bool { return moved[i] > 1+reliefWeightMoved }
	weightFell := func(i int) bool { return moved[i] < 1-reliefWeightMoved }
	shareNow := shares(eps, ok, func(ep Endpoint) int { return ep.CurrentWeight })
	jumped := make([]string, len(eps))
	// costRatio is set for a pod relieved for its cost alone: how much more CPU a request takes.
	costRatio := make([]float64, len(eps))
	for i, ep := range eps {
		if !ok[i] || in.Answered[ep.ID] {
			continue
		}
		base := in.Baseline[ep.ID]
		u, uBase := ep.CPUCores/limit(ep), base.CPUCores/limit(base)
		// Busier than the fleet: a pod the fleet's load keeps below its peers' utilization
		// has no queue that a cut would drain, unless its latency says otherwise on enough
		// requests (a neighbour that takes a pod's cores leaves its CPU flat while it queues).
		busy := u >= fleet+reliefExcess
		// The not-busy path needs a steady load too: a burst queues the pods the clients prefer
		// (a fast one) for a moment without anything wrong with them.
		counted := steady && in.WindowSeconds > 0 && ep.RequestRate*in.WindowSeconds >= reliefMinRequests
		if !busy && !counted {
			continue // too few requests to judge its CPU per request either
		}
		queues := medianStretch > 0 && ratio > 0 && stretchOf(ep) > ratio*medianStretch
		switch {
		// Its latency jumped: judged on a busy pod, or on enough requests.
		case queues && ((base.LatencyP99Seconds <= 0 && busy) || (base.LatencyP99Seconds > 0 && ep.LatencyP99Seconds >= reliefLatencyJump*base.LatencyP99Seconds)),
			// Or its queue outlived a cycle that left its share alone and did not shrink: the
			// last cycle already saw it queue beyond its peers.
			busy && queues && baseMedianStretch > 0 && stretchOf(base) > ratio*baseMedianStretch &&
				!weightFell(i) && ep.LatencyP99Seconds >= base.LatencyP99Seconds:
			jumped[i] = fmt.Sprintf("%s: p99 %s, was %s", ep.ID, formatSeconds(ep.LatencyP99Seconds), formatSeconds(base.LatencyP99Seconds))
			d.Endpoints[i].Reason = ReasonRelievedLatency
		// Its CPU jumped to its limit while its share held: a pod the cycle gave more runs
		// hotter by design.
		case busy && !weightRose(i) && u >= hotUtilization && u-uBase >= reliefCPUJump+math.Max(0, fleet-fleetBase):
			jumped[i] = fmt.Sprintf("%s: CPU %.0f%% of its limit, was %.0f%%, the fleet at %.0f%%", ep.ID, 100*u, 100*uBase, 100*fleet)
			d.Endpoints[i].Reason = ReasonRelievedCPU
		// Its CPU per request jumped, on weights that held over the window: every weight
		// (WeightsSettled), or this pod's share through the last cycle's write.
		case steady && (in.WeightsSettled || !(weightRose(i) || weightFell(i))) && costJumped(ep, base, in.WindowSeconds):
			costRatio[i] = (ep.CPUCores / ep.RequestRate) / (base.CPUCores / base.RequestRate)
			jumped[i] = fmt.Sprintf("%s: CPU per request %s, was %s", ep.ID, formatSeconds(ep.CPUCores/ep.RequestRate), formatSeconds(base.CPUCores/base.RequestRate))
			d.Endpoints[i].Reason = ReasonRelievedCost
		}
	}
	var evidence []string
	for i := range eps {
		if jumped[i] != "" {
			evidence = append(evidence, jumped[i])
		}
	}
	if len(evidence) == 0 {
		return d, nil
	}
	overloaded := false
	for i := range eps {
		overloaded = overloaded || (jumped[i] != "" && costRatio[i] == 0)
	}
	if !overloaded {
		// A pod that got slower but has no queue yet: its weight follows its capacity down, so
		// that it keeps the load it was planned for; the others keep theirs.
		for i, ep := range eps {
			if costRatio[i] > 0 {
				w := int(math.Round(math.Max(float64(s.MinWeight), float64(ep.CurrentWeight)/costRatio[i])))
				if w < ep.CurrentWeight {
					d.Endpoints[i].Weight = w
					d.Changed = true
				}
			}
		}
		if d.Changed {
			d.Reason = "relieved at once, between cycles (" + strings.Join(evidence, "; ") + ")"
		}
		return d, nil
	}
	// Toward the safe split, for every pod at once: the capacity algorithm's, on each pod's
	// newest capacity, which needs no latency model and loads no pod beyond the others. Cutting
	// the jumped pods alone would hand their load to the weights in force, which may lean on
	// the very pods that take it worst (a fast pod's peers, when one of them died).
	capacity := make([]float64, len(eps))
	var weightSum float64
	for i, ep := range eps {
		if !ok[i] {
			continue
		}
		// A jumped pod's capacity is its newest; the others' is what the last cycle measured
		// over its whole window, steadier than a short window's (a pod the plan gives a trickle
		// serves a few dozen requests in one).
		from := in.Baseline[ep.ID]
		if jumped[i] != "" {
			from = ep
		}
		capacity[i] = limit(from) * from.RequestRate / from.CPUCores
		weightSum += float64(ep.CurrentWeight)
	}
	safe := targetShares(capacity, ok, DefaultSettings(AlgorithmCapacity).Capacity.PlanningLoadFactor*total)
	next := make([]float64, len(eps))
	hi := 0.0
	for i, ep := range eps {
		cur := float64(ep.CurrentWeight)
		next[i] = cur
		if ok[i] {
			next[i] = safe[i] * weightSum
			if jumped[i] != "" {
				// At least halved, at most cut to a sixteenth, on a short window's estimate.
				next[i] = clamp(next[i], cur*reliefFactorMin, cur*reliefFactorMax)
			} else if slowing(ep, in.Baseline[ep.ID]) || ep.Relieved || in.Answered[ep.ID] {
				// Slowing too, short of a jump (the baseline's capacity overstates it), or
				// relieved a moment ago (restoring it is the cycles' to do, slowly): its weight
				// does not rise.
				next[i] = math.Min(next[i], cur)
			} else {
				// A pod the plan gave a trickle has a capacity measured on a few requests: it
				// takes on at most a cycle's step, however much the split says it could carry
				// (a slow pod at weight 1 was moved to 123 and queued for seconds).
				next[i] = math.Min(next[i], cur*s.Capacity.MaxStepRatio)
			}
		}
		hi = math.Max(hi, next[i])
	}
	scale := 1.0
	if hi > float64(s.MaxWeight) {
		scale = float64(s.MaxWeight) / hi
	}
	floor := math.Max(float64(s.MinWeight), hi*scale/s.Capacity.MaxWeightRatio)
	for i, ep := range eps {
		w := int(math.Round(math.Max(floor, next[i]*scale)))
		if !ok[i] || w == ep.CurrentWeight {
			continue
		}
		d.Endpoints[i].Weight = w
		if jumped[i] == "" {
			d.Endpoints[i].Reason = ReasonReliefSafeSplit
		}
		d.Changed = true
	}
	// A relief that leaves every jumped pod's share where it was (the weight floor, the step
	// bound) relieves nothing: writing it would move the others on every check.
	after := shares(d.Endpoints, ok, func(r Result) int { return r.Weight })
	relieves := false
	for i := range eps {
		relieves = relieves || (jumped[i] != "" && after[i] < shareNow[i]*(1-reliefWeightMoved))
	}
	if !relieves {
		for i, ep := range eps {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: ep.CurrentWeight}
		}
		d.Changed = false
		d.Reason = "a relief would not lower the share of any pod that jumped (" + strings.Join(evidence, "; ") + ")"
		return d, nil
	}
	d.Reason = "relieved at once, between cycles, toward the capacity split (" + strings.Join(evidence, "; ") + ")"
	return d, nil
}

// weightMoves is, for each endpoint ok marks, how its weight moved since its baseline (now over
// then) divided by the median endpoint's move: 1 for a pod that moved as the fleet did, +Inf for
// one raised from 0, 1 for one without a baseline weight now or then.
func weightMoves(eps []Endpoint, ok []bool, baseline map[string]Endpoint) []float64 {
	out := make([]float64, len(eps))
	var finiteMoves []float64
	for i, ep := range eps {
		out[i] = 1
		if !ok[i] {
			continue
		}
		switch base := baseline[ep.ID].CurrentWeight; {
		case base > 0:
			out[i] = float64(ep.CurrentWeight) / float64(base)
			finiteMoves = append(finiteMoves, out[i])
		case ep.CurrentWeight > 0:
			out[i] = math.Inf(1)
		}
	}
	if len(finiteMoves) == 0 {
		return out
	}
	mid := median(finiteMoves)
	for i := range out {
		if ok[i] && !math.IsInf(out[i], 1) && mid > 0 {
			out[i] /= mid
		}
	}
	return out
}

// shares is each endpoint's share of the weights of the endpoints ok marks (0 for the others, and
// for all when their weights sum to 0).
func shares[T any](items []T, ok []bool, weight func(T) int) []float64 {
	out := make([]float64, len(items))
	sum := 0
	for i, it := range items {
		if ok[i] {
			sum += weight(it)
		}
	}
	if sum <= 0 {
		return out
	}
	for i, it := range items {
		if ok[i] {
			out[i] = float64(weight(it)) / float64(sum)
		}
	}
	return out
}

// slowing reports whether a pod's CPU per request rose since its baseline by a cost jump, or its
// p99 by half a latency jump: short of a jump, and the short window may be noisy, but a pod that
// looks slower takes on no load in a relief.
func slowing(ep, base Endpoint) bool {
	costRose := base.RequestRate > 0 && base.CPUCores > 0 && ep.RequestRate > 0 &&
		ep.CPUCores/ep.RequestRate >= (1+reliefCostJump)*base.CPUCores/base.RequestRate
	p99Rose := base.LatencyP99Seconds > 0 && ep.LatencyP99Seconds >= (1+reliefLatencyJump)/2*base.LatencyP99Seconds
	return costRose || p99Rose
}
