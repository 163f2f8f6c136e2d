package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Speed changes, drawn with GenerateOptions.SpeedChanges on the speed stream of a scenario's
// (seed, index): one class slows down step by step, as when a neighbour takes more and more of
// its nodes' cores. Documented in docs/benchmarks.md ("Random scenarios"); change both together.

// Ranges of the draws.
const (
	speedChangeShare             = 0.3 // the share of scenarios with a slowdown
	minSpeedSteps, maxSpeedSteps = 2, 4
	minSpeedDrop, maxSpeedDrop   = 0.10, 0.25 // each step lowers the speed by this share of what it was
	// The first step comes this long after the warm-up; the next ones minStepGap to maxStepGap
	// after the one before; none later than stepMargin before the end, so that each is seen.
	minFirstStep, maxFirstStep = 30, 60  // seconds
	minStepGap, maxStepGap     = 60, 180 // seconds
	stepMargin                 = 30 * time.Second
)

// slowDown draws, in speedChangeShare of the scenarios, a class whose speed steps down during
// the run and adds its events to sc. The class is one that does not scale (a pod the simulator
// adds after a speed change starts at its group's first speed), and it slows no further than
// keeps the peak load within maxLoad of the fleet's smallest capacity: a fleet that cannot serve
// its load only queues without bound. It returns the class's name and a description for the
// summary ("" and "" when no class slows down).
func (g generator) slowDown(sc *Scenario) (string, string) {
	if g.rng.Float64() >= speedChangeShare {
		return "", ""
	}
	// floor[i] is the lowest share of its speed class i can slow to.
	floor := map[int]float64{}
	var steady []int
	for i, p := range sc.Pods {
		if f := slowestShare(sc, i); len(p.Events) == 0 && f <= math.Pow(1-minSpeedDrop, minSpeedSteps) {
			steady = append(steady, i)
			floor[i] = f
		}
	}
	if len(steady) == 0 {
		return "", ""
	}
	i := steady[g.rng.Intn(len(steady))]
	pg := &sc.Pods[i]
	steps := g.intIn(minSpeedSteps, maxSpeedSteps)
	last := sc.Duration.Duration - stepMargin
	at := sc.Warmup.Duration + g.seconds(minFirstStep, maxFirstStep)
	share := 1.0 // of the class's first speed
	var texts []string
	for k := range steps {
		if k > 0 {
			latest := min(maxStepGap, int((last-at)/time.Second))
			if latest < minStepGap {
				break
			}
			at += g.seconds(minStepGap, latest)
		}
		// The deepest drop that leaves room for the smallest drops of the steps still required.
		required := max(0, minSpeedSteps-1-k)
		deepest := min(maxSpeedDrop, 1-floor[i]/math.Pow(1-minSpeedDrop, float64(required))/share)
		if deepest < minSpeedDrop {
			break
		}
		// Rounded up to a thousandth, so that rounding never slows it below its floor.
		speed := math.Ceil(pg.Speed*share*(1-g.uniform(minSpeedDrop, deepest))*1000) / 1000
		share = speed / pg.Speed
		pg.Events = append(pg.Events, PodEvent{At: Duration{at}, Speed: &speed})
		texts = append(texts, fmt.Sprintf("%.3g at %v", speed, at))
	}
	return pg.Name, fmt.Sprintf("; %s slows from %.3g to %s", pg.Name, pg.Speed, strings.Join(texts, ", "))
}

// slowestShare is the lowest share of its speed class i can run at while the scenario's peak load
// stays within maxLoad of the fleet's smallest capacity over the run (0 when any will do).
func slowestShare(sc *Scenario, i int) float64 {
	peak := sc.Load.RPS
	for _, ph := range sc.Load.Phases {
		peak = math.Max(peak, ph.RPS)
	}
	capacityOf := func(p PodGroup, replicas int) float64 {
		return float64(replicas) * p.CPULimit * p.Speed / p.Cost.Mean.Seconds()
	}
	// The others' smallest capacity, over the replica changes of the run.
	replicas := make([]int, len(sc.Pods))
	for j, p := range sc.Pods {
		replicas[j] = p.Replicas
	}
	others := func() float64 {
		total := 0.0
		for j, p := range sc.Pods {
			if j != i {
				total += capacityOf(p, replicas[j])
			}
		}
		return total
	}
	smallest := others()
	for j, p := range sc.Pods {
		for _, ev := range p.Events {
			if ev.Replicas != nil {
				replicas[j] = *ev.Replicas
				smallest = math.Min(smallest, others())
			}
		}
	}
	return math.Max(0, (peak/maxLoad-smallest)/capacityOf(sc.Pods[i], sc.Pods[i].Replicas))
}
