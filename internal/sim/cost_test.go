package sim

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

func TestGammaQuantile_MatchesKnownValues(t *testing.T) {
	cases := []struct {
		shape, u, want float64
	}{
		{1, 0.5, math.Ln2},                // exponential: ln 2
		{0.5, 0.5, 0.454936423119572 / 2}, // χ²(1)/2: the median of χ²(1) over 2
		{2, 0.5, 1.678346990016661},       // Erlang-2 median
		{2, 0.99, 6.638352067691},         // Erlang-2 p99
		// Shapes 25 (CV 0.2) and 0.25 (CV 2): the p99 of 2,000,000 draws of Python's
		// random.gammavariate (Marsaglia–Tsang and Ahrens–Dieter, not an inversion).
		{25, 0.99, 38.068},
		{0.25, 0.99, 2.4411},
	}
	for _, tc := range cases {
		tab := gammaTable(tc.shape)
		got := tab.at(-math.Log(1 - tc.u))
		if math.Abs(got/tc.want-1) > 5e-3 {
			t.Errorf("gamma(%v) quantile at %v: %.6f, want %.6f", tc.shape, tc.u, got, tc.want)
		}
	}
}

// sampleCost draws n costs from c through the simulator's own sampler, with the normal
// quantile worked out as the run does.
func sampleCost(t *testing.T, c Cost, n int) (mean, cv float64, xs []float64) {
	t.Helper()
	cs := newCostSampler(c)
	rng := rand.New(rand.NewSource(3))
	sum, sum2 := 0.0, 0.0
	for range n {
		u := rng.Float64()
		z := 0.0
		if cs.usesNormalQuantile() {
			z = normalQuantile(u)
		}
		x := cs.cost(u, z)
		xs = append(xs, x)
		sum += x
		sum2 += x * x
	}
	mean = sum / float64(n)
	return mean, math.Sqrt(sum2/float64(n)-mean*mean) / mean, xs
}

func TestCostSampler_EachFamilyHasItsMeanAndVariability(t *testing.T) {
	ms := func(f float64) Duration { return Duration{time.Duration(f * float64(time.Millisecond))} }
	cases := []struct {
		name   string
		cost   Cost
		wantCV float64
	}{
		{"exponential", Cost{Mean: ms(5), Dist: CostExponential}, 1},
		{"lognormal", Cost{Mean: ms(5), Dist: CostLognormal, CV: 0.6}, 0.6},
		{"gamma narrow", Cost{Mean: ms(5), Dist: CostGamma, CV: 0.3}, 0.3},
		{"gamma wide", Cost{Mean: ms(5), Dist: CostGamma, CV: 1.8}, 1.8},
		// A cache: 80% hits at 1 ms (CV 0.3), 20% misses at 21 ms (exponential); mean 5 ms.
		// Variance: 0.8·(1 + 0.09) + 0.2·2·21² − 25 = 152.27, CV √152.27 / 5 = 2.468.
		{"mixture", Cost{Mean: ms(5), Dist: CostMixture, Parts: []CostPart{
			{Share: 0.8, Mean: ms(1), Dist: CostGamma, CV: 0.3},
			{Share: 0.2, Mean: ms(21), Dist: CostExponential},
		}}, 2.468},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mean, cv, _ := sampleCost(t, tc.cost, 400_000)
			if math.Abs(mean/tc.cost.Mean.Seconds()-1) > 0.02 {
				t.Errorf("mean %.4f ms, want %.4f ms", 1000*mean, 1000*tc.cost.Mean.Seconds())
			}
			if math.Abs(cv/tc.wantCV-1) > 0.04 {
				t.Errorf("CV %.3f, want %.3f", cv, tc.wantCV)
			}
		})
	}
}

func TestCostSampler_AMixtureDrawsEachPartInItsShare(t *testing.T) {
	ms := func(f float64) Duration { return Duration{time.Duration(f * float64(time.Millisecond))} }
	c := Cost{Mean: ms(3.7), Dist: CostMixture, Parts: []CostPart{
		{Share: 0.9, Mean: ms(1), Dist: CostConstant},
		{Share: 0.1, Mean: ms(28), Dist: CostConstant},
	}}
	_, _, xs := sampleCost(t, c, 100_000)
	misses := 0
	for _, x := range xs {
		if x > 0.01 {
			misses++
		}
	}
	if share := float64(misses) / float64(len(xs)); math.Abs(share-0.1) > 0.005 {
		t.Errorf("%.3f of the requests drew the 28 ms part, want 0.1", share)
	}
}

func TestParseScenario_AMixtureWithoutAMeanTakesItsParts(t *testing.T) {
	sc, err := ParseScenario([]byte(`
name: cache
duration: 60s
warmup: 10s
load: {rps: 100}
pods:
  - {name: a, replicas: 2, workers: 2, cost: {dist: mixture, parts: [{share: 0.75, mean: 2ms, dist: gamma, cv: 0.5}, {share: 0.25, mean: 10ms, dist: lognormal, cv: 0.4}]}}
`), "cache.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := sc.Pods[0].Cost.Mean.Duration; got != 4*time.Millisecond {
		t.Errorf("mean %v, want the parts' 4ms", got)
	}
}

func TestCost_CDFAgreesWithTheDraws(t *testing.T) {
	ms := func(f float64) Duration { return Duration{time.Duration(f * float64(time.Millisecond))} }
	costs := []Cost{
		{Mean: ms(5), Dist: CostExponential},
		{Mean: ms(5), Dist: CostLognormal, CV: 1.2},
		{Mean: ms(5), Dist: CostGamma, CV: 0.5},
		{Mean: ms(5), Dist: CostMixture, Parts: []CostPart{{Share: 0.85, Mean: ms(2), Dist: CostGamma, CV: 0.4}, {Share: 0.15, Mean: ms(22), Dist: CostLognormal, CV: 0.5}}},
	}
	for _, c := range costs {
		_, _, xs := sampleCost(t, c, 200_000)
		for _, at := range []float64{0.001, 0.003, 0.005, 0.01, 0.02, 0.04} {
			below := 0
			for _, x := range xs {
				if x <= at {
					below++
				}
			}
			if got, want := float64(below)/float64(len(xs)), c.CDF(at); math.Abs(got-want) > 0.005 {
				t.Errorf("%s: P(cost ≤ %v s) drawn %.4f, CDF %.4f", c.Dist, at, got, want)
			}
		}
	}
}
