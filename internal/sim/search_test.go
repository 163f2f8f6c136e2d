package sim

import (
	"testing"
)

func TestSearchStatic_FindsASplitBeyondCapacityWhenSlowPodsHurtTheTail(t *testing.T) {
	// One fast pod and two pods a fifth as fast at 30% of the fleet's capacity: the fast pod alone
	// could serve it all, and every request sent to a slow pod takes five times as long, so the
	// best static split gives the slow pods far less than their capacity share.
	sc, err := ParseScenario([]byte(`
name: search
duration: 60s
warmup: 10s
seed: 3
load: {rps: 42}
clients: {proxies: 4, workers: 1, lb: least_request}
pods:
  - {name: fast, replicas: 1, workers: 4, cores: 4, cpu_limit: 1, cost: {mean: 10ms, dist: exponential}}
  - {name: slow, replicas: 2, workers: 4, cores: 4, cpu_limit: 1, speed: 0.2, cost: {mean: 10ms, dist: exponential}}
  - {name: slow-too, replicas: 1, workers: 4, cores: 4, cpu_limit: 1, speed: 0.2, cost: {mean: 10ms, dist: exponential}}
`), "search")
	if err != nil {
		t.Fatal(err)
	}
	oracle, err := Run(sc, PolicyOracle, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := SearchStatic(sc, SearchOptions{MaxRuns: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("search: %+v; oracle p99 %.1f ms", *got, oracle.Latency.P99)
	if got.AlphaFrom != 0 || got.AlphaTo < 12 {
		t.Errorf("swept α %v–%v, want from 0 to at least 12", got.AlphaFrom, got.AlphaTo)
	}
	if got.Alpha <= 1 {
		t.Errorf("best α %v, want above 1 (beyond the capacity split)", got.Alpha)
	}
	if got.Weights["slow"] != got.Weights["slow-too"] {
		t.Errorf("groups of equal capacity got %d and %d, want one weight for both", got.Weights["slow"], got.Weights["slow-too"])
	}
	if ratio := float64(got.Weights["fast"]) / float64(got.Weights["slow"]); ratio <= 5 {
		t.Errorf("fast:slow weight ratio %.1f, want beyond the capacity ratio of 5 (weights %v)", ratio, got.Weights)
	}
	if got.P99 > got.AlphaP99 || got.AlphaP99 >= oracle.Latency.P99 {
		t.Errorf("p99: best %.1f, best α %.1f, oracle %.1f ms; want best ≤ best α < oracle", got.P99, got.AlphaP99, oracle.Latency.P99)
	}
	if got.Runs > 30 {
		t.Errorf("%d runs, over the budget of 30", got.Runs)
	}
}
