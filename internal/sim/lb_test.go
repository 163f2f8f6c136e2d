package sim

import (
	"math"
	"math/rand"
	"testing"
)

func TestBalancer_WeightedRoundRobinSharesMatchWeights(t *testing.T) {
	weights := []float64{1, 2, 3, 10, 25}
	b := newBalancer(LBRoundRobin, 2, 1)
	active := make([]int32, len(weights))
	r := rand.New(rand.NewSource(1))
	b.refresh(identity(len(weights)), weights, active, r)
	counts := make([]int, len(weights))
	const picks = 100_000
	for i := 0; i < picks; i++ {
		counts[b.pick(active, r)]++
	}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	for h, w := range weights {
		want := w / total
		got := float64(counts[h]) / picks
		if math.Abs(got-want) > 0.01*want {
			t.Errorf("host %d (weight %v): share %.5f, want %.5f ±1%%", h, w, got, want)
		}
	}
}

func TestBalancer_EqualWeightRoundRobinRotates(t *testing.T) {
	b := newBalancer(LBRoundRobin, 2, 1)
	active := make([]int32, 4)
	r := rand.New(rand.NewSource(1))
	b.refresh(identity(4), []float64{1, 1, 1, 1}, active, r)
	first := b.pick(active, r)
	for i := 1; i < 8; i++ {
		if got, want := b.pick(active, r), (first+int32(i))%4; got != want {
			t.Fatalf("pick %d = host %d, want %d in rotation", i, got, want)
		}
	}
}

func TestBalancer_P2CPicksTheLessLoadedOfItsChoices(t *testing.T) {
	// Host 0 is busy, host 1 idle: any pair of choices that includes host 1 must pick it, so with
	// two hosts host 0 is only picked when both choices land on it (probability 1/4).
	b := newBalancer(LBLeastRequest, 2, 1)
	active := []int32{5, 0}
	r := rand.New(rand.NewSource(2))
	b.refresh(identity(2), []float64{1, 1}, active, r)
	busy := 0
	const picks = 100_000
	for i := 0; i < picks; i++ {
		if b.pick(active, r) == 0 {
			busy++
		}
	}
	if share := float64(busy) / picks; math.Abs(share-0.25) > 0.01 {
		t.Fatalf("busy host picked %.3f of the time, want 0.25 (only when both choices hit it)", share)
	}
	// With choice_count 1 it degenerates to random.
	b1 := newBalancer(LBLeastRequest, 1, 1)
	b1.refresh(identity(2), []float64{1, 1}, active, r)
	busy = 0
	for i := 0; i < picks; i++ {
		if b1.pick(active, r) == 0 {
			busy++
		}
	}
	if share := float64(busy) / picks; math.Abs(share-0.5) > 0.01 {
		t.Fatalf("choice_count 1: busy host picked %.3f, want 0.5", share)
	}
}

func TestBalancer_WeightedLeastRequestDividesWeightByActivePlusOne(t *testing.T) {
	// Equal-weight hosts would use P2C, so use weights 2 and 1. With host 0 holding 3 active
	// requests its effective weight is 2/(3+1) = 0.5 against host 1's 1/(0+1) = 1: host 1 must get
	// two thirds of the picks while the active counts stay as they are.
	for _, tc := range []struct {
		bias      float64
		wantShare float64 // share of host 0
	}{
		{bias: 1, wantShare: 0.5 / 1.5},
		{bias: 0, wantShare: 2.0 / 3},                                  // bias 0: plain weights
		{bias: 2, wantShare: (2.0 / 16) / (2.0/16 + 1)},                // 2/(4^2) vs 1
		{bias: 0.5, wantShare: (2.0 / 2) / (2.0/2 + 1.0/math.Sqrt(1))}, // 2/√4 vs 1
	} {
		b := newBalancer(LBLeastRequest, 2, tc.bias)
		active := []int32{3, 0}
		r := rand.New(rand.NewSource(3))
		b.refresh(identity(2), []float64{2, 1}, active, r)
		picks, host0 := 90_000, 0
		for i := 0; i < picks; i++ {
			if b.pick(active, r) == 0 {
				host0++
			}
		}
		if got := float64(host0) / float64(picks); math.Abs(got-tc.wantShare) > 0.01 {
			t.Errorf("bias %v: host 0 share %.4f, want %.4f", tc.bias, got, tc.wantShare)
		}
	}
}

func TestBalancer_RandomIgnoresWeightsAndLoad(t *testing.T) {
	b := newBalancer(LBRandom, 2, 1)
	active := []int32{9, 0, 0}
	r := rand.New(rand.NewSource(4))
	b.refresh(identity(3), []float64{10, 1, 1}, active, r)
	counts := make([]int, 3)
	const picks = 90_000
	for i := 0; i < picks; i++ {
		counts[b.pick(active, r)]++
	}
	for h, c := range counts {
		if share := float64(c) / picks; math.Abs(share-1.0/3) > 0.01 {
			t.Errorf("host %d share %.4f, want 1/3", h, share)
		}
	}
}

func identity(n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(i)
	}
	return ids
}

// ORCA rebuilds every worker's schedule each second, and a worker may pick only a dozen times in
// between. Each rebuild starts deep inside the schedule (Envoy's createWithPicks with a random
// seed per balancer), so across workers the short horizons still follow the weights; starting
// near the head of a fresh schedule would over-serve the light hosts.
func TestBalancer_ShortHorizonsAfterRebuildsFollowTheWeights(t *testing.T) {
	weights := []float64{100, 100, 100, 100, 70, 70, 70, 70, 45, 45, 45, 45}
	active := make([]int32, len(weights))
	r := rand.New(rand.NewSource(7))
	counts := make([]int, len(weights))
	const workers, rebuilds, picksBetween = 60, 200, 12
	for range workers {
		b := newBalancer(LBRoundRobin, 2, 1)
		for range rebuilds {
			b.refresh(identity(len(weights)), weights, active, r)
			for range picksBetween {
				counts[b.pick(active, r)]++
			}
		}
	}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	const picks = workers * rebuilds * picksBetween
	for h, w := range weights {
		want := w / total
		if got := float64(counts[h]) / picks; math.Abs(got-want) > 0.1*want {
			t.Errorf("host %d (weight %v): share %.4f, want %.4f ±10%%", h, w, got, want)
		}
	}
}
