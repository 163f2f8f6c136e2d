package weights

import (
	"math"
	"sort"
)

// podGroup is a set of endpoints alike enough to share one latency model: the same CPU limit and
// node size, and CPU costs per request within groupCostSpread of the group's cheapest.
type podGroup struct {
	members  []int
	cost     float64 // CPU-seconds per request, rate-weighted over the members
	limit    float64 // cores
	cores    float64
	capacity float64 // requests per second one member serves at its CPU limit
	model    *podModel
	// loadScale calibrates the model's load axis: the model is read at loadScale × the load
	// the members would see, as fitted to their histogram.
	loadScale float64
}

// shareTolerance is the relative excess of the predicted quantile over the optimum's within which
// the current split is good enough.
const shareTolerance = 0.02

// groupCostSpread is the relative cost difference within which endpoints share a group.
const groupCostSpread = 0.2

// minPodShareOfMean caps a pod's floor as a fraction of the mean pod's planned rate.
const minPodShareOfMean = 0.02

// maxGroups bounds the number of groups (and models) per Service.
const maxGroups = 8

// tailShares returns the groups it planned with and each endpoint's target share of the traffic: the split of the planning load
// over the groups that minimises the predicted fleet latency quantile, spread evenly over each
// group's members. ok marks the endpoints with usable metrics; others get no share. It returns
// false when no split keeps the quantile finite (the fleet is near or beyond its capacity), or
// when the surge bound leaves no choice (see below); the caller then takes the capacity split.
//
// predict gives the predicted quantile of any split over the endpoints (a share per endpoint,
// adding up to 1 over those marked ok), with the same models: Compute weighs a write's promised
// gain with it.
func tailShares(in Input, ok []bool, limit func(Endpoint) float64, totalRate float64, s Settings) (groups []*podGroup, shares []float64, predict func([]float64) float64, found bool) {
	p := s.Tail
	p.SurgeFactor = surgeFactor(in, s)
	groups = groupEndpoints(in.Endpoints, ok, limit)
	if len(groups) == 0 || totalRate <= 0 {
		return groups, nil, nil, false
	}
	load := planningLoad(in, totalRate, s)
	var fleetCapacity float64
	for _, g := range groups {
		fleetCapacity += g.capacity * float64(len(g.members))
	}
	// From a planning load of 1/SurgeFactor of the fleet's capacity, a surge of SurgeFactor
	// times the load would overload every pod whatever the split, and the surge bound would
	// leave the model one split: every group at its capacity share. The engine then takes the
	// capacity algorithm's square-root split at the planning load instead (the caller's
	// fallback), which gives the fast pods somewhat more: with the lag on it measured better
	// than the proportional split on every scenario of the suite it changed (seed-fib 34.1
	// against 36.1 ms, noisy-neighbour 188.5 against 209.5, bursty 123.8 against 128.5,
	// slow-outlier 49.9 against 55.1, step-up-three-classes 164.5 against 176.5).
	if p.SurgeFactor > 1 && p.SurgeFactor*load >= fleetCapacity {
		return groups, nil, nil, false
	}
	// The utilization cap gives way when the whole fleet is planned above it.
	maxUtilization := math.Max(p.MaxUtilization, math.Min(maxModelUtilization, load/fleetCapacity))
	// Bounds per group, as shares of the planning load: a floor that keeps every pod measurable,
	// and a ceiling from the utilization cap and the distance allowed from the capacity split.
	lo := make([]float64, len(groups))
	hi := make([]float64, len(groups))
	var floors float64
	for gi, g := range groups {
		n := float64(len(g.members))
		// A pod's floor is MinPodRate, but never more than minPodShareOfMean of the mean pod's
		// rate: in a quiet Service a slow pod's trickle would otherwise be a large part of the load.
		lo[gi] = math.Min(p.MinPodRate, minPodShareOfMean*load/float64(countTrue(ok))) * n / load
		floors += lo[gi]
		ceiling := utilizationCeiling(in.Endpoints, g, limit, maxUtilization, load/totalRate)
		if in.Replan {
			// The survivors were measured carrying their old share; what they will carry now
			// was never measured, so the model gets no room beyond the utilization cap.
			ceiling = maxUtilization / math.Max(1, g.loadScale)
		}
		byUtilization := ceiling * g.capacity * n / load
		byCapacity := shareRatioCeiling(p, load/fleetCapacity) * g.capacity * n / fleetCapacity
		hi[gi] = math.Max(lo[gi], math.Min(byUtilization, byCapacity))
	}
	var ceilings float64
	for gi := range groups {
		ceilings += hi[gi]
	}
	if floors >= 1 || ceilings < 1 {
		return groups, nil, nil, false
	}
	// The search starts from the capacity split's quantile: a split within the bounds whose
	// quantile the optimum's cannot exceed.
	capacitySplit := make([]float64, len(groups))
	for gi, g := range groups {
		capacitySplit[gi] = g.capacity * float64(len(g.members)) / fleetCapacity
	}
	budget := 1 - p.Quantile // the mass allowed above the quantile
	search := newSplitSearch(groups, lo, hi, load, budget)
	split, tHi, found := search.search(capacitySplit)
	// The predicted quantile is flat near its minimum, so noise moves the optimum about. Move
	// from the split the pods get now only as far toward the optimum as it takes to come within
	// shareTolerance of its predicted quantile: a split that is nearly as good stays put.
	observed := make([]float64, len(groups))
	var observedTotal float64
	for gi, g := range groups {
		for _, i := range g.members {
			observed[gi] += in.Endpoints[i].RequestRate
		}
		observedTotal += observed[gi]
	}
	quantileOf := func(x []float64) float64 { return search.quantileOf(x, tHi*4) }
	optimum := split
	current := make([]float64, len(groups))
	for gi := range groups {
		current[gi] = observed[gi] / observedTotal
	}
	predict = func(memberShares []float64) float64 {
		return memberQuantile(memberShares, groups, load, budget, tHi*4)
	}
	// A re-plan after endpoints left goes to the optimum: the observed split is the old
	// membership's, and holding near it is the hysteresis the re-plan exists to skip.
	for _, theta := range []float64{0, 0.2, 0.4, 0.6, 0.8} {
		if in.Replan {
			break
		}
		x := make([]float64, len(groups))
		withinBounds := true
		for gi := range groups {
			x[gi] = observed[gi]/observedTotal + theta*(optimum[gi]-observed[gi]/observedTotal)
			withinBounds = withinBounds && x[gi] <= hi[gi]
		}
		// A split the pods get now that loads a group beyond its ceiling is never good enough,
		// however flat the prediction around it.
		if withinBounds && quantileOf(x) <= tHi*(1+shareTolerance) {
			split = x
			break
		}
	}
	// Within a group the share follows each member's own capacity: members differ by up to
	// groupCostSpread in cost, and the slower ones should not get as much as the faster.
	shares = make([]float64, len(in.Endpoints))
	for gi, g := range groups {
		var total float64
		for _, i := range g.members {
			total += memberCapacity(in.Endpoints[i], limit)
		}
		for _, i := range g.members {
			shares[i] = split[gi] * memberCapacity(in.Endpoints[i], limit) / total
		}
	}
	return groups, shares, predict, true
}

// surgeFactor is the surge bound in force: the input's (learned from the Service's history, or the
// user's), else the settings'.
func surgeFactor(in Input, s Settings) float64 {
	if in.SurgeFactor >= 1 {
		return in.SurgeFactor
	}
	return s.Tail.SurgeFactor
}

// shareRatioCeiling is the most a group's share may exceed its share of the fleet's capacity,
// for a fleet planned at utilization u: MaxShareRatio, or less so that a surge of the load to
// SurgeFactor times the planning load (up to the whole fleet's capacity) would load no group
// beyond its limit. The weights stay as they are until the controller sees the surge, a
// window and the TSDB's lag later, and Envoy's least-request cannot shed a fast pod's excess
// across weights hundreds of times apart: a split that a surge overloads queues for that long.
func shareRatioCeiling(p TailParams, u float64) float64 {
	if p.SurgeFactor <= 1 || !(u > 0) {
		return p.MaxShareRatio
	}
	return math.Max(1, math.Min(p.MaxShareRatio, 1/math.Min(1, p.SurgeFactor*u)))
}

// explorationStep is how far beyond the utilization it has been measured at a group may be
// planned when its calibrated model promises more than the uncalibrated one.
const explorationStep = 0.2

// utilizationCeiling is the highest fraction of its CPU limit a group may be planned at, at the
// planning load: maxUtilization, or less when the group's calibrated model is more pessimistic
// than the uncalibrated one (a load scale above 1). A load scale below 1 says the group queues
// less than the model does at the same load (Envoy's least-request avoids busy pods), but it was
// fitted at the load the group carries now: the group may then be planned beyond maxUtilization
// only as far as explorationStep beyond that load (scaled to the planning load), never beyond
// what the calibrated model tabulates, and never beyond maxModelUtilization of its real limit. A
// fit at 60% says nothing about 95%, and a plan beyond the real limit is a queue without end.
func utilizationCeiling(endpoints []Endpoint, g *podGroup, limit func(Endpoint) float64, maxUtilization, planningScale float64) float64 {
	if g.loadScale >= 1 {
		return maxUtilization / g.loadScale
	}
	var cpu, lim float64
	for _, i := range g.members {
		cpu += endpoints[i].CPUCores
		lim += limit(endpoints[i])
	}
	measured := cpu / lim * planningScale
	return math.Max(maxUtilization, math.Min(math.Min(measured+explorationStep, maxUtilization/g.loadScale), maxModelUtilization))
}

// memberQuantile is the predicted quantile of a split given member by member: an uneven split
// within a group (one member's weight far from its peers') loads some members more than the
// group's even spread would, and shows here as a higher quantile. The quantile is bisected below
// tMax.
func memberQuantile(memberShares []float64, groups []*podGroup, load, budget, tMax float64) float64 {
	massAbove := func(t float64) float64 {
		var mass float64
		for _, g := range groups {
			at := timePosition(t / g.cost)
			for _, m := range g.members {
				if x := memberShares[m]; x > 0 {
					mass += x * g.model.tailAt(at, g.loadScale*x*load/g.capacity)
				}
			}
		}
		return mass
	}
	if massAbove(tMax) > budget {
		return math.Inf(1) // beyond what the models tell apart: no gain can be promised
	}
	return lowestThreshold(tMax, thresholdTolerance, budget, massAbove)
}

// memberCapacity is an endpoint's requests per second at its CPU limit.
func memberCapacity(ep Endpoint, limit func(Endpoint) float64) float64 {
	return limit(ep) * ep.RequestRate / ep.CPUCores
}

// planningLoad is the request rate the tail algorithm splits: the larger of the current and the
// recent peak rate, times the burst margin.
func planningLoad(in Input, totalRate float64, s Settings) float64 {
	projected := 0.0
	if finite(in.ProjectedRequestRate) {
		projected = in.ProjectedRequestRate
	}
	if in.RecentPeakRequestRate <= 0 {
		// Nothing is known about how the load varies: plan with the margin the capacity
		// algorithm keeps for bursts between two cycles.
		return math.Max(totalRate, projected) * firstPlanMargin(s.Tail, in.LoadHistory)
	}
	return math.Max(math.Max(totalRate, in.RecentPeakRequestRate), projected) * PlanningMargin(s.Tail, in.LoadHistory)
}

// unknownPeakMargin is the planning margin over the current rate when the recent peak is unknown.
const unknownPeakMargin = 1.5

// groupEndpoints groups the usable endpoints and gives each group its calibrated model.
func groupEndpoints(endpoints []Endpoint, ok []bool, limit func(Endpoint) float64) []*podGroup {
	type member struct {
		i           int
		cost, limit float64
		cores       float64
	}
	var ms []member
	for i, ep := range endpoints {
		if !ok[i] {
			continue
		}
		l := limit(ep)
		cores := ep.NodeCPUCores
		if !(cores > 0) || !finite(cores) {
			cores = math.Max(2, 4*l)
		}
		ms = append(ms, member{i: i, cost: ep.CPUCores / ep.RequestRate, limit: math.Min(l, cores), cores: cores})
	}
	sort.SliceStable(ms, func(a, b int) bool {
		if ms[a].limit != ms[b].limit {
			return ms[a].limit < ms[b].limit
		}
		if ms[a].cores != ms[b].cores {
			return ms[a].cores < ms[b].cores
		}
		return ms[a].cost < ms[b].cost
	})
	var groups []*podGroup
	// Widen the cost spread until the groups are few: each needs a model, and a fleet of many
	// shapes gains little from telling them all apart.
	for spread := groupCostSpread; ; spread *= 1.5 {
		groups = groups[:0]
		var first member
		for k, m := range ms {
			if k == 0 || m.limit != first.limit || m.cores != first.cores || m.cost > first.cost*(1+spread) {
				groups = append(groups, &podGroup{limit: m.limit, cores: m.cores})
				first = m
			}
			g := groups[len(groups)-1]
			g.members = append(g.members, m.i)
		}
		if len(groups) <= maxGroups || spread > 100 {
			break
		}
	}
	for _, g := range groups {
		var cpu, rate float64
		for _, i := range g.members {
			cpu += endpoints[i].CPUCores
			rate += endpoints[i].RequestRate
		}
		g.cost = cpu / rate
		g.capacity = g.limit / g.cost
		g.calibrate(endpoints, rate/float64(len(g.members)))
	}
	return groups
}

// calibrationScales are the load-axis scales tried when fitting a group's model to its histogram.
var calibrationScales = []float64{0.5, 0.65, 0.8, 1, 1.25, 1.6}

// calibrate picks the request-size variability and load-axis scale whose predicted histogram
// best fits the members' pooled histogram (multinomial likelihood over its buckets). Without a
// histogram the defaults stand: variability defaultModelCV and scale 1.
func (g *podGroup) calibrate(endpoints []Endpoint, perPodRate float64) {
	g.loadScale = 1
	g.model = modelFor(newModelKey(g.cores, g.limit, g.cost, defaultModelCV))
	bounds, counts := pooledHistogram(endpoints, g.members)
	var total float64
	for _, c := range counts {
		total += c
	}
	if total < 50 {
		return
	}
	u := perPodRate / g.capacity
	best := math.Inf(-1)
	for _, cv := range modelCVs {
		m := modelFor(newModelKey(g.cores, g.limit, g.cost, cv))
		for _, scale := range calibrationScales {
			if u*scale > maxModelUtilization {
				continue
			}
			var ll float64
			prevTail := 1.0
			for b, ub := range bounds {
				tail := 0.0
				if !math.IsInf(ub, 1) {
					tail = m.tail(ub/g.cost, u*scale)
				}
				prob := math.Max(prevTail-tail, 1e-6)
				ll += counts[b] * math.Log(prob)
				prevTail = tail
			}
			// Prefer the uncalibrated axis on ties: a scale must earn its place.
			if scale != 1 {
				ll -= 2
			}
			if ll > best {
				best, g.model, g.loadScale = ll, m, scale
			}
		}
	}
}

// pooledHistogram adds the members' cumulative histograms and returns per-bucket (not
// cumulative) counts by upper bound, ending with +Inf. Members whose bounds differ from the first
// member's are left out.
func pooledHistogram(endpoints []Endpoint, members []int) ([]float64, []float64) {
	var bounds, cum []float64
	for _, i := range members {
		bs := endpoints[i].LatencyBuckets
		if len(bs) == 0 {
			continue
		}
		if bounds == nil {
			for _, b := range bs {
				bounds = append(bounds, b.UpperBoundSeconds)
			}
			cum = make([]float64, len(bs))
		}
		if len(bs) != len(bounds) {
			continue
		}
		same := true
		for k, b := range bs {
			if b.UpperBoundSeconds != bounds[k] || !finite(b.Count) || b.Count < 0 {
				same = false
				break
			}
		}
		if !same {
			continue
		}
		for k, b := range bs {
			cum[k] += b.Count
		}
	}
	if bounds == nil {
		return nil, nil
	}
	if !math.IsInf(bounds[len(bounds)-1], 1) {
		bounds = append(bounds, math.Inf(1))
		cum = append(cum, cum[len(cum)-1])
	}
	counts := make([]float64, len(cum))
	prev := 0.0
	for k, c := range cum {
		counts[k] = math.Max(0, c-prev)
		prev = math.Max(prev, c)
	}
	return bounds, counts
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
