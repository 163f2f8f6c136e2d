package whatif

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// A pod's speed can change during the window: a neighbour takes its node's cores, a CPU throttles
// down. Averaged over the window such a pod's speed is right in no step, so it is fitted as it
// changes: the CPU per request of each stretch of steps holding enough requests to measure it.

// minBlockRequests is the fewest requests a stretch of steps needs for its CPU per request to
// count: with a cost CV of 1 its sampling error is then about 3%, with a CV of 2 about 6% (more
// for a heavy tail, whose mean converges slowly; speedChanges smooths for that).
const minBlockRequests = 1000

// speedChangeRatio is how much costlier a pod's costliest stretch must be than its cheapest for
// its speed to count as changing (the stretches a tenth in from either end, so that one odd
// stretch does not decide).
const speedChangeRatio = 1.25

// speedStepMin is the least change of speed that starts a new speed step.
const speedStepMin = 0.05

// costBlock is a stretch of steps [from, to) and its CPU-seconds per request.
type costBlock struct {
	from, to int
	cost     float64
}

// costBlocks cuts the steps into stretches of at least minBlockRequests requests, over the pods
// together, and gives each its CPU per request. Steps where a pod lacks its CPU or its rate do
// not count for that pod. A short remainder joins the stretch before it.
func costBlocks(pods []*PodMeasurement, steps int, step time.Duration) []costBlock {
	var out []costBlock
	start, cpu, reqs := 0, 0.0, 0.0
	for k := range steps {
		for _, p := range pods {
			if k < len(p.Rates) && k < len(p.CPUs) && !math.IsNaN(p.Rates[k]) && !math.IsNaN(p.CPUs[k]) {
				cpu += p.CPUs[k] * step.Seconds()
				reqs += p.Rates[k] * step.Seconds()
			}
		}
		if reqs >= minBlockRequests {
			out = append(out, costBlock{from: start, to: k + 1, cost: cpu / reqs})
			start, cpu, reqs = k+1, 0, 0
		}
	}
	if reqs > 0 && len(out) > 0 {
		last := &out[len(out)-1]
		if reqs < minBlockRequests/2 {
			last.to = steps
		} else {
			out = append(out, costBlock{from: start, to: steps, cost: cpu / reqs})
		}
	}
	return out
}

// speedChanges says whether the stretches' costs differ by more than speedChangeRatio, once each
// stretch's cost is the median of it and its neighbours: a change a neighbour shares holds, where
// one stretch drawn costly by chance (a heavy-tailed cost's few long requests) does not. With 8
// stretches of identical lognormal pods at CV 2, the raw costs differ by more than 1.25× for one
// pod in six (TestSpeedSteps_NoiseOfAHeavyTailedCostIsNotAChange).
func speedChanges(blocks []costBlock) bool {
	if len(blocks) < 2 {
		return false
	}
	costs := make([]float64, len(blocks))
	for i, b := range blocks {
		costs[i] = b.cost
	}
	if len(costs) >= 3 {
		smoothed := make([]float64, len(costs))
		for i := range costs {
			lo, hi := max(0, i-1), min(len(costs), i+2)
			w := slices.Clone(costs[lo:hi])
			slices.Sort(w)
			smoothed[i] = w[len(w)/2]
			if len(w) == 2 {
				smoothed[i] = (w[0] + w[1]) / 2
			}
		}
		costs = smoothed
	}
	slices.Sort(costs)
	trim := len(costs) / 10
	return costs[len(costs)-1-trim] > speedChangeRatio*costs[trim]
}

// costAt is the cost of the stretch holding step k (NaN outside them).
func costAt(blocks []costBlock, k int) float64 {
	for _, b := range blocks {
		if k >= b.from && k < b.to {
			return b.cost
		}
	}
	return math.NaN()
}

// sameProfile says whether two pods' costs stay within groupSpread of each other in every step
// both measured.
func sameProfile(a, b []costBlock, steps int) bool {
	for k := range steps {
		ca, cb := costAt(a, k), costAt(b, k)
		if math.IsNaN(ca) || math.IsNaN(cb) {
			continue
		}
		if math.Max(ca, cb) > groupSpread*math.Min(ca, cb) {
			return false
		}
	}
	return true
}

// speedSteps turns a changing group's stretches into speed steps relative to the cheapest cost:
// a new step where the speed moves by more than speedStepMin from the step in force.
func speedSteps(blocks []costBlock, cheapest float64, step time.Duration) []SpeedStep {
	var out []SpeedStep
	for _, b := range blocks {
		speed := cheapest / b.cost
		if n := len(out); n > 0 && math.Abs(speed/out[n-1].Speed-1) <= speedStepMin {
			continue
		}
		out = append(out, SpeedStep{At: time.Duration(b.from) * step, Speed: math.Round(speed*1000) / 1000})
	}
	if len(out) > 0 {
		out[0].At = 0
	}
	return out
}

// SpeedStepsText describes a group's speed steps.
func SpeedStepsText(steps []SpeedStep) string {
	s := ""
	for i, st := range steps {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%.3f from %v", st.Speed, st.At)
	}
	return s
}
