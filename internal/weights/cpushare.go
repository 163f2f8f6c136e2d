package weights

import (
	"math"
	"slices"
)

// The published operator's later rule (its repository's main branch), ported as a baseline for
// the simulator. Its constants are the source's; none is tunable.
const (
	// cpuShareGain is the fraction of the way to the new share taken per cycle.
	cpuShareGain = 0.15
	// cpuShareIdleCores: when the mean CPU is below it, every weight goes to cpuShareIdleWeight.
	cpuShareIdleCores  = 0.2
	cpuShareIdleWeight = 600
	// cpuShareLowMean: when the weights sum to less than this per endpoint, all are multiplied
	// by cpuShareRescale, so that rounding keeps its resolution.
	cpuShareLowMean = 100
	cpuShareRescale = 10
	// cpuShareMaxRiseDivisor caps a weight's increase per cycle at the mean weight / 4.
	cpuShareMaxRiseDivisor = 4
	// cpuShareNewQuantile: a new endpoint gets the mean of this lowest fraction of the weights.
	cpuShareNewQuantile = 0.1
)

// Reasons of the cpu-share rule.
const (
	ReasonCPUShare     = "moved toward its share by inverse CPU"
	ReasonCPUShareIdle = "mean CPU below 0.2 cores: every weight 600"
)

// computeCPUShare implements AlgorithmCPUShare. Each endpoint's new share of the weight sum is
// proportional to (mean CPU / its CPU) × its weight; the weight moves 15% of the way to it, rising
// by at most a quarter of the mean weight per cycle, with no bound but 1. Endpoints without
// usable metrics keep their weight and take no part; a new endpoint gets CPUShareNewWeight of the
// others.
func computeCPUShare(endpoints []Endpoint, s Settings) Decision {
	n := len(endpoints)
	d := Decision{Endpoints: make([]Result, n), Reason: "weights moved toward their inverse-CPU shares"}
	ok := make([]bool, n)
	var cpuSum float64
	var current []int
	valid := 0
	for i, ep := range endpoints {
		var why string
		ok[i], why = usable(ep, 0)
		d.Endpoints[i] = Result{ID: ep.ID, Weight: ep.CurrentWeight, Reason: why}
		if ep.CurrentWeight > 0 {
			current = append(current, ep.CurrentWeight)
		}
		if ok[i] && ep.CurrentWeight > 0 {
			cpuSum += ep.CPUCores
			valid++
		}
	}
	for i, ep := range endpoints {
		if ep.CurrentWeight <= 0 {
			d.Endpoints[i] = Result{ID: ep.ID, Weight: CPUShareNewWeight(current, s), Reason: ReasonNewEndpoint}
			ok[i] = false
		}
	}
	if valid == 0 {
		d.Reason = "no endpoint with usable metrics: weights kept"
		return d
	}
	meanCPU := cpuSum / float64(valid)
	if meanCPU < cpuShareIdleCores {
		for i := range d.Endpoints {
			d.Endpoints[i].Weight, d.Endpoints[i].Reason = cpuShareIdleWeight, ReasonCPUShareIdle
		}
		d.Reason = ReasonCPUShareIdle
		return d
	}
	var weightSum, scoreSum float64
	for i, ep := range endpoints {
		if ok[i] {
			weightSum += float64(ep.CurrentWeight)
			scoreSum += meanCPU / ep.CPUCores * float64(ep.CurrentWeight)
		}
	}
	maxRise := weightSum / float64(valid) / cpuShareMaxRiseDivisor
	next := make([]float64, n)
	var nextSum float64
	for i, ep := range endpoints {
		next[i] = float64(d.Endpoints[i].Weight)
		if ok[i] {
			w := float64(ep.CurrentWeight)
			share := meanCPU / ep.CPUCores * w / scoreSum * weightSum
			next[i] = w + math.Min(cpuShareGain*(share-w), maxRise)
			d.Endpoints[i].Reason = ReasonCPUShare
		}
		nextSum += next[i]
	}
	scale := 1.0
	if nextSum < float64(n*cpuShareLowMean) {
		scale = cpuShareRescale
	}
	for i := range d.Endpoints {
		d.Endpoints[i].Weight = max(1, int(math.Round(next[i]*scale)))
	}
	return d
}

// CPUShareNewWeight is the weight the cpu-share rule gives a new endpoint: the mean of the lowest
// 10% of the current weights (at least one of them), or the default weight when there are none.
func CPUShareNewWeight(current []int, s Settings) int {
	if len(current) == 0 {
		return s.defaultWeight()
	}
	c := slices.Clone(current)
	slices.Sort(c)
	k := max(1, int(float64(len(c))*cpuShareNewQuantile))
	sum := 0
	for _, w := range c[:k] {
		sum += w
	}
	return max(1, int(math.Round(float64(sum)/float64(k))))
}
