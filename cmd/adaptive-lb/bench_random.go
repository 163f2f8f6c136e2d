package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// randomPolicies are what `bench --random` compares: the default engine, the two baselines it
// must never lose to (Envoy alone and the capacity split) and the strongest client-side peer.
var randomPolicies = []string{sim.PolicyLeastRequest, sim.PolicyCapacity, sim.PolicyPeakEWMA, sim.PolicyTail}

// randomBaselines are the policies the default's p99 is divided by, in the report's order.
var randomBaselines = []string{sim.PolicyLeastRequest, sim.PolicyCapacity, sim.PolicyPeakEWMA}

// Bounds of the random bench's flags.
const (
	maxRandomScenarios = 10000
	maxRandomWorkers   = 64
	// randomWorst is how many of the worst scenarios the report lists and --keep-worst keeps.
	randomWorst = 10
)

// randomOptions are the flags of `bench --random`.
type randomOptions struct {
	scenarios int
	seed      int64
	keepWorst string
	workers   int
}

// randomCase is one drawn scenario and the p99 of every policy under every seed of the sweep.
type randomCase struct {
	index int
	drawn sim.Drawn
	// p99[k][policy] is the p99 in ms under the scenario's seed + k; writes the default's
	// weight writes.
	p99    []map[string]float64
	writes []int
}

// ratios is the default's p99 over the baseline's under each seed.
func (c *randomCase) ratios(baseline string) []float64 {
	out := make([]float64, len(c.p99))
	for k, p := range c.p99 {
		out[k] = p[sim.PolicyTail] / p[baseline]
	}
	return out
}

// worst is the seed (its offset in the sweep) at which the default does worst against the
// baselines it must not lose to, and that ratio.
func (c *randomCase) worst() (int, float64) {
	at, worst := 0, math.Inf(-1)
	for k := range c.p99 {
		r := math.Max(c.p99[k][sim.PolicyTail]/c.p99[k][sim.PolicyLeastRequest], c.p99[k][sim.PolicyTail]/c.p99[k][sim.PolicyCapacity])
		if r > worst {
			at, worst = k, r
		}
	}
	return at, worst
}

// runRandom draws o.random.scenarios scenarios, runs randomPolicies on each under o.seeds
// seeds on a pool of workers, prints the report and keeps the worst scenario files. The report
// does not depend on the number of workers: every run is deterministic and lands in its own slot.
func (o *benchOptions) runRandom(stdout, stderr io.Writer) error {
	r := o.random
	cases := make([]randomCase, r.scenarios)
	for i := range cases {
		d, err := sim.GenerateScenario(r.seed, i)
		if err != nil {
			return err
		}
		if o.noLag {
			d.Scenario.Controller.Metrics = sim.NoMetricsLag()
		}
		if err := overrideHistory(d.Scenario, o.history); err != nil {
			return err
		}
		cases[i] = randomCase{index: i, drawn: d, p99: make([]map[string]float64, o.seeds), writes: make([]int, o.seeds)}
		for k := range cases[i].p99 {
			cases[i].p99[k] = map[string]float64{}
		}
	}
	type job struct{ scenario, seed, policy int }
	type outcome struct {
		p99    float64
		writes int
		err    error
	}
	var jobs []job
	for i := range cases {
		for k := range o.seeds {
			for p := range randomPolicies {
				jobs = append(jobs, job{i, k, p})
			}
		}
	}
	results := make([]outcome, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	start := time.Now()
	for range min(r.workers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				jb := jobs[j]
				sc := *cases[jb.scenario].drawn.Scenario
				sc.Seed += int64(jb.seed)
				res, err := sim.Run(&sc, randomPolicies[jb.policy], sim.Options{})
				if err != nil {
					results[j].err = fmt.Errorf("%s under seed %d, %s: %w", sc.Name, sc.Seed, randomPolicies[jb.policy], err)
				} else {
					results[j] = outcome{p99: res.Latency.P99, writes: res.WeightWrites}
				}
				mu.Lock()
				done++
				if done*20/len(jobs) != (done-1)*20/len(jobs) {
					fmt.Fprintf(stderr, "bench: random scenarios: %d of %d runs, %v\n", done, len(jobs), time.Since(start).Round(time.Second))
				}
				mu.Unlock()
			}
		}()
	}
	for j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	fmt.Fprintf(stderr, "bench: %d scenarios × %d seeds × %d policies in %v wall with %d workers\n", r.scenarios, o.seeds, len(randomPolicies), time.Since(start).Round(time.Second), r.workers)
	for j, jb := range jobs {
		if results[j].err != nil {
			return results[j].err
		}
		c := &cases[jb.scenario]
		c.p99[jb.seed][randomPolicies[jb.policy]] = results[j].p99
		if randomPolicies[jb.policy] == sim.PolicyTail {
			c.writes[jb.seed] = results[j].writes
		}
	}
	worst := worstCases(cases, randomWorst)
	files := map[int]string{}
	if r.keepWorst != "" {
		if err := os.MkdirAll(r.keepWorst, 0o755); err != nil {
			return fmt.Errorf("--keep-worst: %w", err)
		}
		for _, c := range worst {
			path, err := o.keepScenario(c)
			if err != nil {
				return err
			}
			files[c.index] = path
		}
	}
	_, err := io.WriteString(stdout, o.randomReport(cases, worst, files))
	return err
}

// worstCases are the n scenarios whose worst seed gives the default its highest p99 against
// least_request or capacity, worst first (ties by index).
func worstCases(cases []randomCase, n int) []*randomCase {
	ranked := make([]*randomCase, len(cases))
	for i := range cases {
		ranked[i] = &cases[i]
	}
	sort.SliceStable(ranked, func(a, b int) bool {
		_, ra := ranked[a].worst()
		_, rb := ranked[b].worst()
		return ra > rb
	})
	return ranked[:min(n, len(ranked))]
}

// keepScenario writes a worst case's scenario, under the seed it did worst at, into
// --keep-worst, with what was drawn and measured as comments.
func (o *benchOptions) keepScenario(c *randomCase) (string, error) {
	k, _ := c.worst()
	sc := *c.drawn.Scenario
	sc.Seed += int64(k)
	data, err := sim.MarshalScenario(&sc)
	if err != nil {
		return "", err
	}
	var head strings.Builder
	fmt.Fprintf(&head, "# Drawn by `adaptive-lb bench --random %d --seed %d` (scenario %d), kept at the seed where\n# the default did worst. %s.\n", o.random.scenarios, o.random.seed, c.index, c.drawn.Summary)
	fmt.Fprintf(&head, "# p99 under seed %d:", sc.Seed)
	for _, p := range randomPolicies {
		fmt.Fprintf(&head, " %s %.1f ms;", p, c.p99[k][p])
	}
	head.WriteString(" " + describeLag(sc.Controller.Metrics) + ".\n")
	path := filepath.Join(o.random.keepWorst, sc.Name+".yaml")
	if err := os.WriteFile(path, append([]byte(head.String()), data...), 0o644); err != nil {
		return "", fmt.Errorf("--keep-worst: %w", err)
	}
	return path, nil
}

// randomReport is the markdown report: the distribution of the default's p99 over each
// baseline's, then the worst cases.
func (o *benchOptions) randomReport(cases []randomCase, worst []*randomCase, files map[int]string) string {
	var b strings.Builder
	r := o.random
	lag := "the scenarios' default metrics lag"
	flag := ""
	if o.noLag {
		lag, flag = "no metrics lag", " --"+noLagFlag
	}
	if o.history != "" {
		flag += " --" + historyFlag + " " + o.history
		lag += "; every scenario's load history " + o.history
	}
	fmt.Fprintf(&b, "Reproduce with `go run ./cmd/adaptive-lb bench --random %d --seed %d --seeds %d%s` (%d scenarios drawn as docs/benchmarks.md describes, each under its own seed s to s+%d; %s; policies %s).\n\n",
		r.scenarios, r.seed, o.seeds, flag, r.scenarios, o.seeds-1, lag, strings.Join(randomPolicies, ", "))
	fmt.Fprintf(&b, "`tail`'s p99 divided by each baseline's under the same scenario and seed, over the %d runs: quantiles (linear between order statistics) and how many runs are above 1.00 and 1.10.\n\n", r.scenarios*o.seeds)
	b.WriteString("| ratio | min | p10 | p25 | median | p75 | p90 | max | runs > 1.00 | runs > 1.10 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, base := range randomBaselines {
		var xs []float64
		for i := range cases {
			xs = append(xs, cases[i].ratios(base)...)
		}
		slices.Sort(xs)
		fmt.Fprintf(&b, "| tail / %s |", base)
		for _, q := range []float64{0, 0.1, 0.25, 0.5, 0.75, 0.9, 1} {
			fmt.Fprintf(&b, " %.2f |", quantileOf(xs, q))
		}
		fmt.Fprintf(&b, " %d (%.0f%%) | %d (%.0f%%) |\n", countAbove(xs, 1), 100*float64(countAbove(xs, 1))/float64(len(xs)), countAbove(xs, 1.1), 100*float64(countAbove(xs, 1.1))/float64(len(xs)))
	}
	fmt.Fprintf(&b, "\nThe %d scenarios where `tail` does worst against `least_request` or `capacity` (the larger of the two ratios, at the scenario's worst seed):\n\n", len(worst))
	b.WriteString("| # | scenario | seed | tail / least_request | tail / capacity | tail / peak-ewma | p99 ms: least_request, capacity, peak-ewma, tail | tail writes | what was drawn |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for n, c := range worst {
		k, _ := c.worst()
		p := c.p99[k]
		name := c.drawn.Scenario.Name
		if f, ok := files[c.index]; ok {
			name = fmt.Sprintf("[%s](%s)", name, f)
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %.2f | %.2f | %.2f | %.1f, %.1f, %.1f, %.1f | %d | %s |\n", n+1, name, c.drawn.Scenario.Seed+int64(k),
			p[sim.PolicyTail]/p[sim.PolicyLeastRequest], p[sim.PolicyTail]/p[sim.PolicyCapacity], p[sim.PolicyTail]/p[sim.PolicyPeakEWMA],
			p[sim.PolicyLeastRequest], p[sim.PolicyCapacity], p[sim.PolicyPeakEWMA], p[sim.PolicyTail], c.writes[k], c.drawn.Summary)
	}
	return b.String()
}

// quantileOf is the q-quantile of sorted xs, linear between order statistics.
func quantileOf(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

func countAbove(xs []float64, limit float64) int {
	n := 0
	for _, x := range xs {
		if x > limit {
			n++
		}
	}
	return n
}
