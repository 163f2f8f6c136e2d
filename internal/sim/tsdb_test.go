package sim

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// lagScenario is one pod whose load steps from 100 to 400 rps at 100 s, under constant
// arrivals, read through the given controller interval and metrics setting.
func lagScenario(t *testing.T, interval time.Duration, metrics string, events string) *Scenario {
	t.Helper()
	if !strings.Contains(metrics, "ingestion_delay") {
		// These tests are about the offset and the scrapes: samples searchable at once.
		metrics = strings.Replace(metrics, "{", "{ingestion_delay: 0s, ", 1)
	}
	src := `
name: lag
duration: 160s
warmup: 10s
seed: 7
load: {rps: 100, arrival: constant, phases: [{at: 100s, rps: 400}]}
clients: {proxies: 2, workers: 1}
controller: {interval: ` + interval.String() + `, window: 20s, apply_delay: 0s, metrics: ` + metrics + `}
pods:
  - {name: web, replicas: 1, workers: 4, cpu_limit: 2, cost: {mean: 1ms, dist: constant}` + events + `}
`
	sc, err := ParseScenario([]byte(src), "lag.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// inputs runs the cpu-distance controller on sc (its weights barely move, so the pods' shares
// stay even) and returns every cycle's engine input by time.
func inputs(t *testing.T, sc *Scenario) map[float64]weights.Input {
	t.Helper()
	seen := map[float64]weights.Input{}
	if _, err := Run(sc, PolicyCPUDistance, Options{seeInput: func(at float64, in weights.Input) { seen[at] = in }}); err != nil {
		t.Fatal(err)
	}
	return seen
}

// latestScrape is the last scrape of pod id's sidecar at or before t, every 5 s.
func latestScrape(sc *Scenario, id int32, t float64) float64 {
	phase := float64((&simulation{sc: sc}).scrapePhase(id, jobSidecar))
	return phase + math.Floor((t-phase)/5)*5
}

// stepRate is what rate() over samples at base and last gives for the load step at 100 s.
func stepRate(base, last float64) float64 {
	return (100*(math.Max(0, math.Min(last, 100)-base)) + 400*math.Max(0, last-100)) / (last - base)
}

func TestObserve_LoadStepReachesTheEngineOnlyAfterTheOffsetAndTheNextScrape(t *testing.T) {
	// The step is in the samples scraped after 100 s; the first of them is visible at the
	// cycle at 120 s exactly when the query is evaluated at or after it.
	probe := lagScenario(t, 15*time.Second, "{scrape_interval: 5s, latency_offset: 0s}", "")
	first := latestScrape(probe, 0, 100) + 5
	for _, c := range []struct {
		offset  float64
		visible bool
	}{{offset: 120 - first, visible: true}, {offset: 120 - first + 1, visible: false}} {
		sc := lagScenario(t, 15*time.Second, fmt.Sprintf("{scrape_interval: 5s, latency_offset: %gs}", c.offset), "")
		ep := inputs(t, sc)[120].Endpoints[0]
		if !ep.HasMetrics {
			t.Fatalf("offset %gs: no metrics at 120 s", c.offset)
		}
		want := 100.0
		if c.visible {
			want = stepRate(first-20, first)
		}
		if math.Abs(ep.RequestRate-want) > 1.5 {
			t.Fatalf("offset %gs (first scrape after the step at %.0f s): the cycle at 120 s saw %.1f rps, want %.1f", c.offset, first, ep.RequestRate, want)
		}
	}
}

// rate() over the samples must be VictoriaMetrics': from the sample before the window to the
// last one inside it, on the pod's scrape phase, without extrapolation.
func TestObserve_RateRunsFromTheSampleBeforeTheWindowToTheLastInside(t *testing.T) {
	sc := lagScenario(t, 15*time.Second, "{scrape_interval: 5s, latency_offset: 15s}", "")
	// At 120 s the query is evaluated at 105 s over (85, 105].
	base, last := latestScrape(sc, 0, 85), latestScrape(sc, 0, 105)
	if got, want := inputs(t, sc)[120].Endpoints[0].RequestRate, stepRate(base, last); math.Abs(got-want) > 1.5 {
		t.Fatalf("rate at 120 s %.2f rps, want %.2f (samples at %.0f and %.0f s)", got, want, base, last)
	}
	// Without lag, the cycle at 105 s reads (85, 105] from samples every second.
	sc = lagScenario(t, 15*time.Second, "{scrape_interval: 1s, latency_offset: 0s}", "")
	if got, want := inputs(t, sc)[105].Endpoints[0].RequestRate, stepRate(85, 105); math.Abs(got-want) > 1.5 {
		t.Fatalf("without lag the rate at 105 s is %.2f rps, want %.2f", got, want)
	}
}

func TestObserve_NewPodHasMetricsOnlyOnceScrapedAndHalfTheWindowIn(t *testing.T) {
	// With a 5 s interval the operator accepts samples up to 10 s old: a 5 s offset and a 5 s
	// scrape stay within it. The pod born at 55 s counts once it spent half the 20 s window,
	// evaluated 5 s in the past, in the host set: from 55 + 5 + 10 = 70 s. By then its first
	// two scrapes, at most 60 and 65 s, are inside the evaluated window.
	sc := lagScenario(t, 5*time.Second, "{scrape_interval: 5s, latency_offset: 5s}", ", events: [{at: 55s, replicas: 2}]")
	seen := inputs(t, sc)
	first := -1.0
	for at := 55.0; at <= 160; at += 5 {
		if eps := seen[at].Endpoints; len(eps) == 2 && eps[1].HasMetrics {
			first = at
			break
		}
	}
	if first != 70 {
		t.Fatalf("the pod born at 55 s first had metrics at %.0f s, want 70 s", first)
	}
	// Its series began inside the window (45, 65]: its rate runs from its own first sample, so
	// it is about the 50 rps it gets as one of two even pods, not diluted by the part of the
	// window before it existed (that would be about 50 × 10 / 20 = 25).
	if r := seen[first].Endpoints[1].RequestRate; math.Abs(r-50) > 7.5 {
		t.Fatalf("at %.0f s the new pod's rate is %.1f rps, want about 50", first, r)
	}
}

func TestObserve_StaleSamplesGiveNoMetrics(t *testing.T) {
	// With a 10 s interval the operator accepts samples up to 20 s old; a 30 s offset makes
	// every sample older than that.
	sc := lagScenario(t, 10*time.Second, "{scrape_interval: 5s, latency_offset: 30s}", "")
	seen := inputs(t, sc)
	for at, in := range seen {
		for _, ep := range in.Endpoints {
			if ep.HasMetrics {
				t.Fatalf("%s had metrics at %.0f s, though its newest sample was at least 30 s old (limit 20 s)", ep.ID, at)
			}
		}
	}
}

func TestWindowCoverage_CountsFromTheEvaluationTimeNotFromNow(t *testing.T) {
	sc := lagScenario(t, 30*time.Second, "{scrape_interval: 5s, latency_offset: 30s}", "")
	sc.Controller.Window.Duration = 60 * time.Second
	// The published operator's rule reads at the TSDB's latency offset, as every controller did
	// before adaptive-lb asked for the newest data.
	s := &simulation{sc: sc, policy: PolicyCPUDistance}
	if got := s.windowCoverage(10); got != 1 {
		t.Fatalf("coverage before any write = %v, want 1", got)
	}
	s.lastApply = 100
	cases := []struct{ at, want float64 }{
		{at: 120, want: minCoverage}, // evaluated at 90 s: all before the write
		{at: 130, want: minCoverage}, // evaluated at 100 s
		{at: 160, want: 0.5},         // (70, 130]: 30 s after the write
		{at: 190, want: 1},           // (100, 160]
		{at: 250, want: 1},
	}
	for _, c := range cases {
		if got := s.windowCoverage(c.at); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("coverage at %.0f s after a write at 100 s = %v, want %v", c.at, got, c.want)
		}
	}
	if s.windowCoverage(120) <= 0 {
		t.Fatal("a window wholly before the write must be passed as a positive fraction: the engine reads 0 as unknown, that is 1")
	}
}

func TestRecordPeak_IsTheHighestCycleRateOfTheLastTenMinutesOnceThereIsHistory(t *testing.T) {
	s := &simulation{}
	steps := []struct {
		at, rate float64
		observed bool
		want     float64
	}{
		{at: 30, rate: 100, observed: true, want: 0}, // only this cycle: unknown
		{at: 60, rate: 300, observed: true, want: 300},
		{at: 90, rate: 0, observed: false, want: 300},
		{at: 120, rate: 200, observed: true, want: 300},
		{at: 660, rate: 150, observed: true, want: 200}, // 60 s has left the ten minutes
		{at: 721, rate: 50, observed: true, want: 150},
	}
	for _, st := range steps {
		if got := s.recordPeak(st.at, st.rate, st.observed); got != st.want {
			t.Fatalf("peak at %.0f s = %v, want %v (history %+v)", st.at, got, st.want, s.rateHistory)
		}
	}
}

// The peers measure in-band and Envoy alone measures nothing: the TSDB's lag must not touch them.
func TestRun_PeersAndEnvoyAloneIgnoreTheMetricsLag(t *testing.T) {
	for _, policy := range []string{PolicyLeastRequest, PolicyPeakEWMA, PolicyORCAWRR, PolicyPrequal} {
		t.Run(policy, func(t *testing.T) {
			var results []*Result
			for _, lagged := range []bool{true, false} {
				sc, err := Builtin(DefaultScenario)
				if err != nil {
					t.Fatal(err)
				}
				sc.Duration.Duration, sc.Warmup.Duration = 40*time.Second, 10*time.Second
				if !lagged {
					sc.Controller.Metrics = NoMetricsLag()
				}
				r, err := Run(sc, policy, Options{})
				if err != nil {
					t.Fatal(err)
				}
				results = append(results, r)
			}
			if !reflect.DeepEqual(results[0], results[1]) {
				t.Fatalf("%s: the metrics lag changed the result: p99 %.2f with lag, %.2f without", policy, results[0].Latency.P99, results[1].Latency.P99)
			}
		})
	}
}
