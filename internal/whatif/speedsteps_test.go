package whatif

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// podWithCosts is a pod serving rate rps in every step at the given CPU-seconds per request.
func podWithCosts(rate float64, costs []float64) *PodMeasurement {
	p := &PodMeasurement{Name: "p"}
	for _, c := range costs {
		p.Rates = append(p.Rates, rate)
		p.CPUs = append(p.CPUs, rate*c)
	}
	return p
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestSpeedSteps_AStepwiseSlowdownIsFittedStepByStep(t *testing.T) {
	const step = 30 * time.Second
	costs := append(append(repeat(0.008, 8), repeat(0.010, 4)...), repeat(0.016, 8)...)
	blocks := costBlocks([]*PodMeasurement{podWithCosts(50, costs)}, len(costs), step) // 1,500 requests a step
	if !speedChanges(blocks) {
		t.Fatalf("a pod whose cost doubles is not seen to change: %+v", blocks)
	}
	got := speedSteps(blocks, 0.008, step)
	want := []SpeedStep{{0, 1}, {4 * time.Minute, 0.8}, {6 * time.Minute, 0.5}}
	if len(got) != len(want) {
		t.Fatalf("speed steps %s, want %s", SpeedStepsText(got), SpeedStepsText(want))
	}
	for i := range want {
		if got[i].At != want[i].At || math.Abs(got[i].Speed-want[i].Speed) > 1e-9 {
			t.Errorf("step %d: %.3f from %v, want %.3f from %v", i, got[i].Speed, got[i].At, want[i].Speed, want[i].At)
		}
	}
}

func TestSpeedSteps_NoiseAndSparseStepsAreNotAChange(t *testing.T) {
	const step = 30 * time.Second
	// ±10% around 8 ms, alternating: sampling noise, not a neighbour.
	var noisy []float64
	for k := range 20 {
		noisy = append(noisy, 0.008*(1+0.1*float64(1-2*(k%2))))
	}
	if blocks := costBlocks([]*PodMeasurement{podWithCosts(50, noisy)}, len(noisy), step); speedChanges(blocks) {
		t.Errorf("noise of ±10%% counted as a speed change: %+v", blocks)
	}
	// 1 rps: 30 requests a step, so a stretch needs 34 steps: the 20-step window is one stretch.
	costs := append(repeat(0.008, 10), repeat(0.016, 10)...)
	if blocks := costBlocks([]*PodMeasurement{podWithCosts(1, costs)}, len(costs), step); speedChanges(blocks) {
		t.Errorf("a pod with too few requests to measure a stretch counted as changing: %+v", blocks)
	}
}

// servingPod serves 10 rps in the steps [from, to) of a window of n steps.
func servingPod(from, to, n int) *PodMeasurement {
	p := &PodMeasurement{}
	for k := range n {
		r := math.NaN()
		if k >= from && k < to {
			r = 10
		}
		p.Rates = append(p.Rates, r)
	}
	return p
}

func TestReplicaSteps_AScaleIsFittedAndARollingRestartIsNot(t *testing.T) {
	const step = 30 * time.Second
	// Two pods throughout, a third from step 6: a scale-out.
	got := replicaSteps([]*PodMeasurement{servingPod(0, 12, 12), servingPod(0, 12, 12), servingPod(6, 12, 12)}, 12, step)
	if len(got) != 2 || got[0] != (ReplicaStep{0, 2}) || got[1] != (ReplicaStep{3 * time.Minute, 3}) {
		t.Errorf("scale-out: %s, want 2 from 0s, 3 from 3m0s", ReplicaStepsText(got))
	}
	// A pod replaced at step 5, both serving in that step: no scale.
	if got := replicaSteps([]*PodMeasurement{servingPod(0, 12, 12), servingPod(0, 6, 12), servingPod(5, 12, 12)}, 12, step); got != nil {
		t.Errorf("rolling restart fitted as a scale: %s", ReplicaStepsText(got))
	}
}

func TestSpeedSteps_NoiseOfAHeavyTailedCostIsNotAChange(t *testing.T) {
	const step = 30 * time.Second
	rng := rand.New(rand.NewSource(11))
	// Identical pods at 40 rps (1,200 requests a step), 8 steps, lognormal request costs of mean
	// 8 ms and CV 2: each step's CPU per request is the mean of its 1,200 draws.
	sigma2 := math.Log(1 + 2*2)
	mu := math.Log(0.008) - sigma2/2
	flagged := 0
	const pods = 300
	for range pods {
		var costs []float64
		for range 8 {
			sum := 0.0
			for range 1200 {
				sum += math.Exp(mu + math.Sqrt(sigma2)*rng.NormFloat64())
			}
			costs = append(costs, sum/1200)
		}
		if speedChanges(costBlocks([]*PodMeasurement{podWithCosts(40, costs)}, len(costs), step)) {
			flagged++
		}
	}
	if share := float64(flagged) / pods; share > 0.03 {
		t.Errorf("%.1f%% of steady pods with a CV-2 cost counted as changing speed, want at most 3%%", 100*share)
	}
}
