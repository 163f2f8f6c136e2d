package whatif

import (
	"fmt"
	"slices"
	"time"
)

// A group's pods can come and go during the window: a scale-out, a scale-in. Held at their
// average number throughout, the scenario would give the group too few pods before and too many
// after. The steps each pod served in say how many served when.

// ReplicaStep is a group's number of pods in service from a time on.
type ReplicaStep struct {
	// At is the offset from the window's start.
	At       time.Duration
	Replicas int
}

// servingShare is the least part of the group's median rate per pod a pod must take in a step to
// count as serving in it.
const servingShare = 0.25

// replicaSteps counts the group's pods serving (with requests) in each step and returns the counts as steps,
// the first at the window's start; nil when the count holds. A count must hold for two steps
// (or to the window's end) to start a step: a pod replaced by a rolling restart overlaps its
// successor in one step, which is no scale.
func replicaSteps(pods []*PodMeasurement, steps int, step time.Duration) []ReplicaStep {
	counts := make([]int, steps)
	for k := range counts {
		var rates []float64
		for _, p := range pods {
			if k < len(p.Rates) && p.Rates[k] > 0 {
				rates = append(rates, p.Rates[k])
			}
		}
		if len(rates) == 0 {
			continue
		}
		// A pod serves in the step if it took a fair part of a pod's share: one that left
		// early in the step, or finished its last requests in it, is gone.
		slices.Sort(rates)
		floor := servingShare * rates[len(rates)/2]
		for _, r := range rates {
			if r >= floor {
				counts[k]++
			}
		}
	}
	var out []ReplicaStep
	for k, c := range counts {
		if n := len(out); n > 0 && out[n-1].Replicas == c {
			continue
		}
		if k+1 < steps && counts[k+1] != c {
			continue // a blip: the count moves on at once
		}
		if c == 0 {
			continue // no pod served: the step before holds (the simulator needs one)
		}
		out = append(out, ReplicaStep{At: time.Duration(k) * step, Replicas: c})
	}
	if len(out) < 2 {
		return nil
	}
	out[0].At = 0
	return out
}

// ReplicaStepsText describes a group's replica steps.
func ReplicaStepsText(steps []ReplicaStep) string {
	s := ""
	for i, st := range steps {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d from %v", st.Replicas, st.At)
	}
	return s
}
