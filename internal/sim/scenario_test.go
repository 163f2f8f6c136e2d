package sim

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const validScenario = `
name: ok
duration: 60s
warmup: 10s
load: {rps: 100}
pods:
  - {name: a, replicas: 2, workers: 2, cost: {mean: 5ms, dist: exponential}}
`

func TestParseScenario_RejectsBadInputWithFieldAndAllowedValues(t *testing.T) {
	cases := map[string]struct {
		yaml      string
		wantField string
		wantMsg   string
	}{
		"an unknown field is named": {
			yaml:    strings.Replace(validScenario, "load:", "lod: {rps: 1}\nload:", 1),
			wantMsg: `unknown field "lod"`,
		},
		"negative rps": {
			yaml:      strings.Replace(validScenario, "rps: 100", "rps: -5", 1),
			wantField: "load.rps", wantMsg: "-5 must be a positive request rate",
		},
		"zero pods": {
			yaml:      strings.Replace(validScenario, "replicas: 2", "replicas: 0", 1),
			wantField: "pods", wantMsg: "zero replicas in total",
		},
		"no pod groups at all": {
			yaml:      "name: x\nduration: 60s\nload: {rps: 1}\n",
			wantField: "pods", wantMsg: "at least one pod group is required",
		},
		"duration shorter than warm-up": {
			yaml:      strings.Replace(validScenario, "warmup: 10s", "warmup: 90s", 1),
			wantField: "warmup", wantMsg: "shorter than duration 1m0s",
		},
		"unknown distribution": {
			yaml:      strings.Replace(validScenario, "dist: exponential", "dist: pareto", 1),
			wantField: "pods[0].cost.dist", wantMsg: `"pareto" is unknown; allowed: constant, exponential, lognormal`,
		},
		"unknown client policy": {
			yaml:      validScenario + "clients: {lb: maglev}\n",
			wantField: "clients.lb", wantMsg: `"maglev" is unknown; allowed: round_robin, random, least_request`,
		},
		"a bad duration string": {
			yaml:    strings.Replace(validScenario, "duration: 60s", "duration: soon", 1),
			wantMsg: `want a duration such as "600s" or "2ms", got "soon"`,
		},
		"an event must set exactly one change": {
			yaml:      strings.Replace(validScenario, "dist: exponential}}", "dist: exponential}, events: [{at: 5s}]}", 1),
			wantField: "pods[0].events[0]", wantMsg: "set exactly one of speed, replicas or restart_every",
		},
		"lognormal needs a cv": {
			yaml:      strings.Replace(validScenario, "dist: exponential", "dist: lognormal", 1),
			wantField: "pods[0].cost.cv", wantMsg: "0 must be above 0 and at most 5 for a lognormal cost",
		},
		"a gamma cost needs a cv": {
			yaml:      strings.Replace(validScenario, "dist: exponential", "dist: gamma", 1),
			wantField: "pods[0].cost.cv", wantMsg: "for a gamma cost",
		},
		"an exponential cost with a cv": {
			yaml:      strings.Replace(validScenario, "dist: exponential", "dist: exponential, cv: 0.5", 1),
			wantField: "pods[0].cost.cv", wantMsg: "the exponential family's CV is fixed (remove cv)",
		},
		"a mixture of one part": {
			yaml:      strings.Replace(validScenario, "{mean: 5ms, dist: exponential}", "{dist: mixture, parts: [{share: 1, mean: 2ms, dist: exponential}]}", 1),
			wantField: "pods[0].cost.parts", wantMsg: "a mixture needs 2 to 4 parts",
		},
		"a mixture whose shares do not add up to 1": {
			yaml:      strings.Replace(validScenario, "{mean: 5ms, dist: exponential}", "{dist: mixture, parts: [{share: 0.5, mean: 1ms, dist: exponential}, {share: 0.4, mean: 9ms, dist: exponential}]}", 1),
			wantField: "pods[0].cost.parts", wantMsg: "the shares add up to 0.9; they must add up to 1",
		},
		"a mixture part of an unknown family": {
			yaml:      strings.Replace(validScenario, "{mean: 5ms, dist: exponential}", "{dist: mixture, parts: [{share: 0.5, mean: 1ms, dist: mixture}, {share: 0.5, mean: 9ms, dist: exponential}]}", 1),
			wantField: "pods[0].cost.parts[0].dist", wantMsg: `"mixture" is unknown here; allowed: constant, exponential, lognormal, gamma`,
		},
		"a mixture whose mean disagrees with its parts": {
			yaml:      strings.Replace(validScenario, "{mean: 5ms, dist: exponential}", "{mean: 3ms, dist: mixture, parts: [{share: 0.5, mean: 1ms, dist: exponential}, {share: 0.5, mean: 9ms, dist: lognormal, cv: 0.5}]}", 1),
			wantField: "pods[0].cost.mean", wantMsg: "3ms disagrees with the parts' mean 5ms",
		},
		"parts without a mixture": {
			yaml:      strings.Replace(validScenario, "{mean: 5ms, dist: exponential}", "{mean: 2ms, dist: exponential, parts: [{share: 0.5, mean: 1ms, dist: exponential}, {share: 0.5, mean: 3ms, dist: exponential}]}", 1),
			wantField: "pods[0].cost.parts", wantMsg: `are for dist: mixture only (dist is "exponential")`,
		},
		"a negative probe round trip": {
			yaml:      validScenario + "clients: {probe_rtt: -2ms}\n",
			wantField: "clients.probe_rtt", wantMsg: "-2ms must not be negative",
		},
		"an empty file": {
			yaml: "  \n", wantMsg: "the file is empty",
		},
		"a scrape interval that is not whole seconds": {
			yaml:      validScenario + "controller: {metrics: {scrape_interval: 7500ms}}\n",
			wantField: "controller.metrics.scrape_interval", wantMsg: "7.5s must be a whole number of seconds",
		},
		"a scrape interval longer than the window": {
			yaml:      validScenario + "controller: {window: 20s, metrics: {scrape_interval: 30s}}\n",
			wantField: "controller.metrics.scrape_interval", wantMsg: "from 1s to the controller window 20s",
		},
		"a negative latency offset": {
			yaml:      validScenario + "controller: {metrics: {latency_offset: -30s}}\n",
			wantField: "controller.metrics.latency_offset", wantMsg: "-30s must be at least 0 (0s: the TSDB answers for the instant asked",
		},
		"a negative ingestion delay": {
			yaml:      validScenario + "controller: {metrics: {ingestion_delay: -1s}}\n",
			wantField: "controller.metrics.ingestion_delay", wantMsg: "-1s must be at least 0",
		},
		"an unknown metrics field": {
			yaml:    validScenario + "controller: {metrics: {scrape: 15s}}\n",
			wantMsg: `unknown field "scrape"`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseScenario([]byte(tc.yaml), "bad.yaml")
			var se *ScenarioError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a *ScenarioError", err)
			}
			if se.File != "bad.yaml" || se.Field != tc.wantField || !strings.Contains(se.Msg, tc.wantMsg) {
				t.Fatalf("got file %q field %q msg %q; want file bad.yaml field %q msg containing %q", se.File, se.Field, se.Msg, tc.wantField, tc.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "scenario bad.yaml: ") {
				t.Fatalf("message %q does not start by naming the file", err.Error())
			}
		})
	}
}

func TestParseScenario_FillsDefaults(t *testing.T) {
	sc, err := ParseScenario([]byte(validScenario), "ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Clients.LB != LBLeastRequest || sc.Clients.ChoiceCount != 2 || *sc.Clients.ActiveRequestBias != 1 {
		t.Fatalf("client defaults not Envoy's: %+v", sc.Clients)
	}
	if sc.Pods[0].Cores != 2 || sc.Pods[0].Speed != 1 {
		t.Fatalf("pod defaults: cores %v (want workers = 2), speed %v (want 1)", sc.Pods[0].Cores, sc.Pods[0].Speed)
	}
	if sc.Controller.Window.Duration != 2*sc.Controller.Interval.Duration {
		t.Fatalf("window default %v, want twice the interval", sc.Controller.Window.Duration)
	}
	if m := sc.Controller.Metrics; m.ScrapeInterval.Duration != 15*time.Second || m.LatencyOffset.Duration != 30*time.Second || m.QueryLatencyOffset.Duration != 0 || m.IngestionDelay.Duration != DefaultIngestionDelay {
		t.Fatalf("metrics defaults %v / %v / %v / %v, want a stock install's 15s scrape and 30s latency offset, adaptive-lb asking for the newest data, ingested %v after the scrape", m.ScrapeInterval, m.LatencyOffset, m.QueryLatencyOffset, m.IngestionDelay, DefaultIngestionDelay)
	}
	if c := sc.Controller; c.FastCheckInterval.Duration != 15*time.Second || c.FastCheckWindow.Duration != 30*time.Second {
		t.Fatalf("fast check defaults every %v over %v, want every scrape interval (15s) over two (30s)", c.FastCheckInterval, c.FastCheckWindow)
	}
	if sc.Load.History != HistorySame {
		t.Fatalf("load history default %q, want %q", sc.Load.History, HistorySame)
	}
}

func TestParseScenario_MetricsLag(t *testing.T) {
	parse := func(controller string) Metrics {
		t.Helper()
		sc, err := ParseScenario([]byte(validScenario+"controller: "+controller+"\n"), "lag.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return sc.Controller.Metrics
	}
	// A window shorter than a stock scrape predates the lag model: scrape once per window.
	if m := parse("{interval: 5s}"); m.ScrapeInterval.Duration != 10*time.Second {
		t.Fatalf("a 10s window scrapes every %v, want 10s", m.ScrapeInterval)
	}
	// A latency offset of 0 is kept, not replaced by the default: it is how lag is turned off.
	if m := parse("{metrics: {scrape_interval: 1s, latency_offset: 0s, ingestion_delay: 0s}}"); !m.Lagless() {
		t.Fatalf("scrape 1s and offset 0s read %+v, want no lag", m)
	}
	if m := parse("{metrics: {latency_offset: 5s}}"); m.Lagless() || m.LatencyOffset.Duration != 5*time.Second || m.ScrapeInterval.Duration != 15*time.Second {
		t.Fatalf("offset 5s alone read %+v, want it with the default 15s scrape", m)
	}
}

func TestBuiltin_SeedFibIsThePublishedFleet(t *testing.T) {
	sc, err := Builtin("seed-fib")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	total := 0
	for _, p := range sc.Pods {
		counts[p.Name] = p.Replicas
		total += p.Replicas
	}
	if total != 15 || counts["fib25"] != 3 || counts["fib26"] != 2 || counts["fib27"] != 9 || counts["fib29"] != 1 {
		t.Fatalf("seed-fib fleet %v, want 3×fib25, 2×fib26, 9×fib27, 1×fib29", counts)
	}
	if sc.Load.RPS != 1500 || sc.Clients.LB != LBLeastRequest {
		t.Fatalf("seed-fib load %v rps on %s, want 1500 on least_request", sc.Load.RPS, sc.Clients.LB)
	}
	// Costs grow with φ^n, as fib(n)'s work does.
	phi := (1 + 2.2360679775) / 2
	r := sc.Pods[3].Cost.Mean.Seconds() / sc.Pods[0].Cost.Mean.Seconds()
	if want := phi * phi * phi * phi; r < want*0.99 || r > want*1.01 {
		t.Fatalf("fib29/fib25 cost ratio %.3f, want φ⁴ = %.3f", r, want)
	}
	if _, err := Builtin("nope"); err == nil || !strings.Contains(err.Error(), "built-in scenarios are [seed-fib]") {
		t.Fatalf("unknown built-in: err = %v", err)
	}
}
