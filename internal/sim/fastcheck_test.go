package sim

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func suiteScenario(t *testing.T, name string) *Scenario {
	t.Helper()
	sc, err := LoadScenarioFile(filepath.Join("..", "..", "bench", "scenarios", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// The check between cycles relieves a pod that a neighbour slows down within seconds of the TSDB
// holding its newest scrape, where the cycle alone waits for its window.
func TestRun_TheCheckBetweenCyclesRelievesASlowedPodBeforeTheCycleWould(t *testing.T) {
	sc := suiteScenario(t, "noisy-neighbour")
	sc.Duration.Duration = 300 * time.Second
	with, err := Run(sc, PolicyTail, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(with.Reactions) != 1 || with.Reactions[0].Group != "victim" || with.Reactions[0].AtS != 200 {
		t.Fatalf("reactions %+v, want the victim's slowdown at 200 s", with.Reactions)
	}
	first := with.Reactions[0].CutAfterS
	if first < 0 || first > 30 {
		t.Fatalf("the victim's weight was first cut %.0f s after it slowed down, want within 30 s (two scrapes and a check)", first)
	}
	relief := ""
	for _, w := range with.Weights {
		if w.TimeS > 200 && w.Relief != "" {
			relief = w.Relief
			break
		}
	}
	if with.Reliefs == 0 || !strings.Contains(relief, "victim-0") {
		t.Fatalf("%d reliefs, the first after the slowdown %q: want one naming victim-0", with.Reliefs, relief)
	}
	sc.Controller.FastCheckInterval = &Duration{0}
	without, err := Run(sc, PolicyTail, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if without.Reliefs != 0 {
		t.Fatalf("%d reliefs with the check off", without.Reliefs)
	}
	if cut := without.Reactions[0].CutAfterS; cut >= 0 && cut <= first {
		t.Fatalf("without the check the victim was cut after %.0f s, with it after %.0f s: the check must be the faster", cut, first)
	}
}

// A steady fleet gives the check nothing to relieve: a fail-safe that fires on a healthy Service
// costs it its split and a push.
func TestRun_TheCheckBetweenCyclesLeavesASteadyFleetAlone(t *testing.T) {
	for _, name := range []string{"three-gens-60", "two-generations", "mixed-group"} {
		for _, policy := range []string{PolicyTail, PolicyCapacity} {
			r, err := Run(suiteScenario(t, name), policy, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Reliefs != 0 {
				t.Errorf("%s under %s: %d reliefs on a steady fleet", name, policy, r.Reliefs)
			}
		}
	}
}

func TestRun_TheSurgeBoundComesFromTheScenariosHistory(t *testing.T) {
	cases := []struct {
		history string
		want    func(f float64) bool
		why     string
	}{
		{HistoryNone, func(f float64) bool { return f == 4 }, "no load history"},
		{HistorySteady, func(f float64) bool { return f == 1 }, "no surge bound"},
		{HistorySame, func(f float64) bool { return f > 4 }, "rose up to"},
	}
	for _, c := range cases {
		sc, err := ParseScenario([]byte(`
name: crowd
duration: 150s
warmup: 30s
seed: 1
load: {rps: 100, phases: [{at: 100s, rps: 500}], history: `+c.history+`}
clients: {proxies: 4, workers: 2}
pods:
  - {name: fast, replicas: 2, workers: 4, cpu_limit: 2, cost: {mean: 4ms, dist: exponential}}
  - {name: slow, replicas: 2, workers: 4, cpu_limit: 2, speed: 0.5, cost: {mean: 4ms, dist: exponential}}
`), "crowd.yaml")
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(sc, PolicyTail, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Surge == nil || !c.want(r.Surge.Factor) || !strings.Contains(r.Surge.Reason, c.why) {
			t.Errorf("history %s: surge bound %+v", c.history, r.Surge)
		}
	}
	r, err := Run(suiteScenario(t, "three-gens-60"), PolicyCapacity, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Surge != nil {
		t.Fatalf("capacity reported a surge bound %+v; it has none", r.Surge)
	}
}

func TestParseScenario_RejectsABadHistoryOrCheck(t *testing.T) {
	for _, c := range []struct{ yaml, field string }{
		{"load: {rps: 10, history: yesterday}", "load.history"},
		{"controller: {interval: 30s, fast_check_interval: 30s}", "controller.fast_check_interval"},
		{"controller: {interval: 30s, fast_check_interval: 500ms}", "controller.fast_check_interval"},
		{"controller: {interval: 30s, fast_check_window: 5s}", "controller.fast_check_window"},
		{"controller: {interval: 30s, metrics: {query_latency_offset: -1s}}", "controller.metrics.query_latency_offset"},
	} {
		src := "name: x\nduration: 60s\nseed: 1\npods: [{name: a, replicas: 1}]\n"
		if !strings.HasPrefix(c.yaml, "load") {
			src += "load: {rps: 10}\n"
		}
		_, err := ParseScenario([]byte(src+c.yaml+"\n"), "bad.yaml")
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v, want one naming %s", c.yaml, err, c.field)
		}
	}
}
