package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

func TestCRD_RejectsInvalidSpecsAtAdmission(t *testing.T) {
	f := newFixture(t)
	dec := func(s string) *adlbv1.Decimal { d := adlbv1.Decimal(s); return &d }
	cases := map[string]struct {
		mutate func(*adlbv1.AdaptiveLoadBalancer)
		want   string
	}{
		"minWeight below 1": {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.MinWeight = ptr.To[int32](0) }, "spec.minWeight: Invalid value: 0: spec.minWeight in body should be greater than or equal to 1"},
		"minWeight above maxWeight": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.MinWeight, a.Spec.MaxWeight = ptr.To[int32](500), ptr.To[int32](100)
		}, "minWeight must not exceed maxWeight"},
		"interval too short": {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Interval = &metav1.Duration{Duration: 1e9} }, "interval must be between 5s and 10m"},
		"interval too long":  {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Interval = &metav1.Duration{Duration: 20 * 60e9} }, "interval must be between 5s and 10m"},
		"unknown algorithm":  {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Algorithm = "fastest" }, `spec.algorithm: Unsupported value: "fastest": supported values: "tail", "capacity", "cpu-distance"`},
		"unknown mode":       {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = "Sometimes" }, `spec.mode: Unsupported value: "Sometimes"`},
		"gain above 1": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Capacity = &adlbv1.CapacityParameters{Gain: dec("1.5")}
		}, "gain must be in (0, 1]"},
		"an overload ratio of 1": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Capacity = &adlbv1.CapacityParameters{OverloadLatencyRatio: dec("1")}
		}, "overloadLatencyRatio must be greater than 1, or 0 to turn overload detection off"},
		"not a decimal": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Capacity = &adlbv1.CapacityParameters{DeadBand: dec("five")}
		}, "spec.capacity.deadBand: Invalid value"},
		"a tail quantile of 1": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Tail = &adlbv1.TailParameters{Quantile: dec("1")}
		}, "quantile must be in (0.5, 1)"},
		"a tail utilization above the model's": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Tail = &adlbv1.TailParameters{MaxUtilization: dec("0.99")}
		}, "maxUtilization must be in (0, 0.95]"},
		"k of zero": {func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.CPUDistance = &adlbv1.CPUDistanceParameters{K: dec("0")}
		}, "k must be in (0, 1]"},
		"missing target":      {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.TargetRef.Name = "" }, "spec.targetRef.name"},
		"invalid target name": {func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.TargetRef.Name = "Web_Server" }, "spec.targetRef.name: Invalid value"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := &adlbv1.AdaptiveLoadBalancer{
				ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: f.ns},
				Spec:       adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}},
			}
			tc.mutate(a)
			err := k8s.Create(f.ctx, a)
			if err == nil {
				_ = k8s.Delete(f.ctx, a)
				t.Fatal("the API server accepted an invalid spec")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q lacks %q", err.Error(), tc.want)
			}
		})
	}

	// A valid spec is accepted and defaulted.
	ok := &adlbv1.AdaptiveLoadBalancer{
		ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: f.ns},
		Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"},
			MinWeight: ptr.To[int32](5), MaxWeight: ptr.To[int32](500), Capacity: &adlbv1.CapacityParameters{Gain: dec("0.25")},
			Tail: &adlbv1.TailParameters{BurstMargin: dec("1.25"), MinPodRate: dec("2")}},
	}
	f.create(ok)
	if ok.Spec.Mode != adlbv1.ModeActive || ok.Spec.Algorithm != adlbv1.AlgorithmTail || ok.Spec.Interval == nil || ok.Spec.Interval.Duration != 30e9 {
		t.Fatalf("defaults: mode %q algorithm %q interval %v", ok.Spec.Mode, ok.Spec.Algorithm, ok.Spec.Interval)
	}
	s, err := EngineSettings(ok)
	if err != nil || s.MinWeight != 5 || s.MaxWeight != 500 || s.Capacity.Gain != 0.25 || s.Tail.BurstMargin != 1.25 || s.Tail.MinPodRate != 2 || s.Tail.Quantile != 0.99 {
		t.Fatalf("engine settings %+v err %v", s, err)
	}
}
