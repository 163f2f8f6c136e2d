package whatif

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// histogramOf builds a histogram over Istio's default buckets with n requests spread as shares.
func histogramOf(n float64, shares map[float64]float64) sim.Histogram {
	bounds := append(sim.IstioBucketsMS(), math.Inf(1))
	h := sim.Histogram{BoundsMS: bounds, Cumulative: make([]float64, len(bounds))}
	cum := 0.0
	for i, b := range bounds {
		cum += n * shares[b]
		h.Cumulative[i] = cum
	}
	return h
}

// measuredPod is a pod measured over a 10-minute window in 30 s steps, with a CPU limit of 1 and
// 4 node CPUs from kube-state-metrics.
func measuredPod(name string, rps, cpu float64) PodMeasurement {
	rates := make([]float64, 20)
	for i := range rates {
		rates[i] = rps
	}
	return PodMeasurement{Name: name, CPUCores: cpu, RequestRate: rps, Coverage: 1, Rates: rates,
		Latency:  histogramOf(rps*600, map[float64]float64{5: 0.2, 10: 0.5, 25: 0.29, 50: 0.01}),
		CPULimit: 1, HasCPULimit: true, CPULimitOrigin: FromKubeStateMetrics, NodeCores: 4, NodeCoresOrigin: FromKubeStateMetrics}
}

func measurements(pods ...PodMeasurement) *Measurements {
	from := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	load := make([]float64, 20)
	for i := range load {
		for _, p := range pods {
			load[i] += p.RequestRate
		}
	}
	m := &Measurements{Namespace: "shop", Service: "web", From: from, To: from.Add(10 * time.Minute), Step: 30 * time.Second, Load: load, Pods: pods}
	for _, p := range pods {
		m.ServerLatency = m.ServerLatency.Add(p.Latency)
	}
	m.ServerLatency.SumMS = m.ServerLatency.Count() * 10
	m.Clients = ClientMeasurement{Proxies: 10, LB: sim.LBLeastRequest, LBOrigin: Assumed, Latency: m.ServerLatency}
	m.Clients.Latency.SumMS = m.ServerLatency.Count() * 12
	return m
}

func TestFit_GroupsPodsByCostPerRequestLikeTheTailAlgorithm(t *testing.T) {
	m := measurements(
		measuredPod("web-a", 50, 0.50),      // 10 ms per request
		measuredPod("web-b", 50, 0.55),      // 11 ms: within 20% of 10 ms
		measuredPod("web-c", 50, 0.59),      // 11.8 ms: still within 20% of the cheapest
		measuredPod("web-d", 20, 0.50),      // 25 ms: a group of its own
		measuredPod("web-e", 0, math.NaN()), // no requests: joins the largest group of its shape
	)
	md, err := Fit(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Groups) != 2 {
		t.Fatalf("%d groups, want 2: %+v", len(md.Groups), md.Groups)
	}
	fast, slow := md.Groups[0], md.Groups[1]
	if got := strings.Join(fast.Pods, ","); got != "web-a,web-b,web-c,web-e" {
		t.Errorf("first group holds %s, want web-a,web-b,web-c and the unmeasured web-e", got)
	}
	if want := 1.64 / 150; math.Abs(fast.CostSeconds-want) > 1e-9 {
		t.Errorf("first group's cost %v s, want its CPU over its requests %v s", fast.CostSeconds, want)
	}
	if want := fast.CostSeconds / 0.025; math.Abs(slow.Speed-want) > 1e-9 {
		t.Errorf("second group's speed %v, want %v", slow.Speed, want)
	}
	if fast.Replicas != 4 || slow.Replicas != 1 {
		t.Errorf("replicas %d and %d, want 4 and 1", fast.Replicas, slow.Replicas)
	}
	// Pod names share the stem "web", so the groups are named by rank.
	if fast.Name != "group-1" || slow.Name != "group-2" {
		t.Errorf("group names %q and %q, want group-1 and group-2", fast.Name, slow.Name)
	}
	if md.Scenario.Clients.NetworkLatency.Duration != 2*time.Millisecond {
		t.Errorf("network latency %v, want the client mean minus the server mean, 2ms", md.Scenario.Clients.NetworkLatency.Duration)
	}
	if !strings.Contains(strings.Join(md.Notes, "\n"), "web-e served no measurable requests or has no CPU series; it counts in group group-1") {
		t.Errorf("notes do not say where the unmeasured pod went: %q", md.Notes)
	}
}

func TestFit_UnknownFactsAreRefusedOrStatedAsAssumed(t *testing.T) {
	noLimit := measuredPod("web-a", 50, 0.5)
	noLimit.CPULimitOrigin, noLimit.HasCPULimit = "", false
	if _, err := Fit(measurements(noLimit, measuredPod("web-b", 50, 0.5)), Options{}); !errors.Is(err, ErrNoCPULimits) || !strings.Contains(err.Error(), "the CPU limits of web-a (1 of 2 pods") {
		t.Errorf("an unknown CPU limit: %v", err)
	}
	unlimited := measuredPod("web-a", 50, 0.5)
	unlimited.HasCPULimit, unlimited.CPULimitOrigin, unlimited.NodeCoresOrigin = false, FromCluster, ""
	if _, err := Fit(measurements(unlimited), Options{}); !errors.Is(err, ErrNoCPULimits) || !strings.Contains(err.Error(), "run without a CPU limit and the CPU counts of their nodes are unknown") {
		t.Errorf("no limit and no node: %v", err)
	}
	noNode := measuredPod("web-a", 50, 0.5)
	noNode.NodeCoresOrigin = ""
	md, err := Fit(measurements(noNode), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if md.Groups[0].Cores != 4 || !strings.Contains(strings.Join(md.Assumptions, "\n"), "the nodes of web-a have 4× their CPU limit in CPUs") {
		t.Errorf("unknown node: %v cores, assumptions %q", md.Groups[0].Cores, md.Assumptions)
	}
	if !strings.Contains(string(md.YAML), "cores: 4") || !strings.Contains(string(md.YAML), "# assumed: 4× the CPU limit (the node is unknown)") {
		t.Errorf("the scenario does not say the node CPUs were assumed:\n%s", md.YAML)
	}
}

func TestFit_CurrentWeightsAreTheGroupsMedians(t *testing.T) {
	m := measurements(measuredPod("fast-0", 60, 0.6), measuredPod("fast-1", 60, 0.6), measuredPod("fast-2", 60, 0.6), measuredPod("slow-0", 20, 0.6))
	m.CurrentWeights = map[string]int{"fast-0": 100, "fast-1": 90, "fast-2": 120, "slow-0": 7}
	md, err := Fit(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"fast": 100, "slow": 7}
	if md.Current.Name != PolicyCurrentWeights || md.Current.StaticWeights["fast"] != want["fast"] || md.Current.StaticWeights["slow"] != want["slow"] {
		t.Fatalf("current policy %+v, want current weights %v", md.Current, want)
	}
}

func TestFit_WrittenScenarioIsTheOneSimulated(t *testing.T) {
	md, err := Fit(measurements(measuredPod("a-0", 50, 0.5), measuredPod("b-0", 20, 0.5)), Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	again, err := sim.ParseScenario(md.YAML, "again")
	if err != nil {
		t.Fatal(err)
	}
	if again.Seed != 7 || again.Duration != md.Scenario.Duration || len(again.Pods) != 2 || again.Pods[1].Speed != md.Scenario.Pods[1].Speed {
		t.Fatalf("the written scenario differs from the simulated one")
	}
	if md.Scenario.Warmup.Duration != DefaultWarmup || md.Scenario.Duration.Duration != DefaultWarmup+10*time.Minute {
		t.Errorf("warm-up %v and duration %v, want %v and the window after it", md.Scenario.Warmup.Duration, md.Scenario.Duration.Duration, DefaultWarmup)
	}
	if n := len(md.Scenario.Load.Phases); n != 19 {
		t.Errorf("%d load phases, want one per 30 s step after the first (19)", n)
	}
}

func TestQuantile_InterpolatesAsHistogramQuantileDoes(t *testing.T) {
	// 100 requests: 50 up to 10 ms, 40 in (10, 25], 10 in (25, 50].
	h := histogramOf(100, map[float64]float64{10: 0.5, 25: 0.4, 50: 0.1})
	cases := map[string]struct{ q, want float64 }{
		"the median, at a bucket's top": {0.5, 10},
		"p90, at the next bucket's top": {0.9, 25},
		"p99, inside the last bucket":   {0.99, 25 + 25*0.9},
		"p70, inside a bucket":          {0.7, 10 + 15*0.5},
	}
	for name, tc := range cases {
		if got := quantile(h, tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v ms, want %v", name, got, tc.want)
		}
	}
	if !math.IsNaN(quantile(sim.Histogram{}, 0.99)) {
		t.Error("an empty histogram has a p99")
	}
	lo, hi := quantileBand(h, 0.99)
	if !(lo < quantile(h, 0.99) && quantile(h, 0.99) <= hi) {
		t.Errorf("band %v – %v does not hold the p99 %v", lo, hi, quantile(h, 0.99))
	}
}

func TestDefaultStep(t *testing.T) {
	for length, want := range map[time.Duration]time.Duration{
		10 * time.Minute: 30 * time.Second,
		time.Hour:        30 * time.Second,
		2 * time.Hour:    time.Minute,
		24 * time.Hour:   12 * time.Minute,
		90 * time.Minute: 45 * time.Second,
	} {
		if got := DefaultStep(length); got != want {
			t.Errorf("DefaultStep(%v) = %v, want %v", length, got, want)
		}
	}
}

func TestNum_NeverWritesAnExponent(t *testing.T) {
	for in, want := range map[float64]string{0.1003: "0.1003", 12345: "12350", 0.000012345: "0.00001235", 1: "1", 0: "0"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}
