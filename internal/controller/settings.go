package controller

import (
	"fmt"
	"strconv"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// EngineSettings turns an AdaptiveLoadBalancer's spec into weight-engine settings: the
// algorithm's documented defaults (weights.DefaultSettings), overridden field by field.
func EngineSettings(alb *adlbv1.AdaptiveLoadBalancer) (weights.Settings, error) {
	alg := weights.AlgorithmTail
	if alb.Spec.Algorithm != "" {
		a, err := weights.ParseAlgorithm(string(alb.Spec.Algorithm))
		if err != nil {
			return weights.Settings{}, fmt.Errorf("spec.algorithm: %w", err)
		}
		alg = a
	}
	s := weights.DefaultSettings(alg)
	if alb.Spec.MinWeight != nil {
		s.MinWeight = int(*alb.Spec.MinWeight)
	}
	if alb.Spec.MaxWeight != nil {
		s.MaxWeight = int(*alb.Spec.MaxWeight)
	}
	// The capacity scale must stay inside the user's range.
	if s.Capacity.MedianWeight < s.MinWeight || s.Capacity.MedianWeight > s.MaxWeight {
		s.Capacity.MedianWeight = (s.MinWeight + s.MaxWeight) / 2
	}
	set := func(field string, d *adlbv1.Decimal, target *float64) error {
		if d == nil {
			return nil
		}
		v, err := strconv.ParseFloat(string(*d), 64)
		if err != nil {
			return fmt.Errorf("%s %q is not a decimal number", field, string(*d))
		}
		*target = v
		return nil
	}
	type decimalField struct {
		name   string
		value  *adlbv1.Decimal
		target *float64
	}
	var fields []decimalField
	if c := alb.Spec.Capacity; c != nil {
		fields = append(fields,
			decimalField{"spec.capacity.gain", c.Gain, &s.Capacity.Gain},
			decimalField{"spec.capacity.maxStepRatio", c.MaxStepRatio, &s.Capacity.MaxStepRatio},
			decimalField{"spec.capacity.maxWeightRatio", c.MaxWeightRatio, &s.Capacity.MaxWeightRatio},
			decimalField{"spec.capacity.deadBand", c.DeadBand, &s.Capacity.DeadBand},
			decimalField{"spec.capacity.minRequestRate", c.MinRequestRate, &s.Capacity.MinRequestRate},
			decimalField{"spec.capacity.planningLoadFactor", c.PlanningLoadFactor, &s.Capacity.PlanningLoadFactor},
			decimalField{"spec.capacity.overloadLatencyRatio", c.OverloadLatencyRatio, &s.Capacity.OverloadLatencyRatio})
	}
	if c := alb.Spec.Tail; c != nil {
		fields = append(fields,
			decimalField{"spec.tail.quantile", c.Quantile, &s.Tail.Quantile},
			decimalField{"spec.tail.maxUtilization", c.MaxUtilization, &s.Tail.MaxUtilization},
			decimalField{"spec.tail.burstMargin", c.BurstMargin, &s.Tail.BurstMargin},
			decimalField{"spec.tail.maxShareRatio", c.MaxShareRatio, &s.Tail.MaxShareRatio},
			decimalField{"spec.tail.surgeFactor", c.SurgeFactor, &s.Tail.SurgeFactor},
			decimalField{"spec.tail.minPodRate", c.MinPodRate, &s.Tail.MinPodRate})
	}
	if c := alb.Spec.CPUDistance; c != nil {
		fields = append(fields,
			decimalField{"spec.cpuDistance.k", c.K, &s.CPUDistance.K},
			decimalField{"spec.cpuDistance.deadBand", c.DeadBand, &s.CPUDistance.DeadBand})
	}
	for _, f := range fields {
		if err := set(f.name, f.value, f.target); err != nil {
			return weights.Settings{}, err
		}
	}
	if err := s.Validate(); err != nil {
		return weights.Settings{}, fmt.Errorf("AdaptiveLoadBalancer %s/%s: %w", alb.Namespace, alb.Name, err)
	}
	return s, nil
}
