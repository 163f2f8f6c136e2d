package weights

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// Reasons attached to endpoint results. They are short enough for a status column.
const (
	ReasonNoMetrics        = "no metrics: median weight"
	ReasonInvalidMetrics   = "invalid metrics (NaN, Inf or negative): median weight"
	ReasonTooLittleTraffic = "too little traffic to estimate cost: median weight"
	ReasonQuietKept        = "too little traffic to re-estimate: weight kept"
	ReasonOverloaded       = "overloaded (p99 far above its peers' for its cost): weight halved"
	ReasonNewEndpoint      = "new endpoint: median weight"
	ReasonTooFewWithData   = "fewer than two endpoints with usable metrics: equal weights"
	ReasonInsideDeadBand   = "change inside dead band: weight kept"
	ReasonClampedMax       = "clamped at max"
	ReasonClampedMin       = "clamped at min"
	ReasonStepLimited      = "step limited"
	ReasonCapacity         = "share from estimated capacity"
	ReasonTail             = "share that minimises the predicted p99"
	ReasonNoMetricsKept    = "no metrics: weight kept"
	ReasonUtilization      = "corrected toward target share"
	ReasonCPUDistance      = "moved against CPU distance from mean"
	ReasonCPUNearMean      = "CPU within dead band of mean"
	ReasonWindowUnsettled  = "weights changed during the window: kept until a clean window"
	ReasonGainTooSmall     = "predicted p99 gain too small to be worth a write: weights kept"
	ReasonDistrusted       = "share between the predicted-p99 optimum and the capacity split: the model was overruled by measurement"
)

// writeGainTolerance is the relative p99 gain, as predicted by the tail algorithm's models, that a
// tail write must promise. Near its optimum the predicted quantile is flat and the optimum's
// location moves with every window's noise (seed-fib's fib26 pods were sent between 0.1% and 12%
// of the traffic from one window to the next), so without it the weights follow that noise: each
// write costs an istiod push and buys nothing. 2% is the largest tolerance that left the p99 of
// every bench scenario unchanged or better; 3% already let mixed-group drift 1 ms.
const writeGainTolerance = 0.02

// settledCoverage is the window coverage from which observed shares reflect the current weights.
const settledCoverage = 0.9

// overloadMinCoverage is the window coverage from which an overloaded endpoint's weight is cut
// before a settled window: most of the window shows the weights now in force.
const overloadMinCoverage = 0.5

// settledLoadFraction is the fraction of the recent peak request rate from which the tail
// algorithm treats the load as settled.
const settledLoadFraction = 0.8

// Compute decides the next weights for one Service's endpoints.
//
// It never returns a weight below max(1, MinWeight) or above MaxWeight, never lets NaN or Inf reach
// a weight, and is deterministic: the same input gives the same Decision.
func Compute(in Input, s Settings) (Decision, error) {
	endpoints := in.Endpoints
	if err := s.Validate(); err != nil {
		return Decision{}, fmt.Errorf("invalid weight settings: %w", err)
	}
	seen := make(map[string]struct{}, len(endpoints))
	for _, ep := range endpoints {
		if _, dup := seen[ep.ID]; dup {
			return Decision{}, fmt.Errorf("endpoint %q appears twice; each endpoint must be listed once", ep.ID)
		}
		seen[ep.ID] = struct{}{}
	}
	if len(endpoints) == 0 {
		return Decision{Reason: "no endpoints"}, nil
	}
	var d Decision
	switch s.Algorithm {
	case AlgorithmCPUDistance:
		d = computeCPUDistance(endpoints, s)
	case AlgorithmCPUShare:
		d = computeCPUShare(endpoints, s)
	default:
		coverage := in.WindowCoverage
		if coverage <= 0 || coverage > 1 || math.IsNaN(coverage) {
			coverage = 1
		}
		d = computeCapacity(in, coverage, s)
	}
	return finish(endpoints, d, s), nil
}

// finish enforces the invariants every algorithm shares and decides whether a write is needed.
func finish(endpoints []Endpoint, d Decision, s Settings) Decision {
	changed := false
	for i := range d.Endpoints {
		w := d.Endpoints[i].Weight
		if w < s.MinWeight {
			w = s.MinWeight
		}
		if w > s.MaxWeight {
			w = s.MaxWeight
		}
		d.Endpoints[i].Weight = w
		if w != endpoints[i].CurrentWeight {
			changed = true
		}
	}
	d.Changed = changed
	if !changed && d.Reason == "" {
		d.Reason = "weights unchanged"
	}
	return d
}

// usable reports whether an endpoint's metrics can be trusted, and why not.
func usable(ep Endpoint, minRate float64) (bool, string) {
	if !ep.HasMetrics {
		return false, ReasonNoMetrics
	}
	for _, v := range []float64{ep.CPUCores, ep.RequestRate, ep.CPULimitCores} {
		if !finite(v) || v < 0 {
			return false, ReasonInvalidMetrics
		}
	}
	if ep.CPUCores == 0 || ep.RequestRate < minRate || ep.RequestRate == 0 {
		return false, ReasonTooLittleTraffic
	}
	return true, ""
}

func equalWeights(endpoints []Endpoint, s Settings, reason string) Decision {
	d := Decision{Endpoints: make([]Result, len(endpoints)), Reason: reason}
	w := s.defaultWeight()
	for i, ep := range endpoints {
		d.Endpoints[i] = Result{ID: ep.ID, Weight: w, Reason: reason}
	}
	return d
}

// computeCapacity implements AlgorithmCapacity.
//
// Each endpoint's capacity is its CPU limit divided by its CPU cost per request (cpu/rps). The
// load is split into target traffic shares by the square-root rule (targetShares). The first
// adaptive step jumps straight to weights proportional to those shares. Envoy does not turn
// weights into traffic shares one-to-one (weighted LEAST_REQUEST divides each weight by
// active+1), so later steps correct each weight by how far its observed share sits from its
// target: an integral controller whose state is the applied weight itself, which therefore
// survives operator restarts. Feedback only runs on windows observed entirely under the current
// weights; a mixed window would make it correct twice.
//
// AlgorithmTail runs the same machinery with other target shares: those that minimise the
// predicted fleet p99 (tailShares), falling back to the square-root rule when the model finds no
// finite split. It also lets an endpoint whose metrics are missing keep its weight.
func computeCapacity(in Input, coverage float64, s Settings) Decision {
	endpoints, windowSeconds := in.Endpoints, in.WindowSeconds
	p := s.Capacity
	n := len(endpoints)
	ok := make([]bool, n)
	reasons := make([]string, n)
	var limits []float64
	valid := 0
	for i, ep := range endpoints {
		ok[i], reasons[i] = usable(ep, p.MinRequestRate)
		if ok[i] {
			valid++
			if ep.CPULimitCores > 0 {
				limits = append(limits, ep.CPULimitCores)
			}
		}
	}
	if valid < 2 {
		return equalWeights(endpoints, s, ReasonTooFewWithData)
	}
	// Pods without a CPU limit can use about what their peers may: the fleet's median limit.
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
	capacity := make([]float64, n)
	var totalRate float64
	for i, ep := range endpoints {
		if ok[i] {
			capacity[i] = limit(ep) * ep.RequestRate / ep.CPUCores
			totalRate += ep.RequestRate
		}
	}
	share := targetShares(capacity, ok, totalRate*p.PlanningLoadFactor)
	capacityShare := share
	shareReason := ReasonCapacity
	unsettledLoad := false
	var predictQuantile func([]float64) float64
	firstStep := !adapted(endpoints, ok)
	// The tail algorithm's check of its model against the window (modelcheck.go): the distrust
	// to carry on, and the evidence when the measurement overrules the model now.
	distrust, overruled, reset := 0.0, "", false
	if s.Algorithm == AlgorithmTail {
		// The split a distrusted model gives way to: the capacity algorithm's, planned for at
		// least its own margin over the window's rate (tail plans with none) and for the load
		// the tail algorithm plans for (the recent peak and a rising rate's projection).
		capacityShare = targetShares(capacity, ok, math.Max(DefaultSettings(AlgorithmCapacity).Capacity.PlanningLoadFactor*totalRate, planningLoad(in, totalRate, s)))
		groups, ts, predict, found := tailShares(in, ok, limit, totalRate, s)
		if found {
			share, shareReason = ts, ReasonTail
			predictQuantile = predict
		} else {
			// The square-root split for the load the surge bound must carry: at or beyond the
			// fleet's capacity it is the split proportional to capacity, which loads every pod
			// alike whatever the load does.
			share = targetShares(capacity, ok, surgeFactor(in, s)*planningLoad(in, totalRate, s))
		}
		// Shares observed while the load swings mix what Envoy does at two loads; feedback on
		// them would tune the weights for a load that is already gone.
		unsettledLoad = totalRate < settledLoadFraction*in.RecentPeakRequestRate
		distrust = clamp(in.ModelDistrust, 0, 1)
		if !firstStep && !in.Replan {
			verdict := checkModel(endpoints, groups, limit)
			var overrule bool
			distrust, overrule, reset = judgeModel(distrust, verdict, coverage >= settledCoverage && !unsettledLoad, coverage)
			if overrule {
				overruled = verdict.evidence
			}
		}
		if distrust > 0 {
			share = blendTowardCapacity(share, capacityShare, ok, distrust)
			shareReason = ReasonDistrusted
		}
	}

	overloaded := overloadedEndpoints(endpoints, ok, p.OverloadLatencyRatio)
	for i, ep := range endpoints {
		// A relief between cycles answered this pod's overload with fresher data; the window
		// still shows the queue it had before.
		overloaded[i] = overloaded[i] && !ep.OverloadAnswered
	}
	if !firstStep && !in.Replan && overruled == "" && (coverage < settledCoverage || unsettledLoad) && !hasNew(endpoints, ok) {
		d := Decision{Endpoints: make([]Result, n), Reason: ReasonWindowUnsettled, ModelDistrust: distrust}
		for i, ep := range endpoints {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: ep.CurrentWeight, Reason: ReasonWindowUnsettled}
			// The cut waits for no clean window, but for one mostly under the current weights:
			// a window that predates the last write (the TSDB answers in the past) shows the
			// queue the write may already have relieved, and cutting again on it would halve a
			// weight once per cycle for one overload.
			if overloaded[i] && coverage >= overloadMinCoverage {
				d.Endpoints[i] = Result{ID: ep.ID, Weight: cutOverloaded(ep.CurrentWeight, s), Reason: ReasonOverloaded}
				d.Reason = "an overloaded endpoint's weight halved; the others kept until a clean window"
			}
		}
		return d
	}
	// The gain smooths the correction against noise from cycle to cycle; a re-plan answers one
	// known change of membership and takes the whole correction at once.
	gain := p.Gain
	if in.Replan || overruled != "" || rising(in, totalRate) {
		gain = 1
	}
	logTarget := make([]float64, n)
	have := make([]bool, n)
	// A weighted endpoint that is too quiet to measure keeps its weight: it is usually quiet
	// because its weight is low, and handing it the median would send it traffic, make it
	// measurable, and take the traffic away again the next cycle.
	kept := make([]bool, n)
	for i, ep := range endpoints {
		if !ok[i] && reasons[i] == ReasonTooLittleTraffic && ep.CurrentWeight > 0 {
			kept[i] = true
			reasons[i] = ReasonQuietKept
		}
		// The tail split's weights span a wide range: the median would be a large jump for a
		// pod whose metrics are only briefly missing (a scrape gap, a new pod's first minute).
		if !ok[i] && reasons[i] == ReasonNoMetrics && ep.CurrentWeight > 0 && s.Algorithm == AlgorithmTail {
			kept[i] = true
			reasons[i] = ReasonNoMetricsKept
		}
	}
	// A reset plans from the shares alone, as a first step does: the feedback's corrections were
	// made toward the split the measurement has just overruled.
	fromShares := firstStep || reset
	for i, ep := range endpoints {
		if !ok[i] {
			continue
		}
		switch {
		case fromShares:
			logTarget[i] = math.Log(share[i])
			reasons[i] = shareReason
		case ep.CurrentWeight > 0:
			observed := ep.RequestRate / totalRate
			logTarget[i] = math.Log(float64(ep.CurrentWeight)) + gain*beyondNoise(math.Log(share[i]/observed), ep.RequestRate*windowSeconds)
			reasons[i] = ReasonUtilization
		default:
			reasons[i] = ReasonNewEndpoint
			continue
		}
		have[i] = true
	}
	// Only ratios matter to Envoy; scaleShift picks the common scale. Endpoints that the ratio
	// bound will lift to the floor do not count toward the median.
	maxLog := math.Inf(-1)
	for i := range endpoints {
		if have[i] {
			maxLog = math.Max(maxLog, logTarget[i])
		}
	}
	var logs []float64
	for i := range endpoints {
		if have[i] && logTarget[i] >= maxLog-math.Log(p.MaxWeightRatio) {
			logs = append(logs, logTarget[i])
		}
	}
	shift := scaleShift(endpoints, have, logTarget, logs, maxLog, fromShares, s)
	target := make([]float64, n)
	hi := 0.0
	for i := range endpoints {
		if have[i] {
			target[i] = math.Exp(logTarget[i] + shift)
			if !fromShares {
				step := p.MaxStepRatio
				if in.Replan {
					// A known loss of capacity: the survivors' weights must reach the new split
					// now, not over several cycles (a pod given a trickle needs more than one
					// step to take its share of a departed fast pod's load).
					step *= p.MaxStepRatio
				}
				target[i] = boundStep(target[i], endpoints[i].CurrentWeight, step, &reasons[i])
				if endpoints[i].Relieved {
					// Cut fast, restore slowly: a relieved pod earns its share back a step per cycle.
					target[i] = math.Min(target[i], float64(endpoints[i].CurrentWeight)*math.Min(p.MaxStepRatio, reliefRestoreStep))
				}
				if cut := float64(endpoints[i].CurrentWeight) / 2; overloaded[i] && target[i] > cut {
					target[i], reasons[i] = cut, ReasonOverloaded
				}
			}
			if target[i] > float64(s.MaxWeight) {
				target[i] = float64(s.MaxWeight)
				reasons[i] = ReasonClampedMax
			}
			hi = math.Max(hi, target[i])
		}
	}
	lo := math.Max(float64(s.MinWeight), hi/p.MaxWeightRatio)
	for i, ep := range endpoints {
		if kept[i] {
			have[i], target[i] = true, float64(ep.CurrentWeight)
			if target[i] > hi { // the ratio bound holds for kept weights too
				target[i] = math.Max(hi, lo)
			}
		}
		if have[i] && target[i] < lo {
			target[i] = lo
			reasons[i] = ReasonClampedMin
		}
	}
	d := Decision{Endpoints: make([]Result, n)}
	var decided []float64
	for i, ep := range endpoints {
		if have[i] {
			w := int(math.Round(target[i]))
			d.Endpoints[i] = Result{ID: ep.ID, Weight: w, Reason: reasons[i]}
			decided = append(decided, float64(w))
		}
	}
	mid := int(math.Round(median(decided)))
	for i, ep := range endpoints {
		if !have[i] {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: mid, Reason: reasons[i]}
		}
	}
	if firstStep {
		d.Reason = "weights set from estimated capacity"
	} else {
		d.Reason = "weights corrected toward the target traffic shares"
	}
	d.ModelDistrust = distrust
	if overruled != "" {
		// The measurement overrules the model: the correction toward the capacity split goes
		// out now, whatever the dead band and the gain gate would hold back.
		d.ModelOverruled = overruled
		d.Reason = "model overruled by measurement (" + overruled + "): weights moved toward the capacity split"
		return d
	}
	applyDeadBand(endpoints, &d, p.DeadBand)
	// A re-plan rides on the mirror's write that drops the departed endpoints, so it costs no
	// push of its own: the gate, which saves pushes, does not hold it back (under the seed-5 run
	// of fast-pod-dies it did, and the survivors stayed overloaded until the next cycle).
	if predictQuantile != nil && distrust == 0 && !firstStep && !in.Replan && !slices.Contains(overloaded, true) && gainTooSmall(endpoints, ok, totalRate, d, predictQuantile) {
		for i, ep := range endpoints {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: ep.CurrentWeight, Reason: ReasonGainTooSmall}
		}
		d.Reason = ReasonGainTooSmall
	}
	return d
}

// gainTooSmall reports whether the decided weights change something yet promise too little to be
// worth a write: the shares the pods would get under them (today's observed shares, each scaled
// by its weight's change, as Envoy's shares follow the weights) must have a predicted quantile at
// least writeGainTolerance below today's. A decision that gives an endpoint its first weight, or
// that moves a pod without usable metrics, is never too small; nor is one made while today's
// split is beyond what the models can rank (no finite predicted quantile).
func gainTooSmall(endpoints []Endpoint, ok []bool, totalRate float64, d Decision, predict func([]float64) float64) bool {
	now := make([]float64, len(endpoints))
	next := make([]float64, len(endpoints))
	var nextTotal float64
	changed := false
	for i, ep := range endpoints {
		w := d.Endpoints[i].Weight
		if w != ep.CurrentWeight {
			changed = true
			if !ok[i] || ep.CurrentWeight <= 0 {
				return false
			}
		}
		if ok[i] {
			now[i] = ep.RequestRate / totalRate
			next[i] = now[i] * float64(w) / float64(ep.CurrentWeight)
			nextTotal += next[i]
		}
	}
	if !changed || nextTotal <= 0 {
		return false
	}
	for i := range next {
		next[i] /= nextTotal
	}
	qNow := predict(now)
	return !math.IsInf(qNow, 1) && predict(next) >= qNow*(1-writeGainTolerance)
}

// scaleShift is the log-space offset that sets the weights' common scale; only ratios matter to
// Envoy. A first step puts the median of the unfloored endpoints at MedianWeight. Later steps keep
// the scale the current weights already have, so converged weights are reproduced exactly and
// cost no write. Either way the largest weight never passes MaxWeight, so ratios survive clamping.
func scaleShift(endpoints []Endpoint, have []bool, logTarget, unfloored []float64, maxLog float64, firstStep bool, s Settings) float64 {
	shift := math.Log(float64(s.Capacity.MedianWeight)) - median(unfloored)
	if !firstStep {
		// The median endpoint keeps its weight: the shift undoes the median correction of the
		// endpoints above the ratio floor. A ratio of medians would jump whenever the floored
		// endpoints (whose targets lie far below) enter or leave the set.
		floor := maxLog - math.Log(s.Capacity.MaxWeightRatio)
		var corrections []float64
		for i, ep := range endpoints {
			if have[i] && logTarget[i] >= floor {
				corrections = append(corrections, math.Log(float64(ep.CurrentWeight))-logTarget[i])
			}
		}
		shift = median(corrections)
	}
	if maxLog+shift > math.Log(float64(s.MaxWeight)) {
		shift = math.Log(float64(s.MaxWeight)) - maxLog
	}
	return shift
}

// overloadedEndpoints flags the usable endpoints whose p99 latency, divided by their own CPU cost
// per request, exceeds ratio times the median of that stretch. Dividing by the cost keeps pods
// that are slow by nature (older hardware, heavier requests) from looking overloaded; a queue
// in front of the pod is what stretches its latency beyond its cost. At least three endpoints
// with a latency are needed for a median worth comparing against.
func overloadedEndpoints(endpoints []Endpoint, ok []bool, ratio float64) []bool {
	flagged := make([]bool, len(endpoints))
	if ratio <= 0 {
		return flagged
	}
	stretch := make([]float64, len(endpoints))
	var measured []float64
	for i, ep := range endpoints {
		if ok[i] && ep.CurrentWeight > 0 && ep.LatencyP99Seconds > 0 && finite(ep.LatencyP99Seconds) {
			stretch[i] = ep.LatencyP99Seconds / (ep.CPUCores / ep.RequestRate)
			measured = append(measured, stretch[i])
		}
	}
	if len(measured) < 3 {
		return flagged
	}
	threshold := ratio * median(measured)
	for i := range endpoints {
		flagged[i] = stretch[i] > threshold
	}
	return flagged
}

// cutOverloaded halves an overloaded endpoint's weight, never below the minimum weight.
func cutOverloaded(current int, s Settings) int {
	return max(s.MinWeight, int(math.Round(float64(current)/2)))
}

// shareNoiseZ is how many standard errors an observed share must stray from its target before the
// feedback acts on it.
const shareNoiseZ = 2

// beyondNoise shrinks a log-space share error by what sampling noise explains. An endpoint that
// served n requests in the window has a share known to about 1/√n (Poisson); the feedback acts
// only on the part of the error beyond shareNoiseZ standard errors, so a quiet Service's weights
// do not wander with its noise. n of 0 (window unknown) leaves the error whole.
func beyondNoise(logErr, n float64) float64 {
	if n <= 0 {
		return logErr
	}
	noise := shareNoiseZ / math.Sqrt(n)
	switch {
	case logErr > noise:
		return logErr - noise
	case logErr < -noise:
		return logErr + noise
	}
	return 0
}

// hasNew reports whether an endpoint still needs its first weight.
func hasNew(endpoints []Endpoint, ok []bool) bool {
	for _, ep := range endpoints {
		if ep.CurrentWeight <= 0 {
			return true
		}
	}
	return false
}

// targetShares splits the total request rate over the endpoints by the square-root rule: endpoint
// i gets λᵢ = μᵢ − c·√μᵢ, where μᵢ is its capacity and c is chosen so the λᵢ add up to the load.
// For parallel queues this minimises the mean time in system (the classic result for routing to
// M/M/1 servers of different speeds): it loads fast endpoints beyond their capacity share, since
// a request served there is served sooner, while keeping c·√μᵢ of headroom on each. At or above
// full load c would turn negative and the rule degrades to shares proportional to capacity.
// Endpoints the rule leaves without traffic keep a small positive share; the weight ratio bound
// then lifts them to the floor so they stay in rotation.
func targetShares(capacity []float64, ok []bool, load float64) []float64 {
	var sumMu, sumSqrt float64
	for i, mu := range capacity {
		if ok[i] {
			sumMu += mu
			sumSqrt += math.Sqrt(mu)
		}
	}
	c := math.Max(0, (sumMu-load)/sumSqrt)
	shares := make([]float64, len(capacity))
	var total float64
	for i, mu := range capacity {
		if ok[i] {
			shares[i] = math.Max(mu-c*math.Sqrt(mu), 1e-3*mu)
			total += shares[i]
		}
	}
	for i := range shares {
		shares[i] /= total
	}
	return shares
}

// adapted reports whether usable endpoints already carry unequal weights, i.e. a previous cycle
// set them. Equal weights mean a fresh start or a reset, where feedback has nothing to build on.
func adapted(endpoints []Endpoint, ok []bool) bool {
	first := 0
	for i, ep := range endpoints {
		if !ok[i] || ep.CurrentWeight <= 0 {
			continue
		}
		if first == 0 {
			first = ep.CurrentWeight
		} else if ep.CurrentWeight != first {
			return true
		}
	}
	return false
}

func boundStep(target float64, current int, ratio float64, reason *string) float64 {
	if current <= 0 {
		return target
	}
	c := float64(current)
	switch {
	case target > c*ratio:
		*reason = ReasonStepLimited
		return c * ratio
	case target < c/ratio:
		*reason = ReasonStepLimited
		return c / ratio
	}
	return target
}

// applyDeadBand keeps every current weight when no endpoint moved enough to matter, so that
// noise never costs an istiod push. An endpoint moves when its weight changes by at least the
// dead band relative to itself and its expected traffic share (weight over total weight) changes
// by at least the dead band times the mean share: a 20% swing of an endpoint that gets 1% of
// the traffic shifts 0.2% of it and is not worth a push. Endpoints without a weight yet always
// force a write.
func applyDeadBand(endpoints []Endpoint, d *Decision, deadBand float64) {
	var curTotal, newTotal float64
	for i, ep := range endpoints {
		if ep.CurrentWeight <= 0 {
			return
		}
		curTotal += float64(ep.CurrentWeight)
		newTotal += float64(d.Endpoints[i].Weight)
	}
	meanShare := 1 / float64(len(endpoints))
	for i, ep := range endpoints {
		cur, next := float64(ep.CurrentWeight), float64(d.Endpoints[i].Weight)
		relative := math.Abs(next-cur) / cur
		shareMove := math.Abs(next/newTotal - cur/curTotal)
		if relative >= deadBand && shareMove >= deadBand*meanShare {
			return
		}
	}
	for i, ep := range endpoints {
		d.Endpoints[i].Weight = ep.CurrentWeight
		d.Endpoints[i].Reason = ReasonInsideDeadBand
	}
	d.Reason = "every change inside the dead band"
}

// computeCPUDistance ports the published operator: alpha = (cpu - mean)/mean * k, weights move by
// (1 - alpha) when the distance exceeds the dead band, every weight is clamped to [min, max], and
// all are then rescaled so the median weight sits at the middle of the range.
func computeCPUDistance(endpoints []Endpoint, s Settings) Decision {
	p := s.CPUDistance
	n := len(endpoints)
	mid := float64(s.MinWeight+s.MaxWeight) / 2
	ok := make([]bool, n)
	reasons := make([]string, n)
	var sum float64
	valid := 0
	for i, ep := range endpoints {
		ok[i], reasons[i] = usable(ep, 0)
		if ok[i] {
			sum += ep.CPUCores
			valid++
		}
	}
	if valid < 2 {
		return equalWeights(endpoints, s, ReasonTooFewWithData)
	}
	mean := sum / float64(valid)
	w := make([]float64, n)
	have := make([]bool, n)
	for i, ep := range endpoints {
		if !ok[i] {
			continue
		}
		if ep.CurrentWeight <= 0 {
			reasons[i] = ReasonNewEndpoint
			continue
		}
		have[i] = true
		w[i] = float64(ep.CurrentWeight)
		dist := (ep.CPUCores - mean) / mean
		if math.Abs(dist) < p.DeadBand {
			// Clamped inside the dead band too, as the published operator does: its first cycle
			// brings the 1000 it starts every endpoint at down to the maximum.
			w[i] = clamp(w[i], float64(s.MinWeight), float64(s.MaxWeight))
			reasons[i] = ReasonCPUNearMean
			continue
		}
		w[i] = clamp(w[i]*(1-dist*p.K), float64(s.MinWeight), float64(s.MaxWeight))
		reasons[i] = ReasonCPUDistance
	}
	var present []float64
	for i := range endpoints {
		if have[i] {
			present = append(present, w[i])
		}
	}
	d := Decision{Endpoints: make([]Result, n), Reason: "weights moved against CPU distance"}
	factor := 1.0
	if len(present) > 0 {
		factor = mid / median(present)
	}
	for i, ep := range endpoints {
		if !have[i] {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: int(math.Round(mid)), Reason: reasons[i]}
			continue
		}
		v := clamp(w[i]*factor, float64(s.MinWeight), float64(s.MaxWeight))
		r := reasons[i]
		if v >= float64(s.MaxWeight) {
			r = ReasonClampedMax
		} else if v <= float64(s.MinWeight) {
			r = ReasonClampedMin
		}
		d.Endpoints[i] = Result{ID: ep.ID, Weight: int(math.Round(v)), Reason: r}
	}
	return d
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

// median returns the median of xs (mean of the middle two for even lengths); xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	c := append([]float64(nil), xs...)
	sort.Float64s(c)
	m := len(c) / 2
	if len(c)%2 == 1 {
		return c[m]
	}
	return (c[m-1] + c[m]) / 2
}
