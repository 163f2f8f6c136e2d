package whatif

import (
	"math"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// istioBounds are Istio's default latency buckets (ms).
var istioBounds = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, math.Inf(1)}

// exactGroup is a group whose histogram is n requests drawn exactly from a cost distribution: its
// expected bucket counts.
func exactGroup(c sim.Cost, n float64) *Group {
	h := sim.Histogram{BoundsMS: istioBounds, Cumulative: make([]float64, len(istioBounds))}
	for i, b := range istioBounds {
		h.Cumulative[i] = n
		if !math.IsInf(b, 1) {
			h.Cumulative[i] = n * c.CDF(b/1000)
		}
	}
	return &Group{Name: "g", Latency: h, CostSeconds: c.Mean.Seconds()}
}

func TestAnalyticFit_EachFamilyBestExplainsItsOwnHistogram(t *testing.T) {
	mean := 8 * time.Millisecond
	truths := []CostShape{
		{Family: sim.CostExponential},
		{Family: sim.CostGamma, CV: 0.5},
		{Family: sim.CostLognormal, CV: 1.5},
		{Family: sim.CostMixture, CV: 0.25, SlowShare: 0.1, SlowRatio: 12},
	}
	for _, truth := range truths {
		t.Run(truth.Family, func(t *testing.T) {
			calib := []*Group{exactGroup(truth.Cost(mean), 100_000)}
			var best CostShape
			bestLL := math.Inf(-1)
			for _, family := range costFamilies {
				s := analyticFit(calib, family)
				ll := shapeLogLikelihood(calib[0], s)
				t.Logf("%s: log-likelihood %.1f", s, ll)
				if ll > bestLL+1 { // a richer family must win clearly, not by rounding
					best, bestLL = s, ll
				}
			}
			// The exponential is the gamma of CV 1, so either may explain it.
			if best.Family != truth.Family && !(truth.Family == sim.CostExponential && best.Family == sim.CostGamma && math.Abs(best.CV-1) < 0.1) {
				t.Errorf("best family %s, the histogram's is %s", best, truth)
			}
			if truth.Family == sim.CostGamma || truth.Family == sim.CostLognormal {
				if math.Abs(best.CV/truth.CV-1) > 0.1 {
					t.Errorf("fitted CV %.2f, the histogram's %.2f", best.CV, truth.CV)
				}
			}
			if math.Abs(best.OverallCV()/truth.OverallCV()-1) > 0.15 {
				t.Errorf("fitted overall CV %.2f, the histogram's %.2f", best.OverallCV(), truth.OverallCV())
			}
		})
	}
}

func TestCostShape_CostKeepsTheMeanAndWritesAValidScenario(t *testing.T) {
	for _, s := range []CostShape{
		{Family: sim.CostExponential},
		{Family: sim.CostGamma, CV: 0.7},
		{Family: sim.CostLognormal, CV: 1.2},
		{Family: sim.CostMixture, CV: 0.4, SlowShare: 0.15, SlowRatio: 6},
	} {
		c := s.Cost(5 * time.Millisecond)
		yaml := "name: x\nduration: 60s\nwarmup: 10s\nload: {rps: 10}\npods:\n  - {name: a, replicas: 1, workers: 1, cost: " + costYAML(c) + "}\n"
		sc, err := sim.ParseScenario([]byte(yaml), "x")
		if err != nil {
			t.Fatalf("%s: %v\n%s", s, err, yaml)
		}
		if got := sc.Pods[0].Cost.Mean.Duration; math.Abs(got.Seconds()/0.005-1) > 0.001 {
			t.Errorf("%s: mean %v, want 5ms", s, got)
		}
	}
}
