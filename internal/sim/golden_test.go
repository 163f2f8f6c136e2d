package sim

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden-*.json from the current simulator")

// stableOutputs is a result without the figures that come from latency percentiles (which may be
// read from a histogram) or are derived from them (when the p99 settled, recoveries): what must
// stay bit-identical for a seed when the simulator is made faster.
type stableOutputs struct {
	Result
	Timeline []float64 `json:"timeline_rps"`
}

func stableOf(r *Result) stableOutputs {
	c := *r
	c.Latency = Percentiles{}
	c.SteadyAfterS = 0
	c.Recoveries = nil
	c.Pods = append([]PodResult(nil), r.Pods...)
	for i := range c.Pods {
		c.Pods[i].Latency = PodPercentiles{}
	}
	var rps []float64
	for _, p := range r.Timeline {
		rps = append(rps, p.TimeS, p.RPS)
	}
	c.Timeline = nil
	return stableOutputs{Result: c, Timeline: rps}
}

// goldenRun is one pinned run: a short version of a suite scenario under one policy.
type goldenRun struct {
	file, policy string
	duration     time.Duration
}

var goldenRuns = []goldenRun{
	{"seed-fib", PolicyLeastRequest, 200 * time.Second},
	{"seed-fib", PolicyCPUDistance, 200 * time.Second},
	{"seed-fib", PolicyCapacity, 200 * time.Second},
	{"seed-fib", PolicyPrequal, 100 * time.Second},
	{"seed-fib", PolicyPeakEWMA, 100 * time.Second},
	{"seed-fib", PolicyORCAWRR, 100 * time.Second},
	{"noisy-neighbour", PolicyCapacity, 300 * time.Second},
	{"rolling-restart", PolicyCapacity, 300 * time.Second},
	{"bursty", PolicyLeastRequest, 300 * time.Second},
}

// TestRun_OutputsUnchangedForFixedSeed pins every output that does not come from a latency
// percentile, for a few short runs, to what the simulator produced before its speed-up (heap of
// every event, exact sorting): the speed-up must not change what is simulated. The mean latency
// is summed in another order now, so it is compared to 1e-9. Regenerate with
// `go test -run OutputsUnchanged -update-golden ./internal/sim/` only when a change of the model
// is intended.
func TestRun_OutputsUnchangedForFixedSeed(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		// Go may fuse multiply-adds on other architectures, which changes the last bits of the
		// virtual clock and with them the order of events.
		t.Skip("golden outputs were recorded on amd64")
	}
	for _, g := range goldenRuns {
		name := g.file + "-" + g.policy
		t.Run(name, func(t *testing.T) {
			sc, err := LoadScenarioFile(filepath.Join("..", "..", "bench", "scenarios", g.file+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			sc.Duration.Duration = g.duration
			sc.Warmup.Duration = min(sc.Warmup.Duration, g.duration/4)
			r, err := Run(sc, g.policy, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(stableOf(r), "", " ")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "golden-"+name+".json")
			if *updateGolden {
				golden := struct {
					Stable json.RawMessage `json:"stable"`
					MeanMS float64         `json:"mean_ms"`
				}{got, r.Latency.Mean}
				data, err := json.MarshalIndent(golden, "", " ")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (create it with -update-golden)", err)
			}
			var want struct {
				Stable json.RawMessage `json:"stable"`
				MeanMS float64         `json:"mean_ms"`
			}
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatal(err)
			}
			var wantStable, gotStable any
			if err := json.Unmarshal(want.Stable, &wantStable); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &gotStable); err != nil {
				t.Fatal(err)
			}
			wantJSON, _ := json.MarshalIndent(wantStable, "", " ")
			gotJSON, _ := json.MarshalIndent(gotStable, "", " ")
			if string(wantJSON) != string(gotJSON) {
				t.Fatalf("outputs changed for a fixed seed:\n got %s\nwant %s", firstDiff(string(gotJSON), string(wantJSON)), firstDiff(string(wantJSON), string(gotJSON)))
			}
			if math.Abs(r.Latency.Mean-want.MeanMS) > 1e-9*want.MeanMS {
				t.Fatalf("mean latency %.12g ms, want %.12g ms", r.Latency.Mean, want.MeanMS)
			}
		})
	}
}

// firstDiff returns a window of a around the first byte where it differs from b.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo, hi := max(0, i-200), min(len(a), i+200)
	return "…" + a[lo:hi] + "…"
}
