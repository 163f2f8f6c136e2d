package weights

import (
	"fmt"
	"math"
)

// Settings configures Compute. Start from DefaultSettings and override fields.
type Settings struct {
	Algorithm Algorithm
	// MinWeight and MaxWeight bound every written weight (Envoy requires weights ≥ 1).
	MinWeight int
	MaxWeight int
	// DefaultWeight is given to endpoints when nothing better is known (all equal, fallback).
	// 0 means the midpoint of [MinWeight, MaxWeight].
	DefaultWeight int

	CPUDistance CPUDistanceParams
	// Capacity tunes the capacity algorithm, and the feedback the tail algorithm shares with it.
	Capacity CapacityParams
	Tail     TailParams
}

// TailParams tune the tail algorithm's choice of target shares; its feedback toward them is the
// capacity algorithm's, tuned by CapacityParams.
type TailParams struct {
	// Quantile is the latency quantile the split minimises, in (0.5, 1): 0.99 for the p99.
	Quantile float64
	// MaxUtilization is the highest load planned for any pod, as a fraction of its CPU limit at
	// the planning load. It keeps the fast pods off the knee of their latency curve when the
	// model is wrong.
	MaxUtilization float64
	// BurstMargin multiplies the planning load: the larger of the current and the recent peak
	// request rate. 1 plans for the peak as seen.
	BurstMargin float64
	// MaxShareRatio bounds how far beyond the capacity split the engine may go: no group's
	// share exceeds this multiple of its share of the fleet's capacity.
	MaxShareRatio float64
	// SurgeFactor is the rise of the load, over the planning load, that the split must carry
	// without loading any group beyond its CPU limit until the controller has seen it (see
	// shareRatioCeiling). 1 plans for the planning load alone.
	SurgeFactor float64
	// MinPodRate is the request rate, per second, that every pod keeps so that its cost and
	// latency stay measurable however slow it is.
	MinPodRate float64
}

// CPUDistanceParams are the published operator's parameters.
type CPUDistanceParams struct {
	// K scales the relative CPU distance into a weight change: alpha = (cpu - mean)/mean * K.
	K float64
	// DeadBand skips endpoints whose relative CPU distance from the mean is below it.
	DeadBand float64
}

// CapacityParams tune the capacity algorithm.
type CapacityParams struct {
	// Gain is the fraction of the (log-space) way from the current weight to the target taken per
	// cycle: 1 jumps straight to the target, smaller values smooth noisy estimates.
	Gain float64
	// MaxStepRatio bounds one cycle's change of an endpoint's weight to [w/r, w*r].
	MaxStepRatio float64
	// MaxWeightRatio bounds the ratio between the largest and the smallest weight.
	MaxWeightRatio float64
	// DeadBand is the change below which an update is not worth a write: relative to the weight,
	// and times the mean traffic share for the share the endpoint would gain or lose.
	DeadBand float64
	// MinRequestRate is the request rate below which an endpoint's cost per request is too noisy
	// to trust; such an endpoint keeps the fleet's median cost.
	MinRequestRate float64
	// PlanningLoadFactor splits traffic as if the load were this many times the observed load
	// (capped at the fleet's capacity): shares optimal for a higher load keep headroom on the
	// fast endpoints for bursts that arrive between two cycles. 1 plans for the load as seen.
	PlanningLoadFactor float64
	// MedianWeight is the weight the median endpoint is scaled to. It sets the resolution of
	// the weights (1/MedianWeight) and must lie within [MinWeight, MaxWeight].
	MedianWeight int
	// OverloadLatencyRatio detects an endpoint that has become slower than its weight assumes
	// (a noisy neighbour, a throttled node): its p99 latency in units of its own CPU cost per
	// request exceeds this multiple of the median endpoint's. Such an endpoint's weight is halved
	// at once, without waiting for a window observed entirely under the current weights. Average
	// CPU over a window reacts late; a queue shows in the p99 within seconds. 0 turns it off.
	OverloadLatencyRatio float64
}

// DefaultSettings returns the documented defaults for an algorithm.
func DefaultSettings(alg Algorithm) Settings {
	switch alg {
	case AlgorithmCPUShare:
		// No clamp but Envoy's floor of 1: the ceiling only keeps weights far from overflow.
		return Settings{Algorithm: AlgorithmCPUShare, MinWeight: 1, MaxWeight: 1 << 24, DefaultWeight: 1000}
	case AlgorithmCPUDistance:
		// As published: k = 1%, dead band 5%, weights 100..600, median rescaled to 350.
		return Settings{
			Algorithm:   AlgorithmCPUDistance,
			MinWeight:   100,
			MaxWeight:   600,
			CPUDistance: CPUDistanceParams{K: 0.01, DeadBand: 0.05},
		}
	case AlgorithmTail:
		s := DefaultSettings(AlgorithmCapacity)
		s.Algorithm = AlgorithmTail
		// The tail split sends the slowest pods a trickle: the weights need a wider range. The
		// ratio stays bounded so that Envoy's preference for less busy pods (weight divided by
		// active requests + 1) can still pull load off a fast pod that is suddenly overloaded
		// before the next cycle reacts. In the runs that chose it, losing one of seed-fib's three
		// fast pods cost a p99 of 106 ms at 2000 (Envoy alone: 91), 78 ms at 400 and 34 ms at
		// 50, which gave 27 ms on steady seed-fib instead of 23.
		s.MinWeight, s.MaxWeight = 1, 10000
		s.Capacity.MaxWeightRatio = 400
		s.Capacity.PlanningLoadFactor = 1
		// Gain stays at capacity's 0.5. The full correction (1) converges in fewer writes
		// (seed-fib 8 -> 6) and meets bursty (101.2 ms), but when one of seed-fib's fast pods
		// dies it overshoots: 112 ms, worse than Envoy alone (91 ms); at 0.5, 64 ms.
		s.Tail = TailParams{
			Quantile:       0.99,
			MaxUtilization: 0.85,
			BurstMargin:    1.1,
			MaxShareRatio:  3,
			SurgeFactor:    4,
			MinPodRate:     1,
		}
		return s
	default:
		return Settings{
			Algorithm: AlgorithmCapacity,
			MinWeight: 10,
			MaxWeight: 1000,
			Capacity: CapacityParams{
				Gain:                 0.5,
				MaxStepRatio:         4,
				MaxWeightRatio:       20,
				DeadBand:             0.05,
				MinRequestRate:       0.5,
				PlanningLoadFactor:   1.5,
				MedianWeight:         100,
				OverloadLatencyRatio: 3,
			},
		}
	}
}

// EqualWeight is the weight every endpoint gets when weights are equal: the start, DryRun, and
// the fallback when metrics are gone.
func (s Settings) EqualWeight() int { return s.defaultWeight() }

// defaultWeight is the weight for endpoints nothing is known about.
func (s Settings) defaultWeight() int {
	if s.DefaultWeight > 0 {
		return s.DefaultWeight
	}
	if (s.Algorithm == AlgorithmCapacity || s.Algorithm == AlgorithmTail) && s.Capacity.MedianWeight > 0 {
		return s.Capacity.MedianWeight
	}
	return (s.MinWeight + s.MaxWeight) / 2
}

// Validate reports the first setting that is out of range, naming it and the allowed values.
func (s Settings) Validate() error {
	if s.MinWeight < 1 {
		return fmt.Errorf("minWeight %d must be at least 1 (Envoy ignores endpoints of weight 0)", s.MinWeight)
	}
	if s.MaxWeight < s.MinWeight {
		return fmt.Errorf("maxWeight %d must not be below minWeight %d", s.MaxWeight, s.MinWeight)
	}
	if s.DefaultWeight != 0 && (s.DefaultWeight < s.MinWeight || s.DefaultWeight > s.MaxWeight) {
		return fmt.Errorf("defaultWeight %d must lie within [minWeight %d, maxWeight %d]", s.DefaultWeight, s.MinWeight, s.MaxWeight)
	}
	switch s.Algorithm {
	case AlgorithmCPUShare: // nothing to tune
	case AlgorithmCPUDistance:
		p := s.CPUDistance
		if !finite(p.K) || p.K <= 0 || p.K > 1 {
			return fmt.Errorf("cpu-distance k %v must be in (0, 1]", p.K)
		}
		if !finite(p.DeadBand) || p.DeadBand < 0 || p.DeadBand >= 1 {
			return fmt.Errorf("cpu-distance deadBand %v must be in [0, 1)", p.DeadBand)
		}
	case AlgorithmCapacity, AlgorithmTail:
		if s.Algorithm == AlgorithmTail {
			if err := s.Tail.validate(); err != nil {
				return err
			}
		}
		p := s.Capacity
		if !finite(p.Gain) || p.Gain <= 0 || p.Gain > 1 {
			return fmt.Errorf("capacity gain %v must be in (0, 1]", p.Gain)
		}
		if !finite(p.MaxStepRatio) || p.MaxStepRatio <= 1 {
			return fmt.Errorf("capacity maxStepRatio %v must be greater than 1", p.MaxStepRatio)
		}
		if !finite(p.MaxWeightRatio) || p.MaxWeightRatio < 1 {
			return fmt.Errorf("capacity maxWeightRatio %v must be at least 1", p.MaxWeightRatio)
		}
		if !finite(p.DeadBand) || p.DeadBand < 0 || p.DeadBand >= 1 {
			return fmt.Errorf("capacity deadBand %v must be in [0, 1)", p.DeadBand)
		}
		if !finite(p.MinRequestRate) || p.MinRequestRate < 0 {
			return fmt.Errorf("capacity minRequestRate %v must be a non-negative number", p.MinRequestRate)
		}
		if !finite(p.PlanningLoadFactor) || p.PlanningLoadFactor < 1 {
			return fmt.Errorf("capacity planningLoadFactor %v must be at least 1", p.PlanningLoadFactor)
		}
		if !finite(p.OverloadLatencyRatio) || (p.OverloadLatencyRatio != 0 && p.OverloadLatencyRatio <= 1) {
			return fmt.Errorf("capacity overloadLatencyRatio %v must be greater than 1, or 0 to turn overload detection off", p.OverloadLatencyRatio)
		}
		if p.MedianWeight < s.MinWeight || p.MedianWeight > s.MaxWeight {
			return fmt.Errorf("capacity medianWeight %d must lie within [minWeight %d, maxWeight %d]", p.MedianWeight, s.MinWeight, s.MaxWeight)
		}
	default:
		return fmt.Errorf("algorithm %q is unknown; valid algorithms are %v", s.Algorithm, Algorithms)
	}
	return nil
}

// ParseAlgorithm maps a user-supplied name to an Algorithm.
func ParseAlgorithm(name string) (Algorithm, error) {
	for _, a := range Algorithms {
		if string(a) == name {
			return a, nil
		}
	}
	return "", fmt.Errorf("algorithm %q is unknown; valid algorithms are %v", name, Algorithms)
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func (p TailParams) validate() error {
	if !finite(p.Quantile) || p.Quantile <= 0.5 || p.Quantile >= 1 {
		return fmt.Errorf("tail quantile %v must be in (0.5, 1)", p.Quantile)
	}
	if !finite(p.MaxUtilization) || p.MaxUtilization <= 0 || p.MaxUtilization > maxModelUtilization {
		return fmt.Errorf("tail maxUtilization %v must be in (0, %v]", p.MaxUtilization, maxModelUtilization)
	}
	if !finite(p.BurstMargin) || p.BurstMargin < 1 {
		return fmt.Errorf("tail burstMargin %v must be at least 1", p.BurstMargin)
	}
	if !finite(p.MaxShareRatio) || p.MaxShareRatio < 1 {
		return fmt.Errorf("tail maxShareRatio %v must be at least 1", p.MaxShareRatio)
	}
	if !finite(p.SurgeFactor) || p.SurgeFactor < 1 {
		return fmt.Errorf("tail surgeFactor %v must be at least 1 (1 turns the surge bound off)", p.SurgeFactor)
	}
	if !finite(p.MinPodRate) || p.MinPodRate < 0 {
		return fmt.Errorf("tail minPodRate %v must be a non-negative number", p.MinPodRate)
	}
	return nil
}
