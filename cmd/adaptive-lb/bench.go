package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// benchPolicies are compared on every scenario of the suite.
var benchPolicies = []string{sim.PolicyLeastRequest, sim.PolicyCPUDistance, sim.PolicyCPUShare, sim.PolicyOracle, sim.PolicyCapacity, sim.PolicyTail, sim.PolicyORCAWRR, sim.PolicyPeakEWMA, sim.PolicyPrequal}

// Markers around the generated part of the benchmarks page.
const (
	benchBegin = "<!-- adaptive-lb bench: begin (generated; edit the command, not this table) -->"
	benchEnd   = "<!-- adaptive-lb bench: end -->"
)

type benchOptions struct {
	suite     string
	policies  []string
	doc       string
	plots     string
	writeDocs bool
	// seeds is how many consecutive seeds, from each scenario file's own, the robustness table
	// runs; 1 is the single-seed bench and prints no robustness table. With --random, every
	// drawn scenario runs under this many seeds.
	seeds int
	// noLag reads every scenario's metrics without lag (--no-metrics-lag).
	noLag bool
	// history overrides every scenario's load history (--history); empty keeps each file's.
	history string
	// random holds the --random flags; random.scenarios 0 runs the suite.
	random randomOptions
}

// maxBenchSeeds bounds --seeds: every extra seed is a full run of three policies on every scenario.
const maxBenchSeeds = 20

// seedPolicies are the policies the robustness table compares over seeds, whatever --policies
// says: the default engine against the per-request baseline and the capacity split it must not
// fall behind.
var seedPolicies = []string{sim.PolicyLeastRequest, sim.PolicyCapacity, sim.PolicyTail}

// The repository's benchmark page and plot directory, rewritten only with --write-docs.
const (
	benchDocsPage  = "docs/benchmarks.md"
	benchDocsPlots = "docs/img"
)

func newBenchCmd() *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the scenario suite under every policy and print the tables",
		Long: `bench runs every scenario file of --suite under each policy and prints a p99 table and the
capacity policy's targets. It writes files only when asked: --doc rewrites the generated section
of a markdown file, --plots writes one PNG per scenario into a directory, and --write-docs does
both for the repository's own docs/benchmarks.md and docs/img (run it from the repository root).

--seeds N (N > 1) also runs least_request, capacity and tail on every scenario under the N seeds
s, s+1, …, s+N−1, where s is the seed in the scenario's file, whatever --policies says, and adds a
robustness table: tail's p99 over least_request's and over capacity's (worst and median over the
seeds) and the seeds at which tail is worse. The other tables stay those of seed s.

--random N draws N random scenarios instead of reading the suite (hardware mixes, load ramps,
steps, bursts and flash crowds, scaling during the change, 2 to 50 client proxies; every draw
is in docs/benchmarks.md), runs least_request, capacity, peak-ewma and tail on each under
--seeds seeds, and reports the distribution of tail's p99 over the others' and the ten worst
scenarios; --keep-worst DIR writes those as scenario files that simulate --scenario reads.`,
		Example: `  adaptive-lb bench
  adaptive-lb bench --plots out/
  adaptive-lb bench --write-docs
  adaptive-lb bench --seeds 5 --policies least_request,capacity,tail
  adaptive-lb bench --random 200 --seed 1 --seeds 3 --keep-worst out/worst`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if o.seeds < 1 || o.seeds > maxBenchSeeds {
				return newUsageError("--seeds %d: give a number of seeds from 1 (each scenario's own seed only) to %d", o.seeds, maxBenchSeeds)
			}
			if err := o.checkRandomFlags(cmd); err != nil {
				return err
			}
			if o.writeDocs {
				if cmd.Flags().Changed("doc") || cmd.Flags().Changed("plots") {
					return newUsageError("--write-docs writes %s and %s; pass either it or --doc/--plots", benchDocsPage, benchDocsPlots)
				}
				if _, err := os.Stat(benchDocsPage); err != nil {
					return newUsageError("--write-docs rewrites %s, which is not here: run it from the repository root (%v)", benchDocsPage, err)
				}
				o.doc, o.plots = benchDocsPage, benchDocsPlots
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.random.scenarios > 0 {
				return o.runRandom(cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return o.run(cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.suite, "suite", "bench/scenarios", "directory of scenario YAML files")
	f.StringSliceVar(&o.policies, "policies", benchPolicies, "policies to compare")
	f.StringVar(&o.doc, "doc", "", "markdown file whose generated section is rewritten (default: none, the tables are only printed)")
	f.StringVar(&o.plots, "plots", "", "directory for one PNG per scenario (default: none)")
	f.IntVar(&o.seeds, "seeds", 1, fmt.Sprintf("number of consecutive seeds, from each scenario file's own, for a robustness table of tail against least_request and capacity (1 to %d; 1 adds no table)", maxBenchSeeds))
	f.BoolVar(&o.writeDocs, "write-docs", false, "rewrite "+benchDocsPage+" and the PNGs in "+benchDocsPlots+" of the repository in the current directory")
	f.BoolVar(&o.noLag, noLagFlag, false, noLagUsage)
	f.StringVar(&o.history, historyFlag, "", historyUsage)
	f.IntVar(&o.random.scenarios, "random", 0, fmt.Sprintf("draw this many random scenarios instead of running --suite (up to %d)", maxRandomScenarios))
	f.Int64Var(&o.random.seed, "seed", 1, "with --random: the series of scenarios to draw")
	f.StringVar(&o.random.keepWorst, "keep-worst", "", fmt.Sprintf("with --random: directory to write the %d worst scenarios into, as scenario files", randomWorst))
	f.IntVar(&o.random.workers, "workers", 2, fmt.Sprintf("with --random: simulations run at once (1 to %d); the report does not depend on it", maxRandomWorkers))
	return cmd
}

type benchRow struct {
	scenario string
	// steady is true when nothing changes during the run (no load phases, no pod events): the
	// p99-versus-oracle and weight-stability targets apply to these.
	steady bool
	// warmupS is the scenario's warm-up, for counting the writes after it.
	warmupS float64
	results map[string]*sim.Result
	// searched is the best static split found (steady scenarios only).
	searched *sim.StaticSearch
	// seedP99 holds, with --seeds above 1, the p99 in ms of each of seedPolicies under each
	// seed of the sweep, in seed order; only the p99 is kept so memory stays that of one seed.
	seedP99 []map[string]float64
	// seedReactions holds tail's reactions to the scenario's slowdowns under each seed of the
	// sweep (the seed s run alone without --seeds).
	seedReactions [][]sim.Reaction
	// firstSeed is the seed in the scenario's file, the sweep's first.
	firstSeed int64
}

// checkRandomFlags refuses --random's flags without it, and the suite's flags with it.
func (o *benchOptions) checkRandomFlags(cmd *cobra.Command) error {
	changed := func(names ...string) string {
		for _, n := range names {
			if cmd.Flags().Changed(n) {
				return n
			}
		}
		return ""
	}
	if o.random.scenarios == 0 {
		if f := changed("seed", "keep-worst", "workers"); f != "" {
			return newUsageError("--%s applies to --random only", f)
		}
		return nil
	}
	if o.random.scenarios < 0 || o.random.scenarios > maxRandomScenarios {
		return newUsageError("--random %d: give a number of scenarios from 1 to %d", o.random.scenarios, maxRandomScenarios)
	}
	if f := changed("suite", "policies", "doc", "plots", "write-docs"); f != "" {
		return newUsageError("--%s applies to the suite; --random draws its own scenarios and runs %s", f, strings.Join(randomPolicies, ", "))
	}
	if o.random.workers < 1 || o.random.workers > maxRandomWorkers {
		return newUsageError("--workers %d: give from 1 to %d simulations at once", o.random.workers, maxRandomWorkers)
	}
	return nil
}

func (o *benchOptions) run(stdout, stderr io.Writer) error {
	for _, p := range o.policies {
		if err := sim.ValidatePolicy(p); err != nil {
			return usageError{err: fmt.Errorf("--policies: %w", err)}
		}
	}
	files, err := filepath.Glob(filepath.Join(o.suite, "*.yaml"))
	if err != nil || len(files) == 0 {
		return newUsageError("--suite %q holds no scenario files (*.yaml)", o.suite)
	}
	sort.Strings(files)
	var rows []benchRow
	for _, file := range files {
		sc, err := sim.LoadScenarioFile(file)
		if err != nil {
			return usageError{err: err}
		}
		if o.noLag {
			sc.Controller.Metrics = sim.NoMetricsLag()
		}
		if err := overrideHistory(sc, o.history); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: %s\n", sc.Name)
		results, err := runPolicies(sc, o.policies, false, stderr)
		if err != nil {
			return err
		}
		row := benchRow{scenario: sc.Name, steady: isSteady(sc), warmupS: sc.Warmup.Seconds(), results: map[string]*sim.Result{}}
		for _, r := range results {
			row.results[r.Policy] = r
		}
		if row.steady && has(o.policies, sim.PolicyOracle) {
			fmt.Fprintf(stderr, "bench: %s: searching static splits\n", sc.Name)
			if row.searched, err = sim.SearchStatic(sc, sim.SearchOptions{}); err != nil {
				return fmt.Errorf("static split search on %s: %w", sc.Name, err)
			}
		}
		row.firstSeed = sc.Seed
		if r, ok := row.results[sim.PolicyTail]; ok {
			row.seedReactions = [][]sim.Reaction{r.Reactions}
		}
		if o.seeds > 1 {
			if row.seedP99, row.seedReactions, err = o.sweepSeeds(sc, results, stderr); err != nil {
				return err
			}
		}
		rows = append(rows, row)
		if o.plots != "" {
			if err := os.MkdirAll(o.plots, 0o755); err != nil {
				return err
			}
			if err := sim.WritePlot(filepath.Join(o.plots, "bench-"+sc.Name+".png"), sc.Name, results); err != nil {
				return err
			}
		}
	}
	table := o.markdown(rows)
	if _, err := io.WriteString(stdout, table); err != nil {
		return err
	}
	if o.doc == "" {
		return nil
	}
	return replaceGenerated(o.doc, table)
}

// sweepSeeds runs seedPolicies on sc under o.seeds consecutive seeds from sc.Seed and keeps each
// run's p99. Under sc.Seed itself it reuses the main table's runs of the policies it has.
func (o *benchOptions) sweepSeeds(sc *sim.Scenario, seedRuns []*sim.Result, stderr io.Writer) ([]map[string]float64, [][]sim.Reaction, error) {
	p99s := make([]map[string]float64, o.seeds)
	reactions := make([][]sim.Reaction, o.seeds)
	for k := range o.seeds {
		p99s[k] = map[string]float64{}
		var missing []string
		for _, p := range seedPolicies {
			i := slices.Index(o.policies, p)
			if k == 0 && i >= 0 {
				p99s[k][p] = seedRuns[i].Latency.P99
				if p == sim.PolicyTail {
					reactions[k] = seedRuns[i].Reactions
				}
			} else {
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			continue
		}
		seeded := *sc
		seeded.Seed = sc.Seed + int64(k)
		fmt.Fprintf(stderr, "bench: %s: seed %d\n", sc.Name, seeded.Seed)
		results, err := runPolicies(&seeded, missing, false, stderr)
		if err != nil {
			return nil, nil, fmt.Errorf("%s under seed %d: %w", sc.Name, seeded.Seed, err)
		}
		for _, r := range results {
			p99s[k][r.Policy] = r.Latency.P99
			if r.Policy == sim.PolicyTail {
				reactions[k] = r.Reactions
			}
		}
	}
	return p99s, reactions, nil
}

func (o *benchOptions) markdown(rows []benchRow) string {
	var b strings.Builder
	lagFlag, lag := "", "each file's metrics lag, by default a 15 s scrape, adaptive-lb reading the newest data (ingested 4 s after each scrape) and the published operator's rules 30 s in the past"
	if o.noLag {
		lagFlag, lag = " --"+noLagFlag, "no metrics lag"
	}
	if o.history != "" {
		lagFlag += " --" + historyFlag + " " + o.history
		lag += "; every scenario's load history " + o.history
	}
	if o.seeds > 1 {
		fmt.Fprintf(&b, "Reproduce with `go run ./cmd/adaptive-lb bench --write-docs --seeds %d%s` (suite `%s`, seed of each scenario file; %s; the robustness table at the end adds the next %d seeds).\n\n", o.seeds, lagFlag, o.suite, lag, o.seeds-1)
	} else {
		fmt.Fprintf(&b, "Reproduce with `go run ./cmd/adaptive-lb bench --write-docs%s` (suite `%s`, seed of each scenario file; %s).\n\n", lagFlag, o.suite, lag)
	}
	b.WriteString("p99 latency in ms:\n\n| scenario |")
	for _, p := range o.policies {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(o.policies)) + "\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |", r.scenario)
		best := math.Inf(1)
		for _, p := range o.policies {
			best = math.Min(best, r.results[p].Latency.P99)
		}
		for _, p := range o.policies {
			v := r.results[p].Latency.P99
			if v == best {
				fmt.Fprintf(&b, " **%.1f** |", v)
			} else {
				fmt.Fprintf(&b, " %.1f |", v)
			}
		}
		b.WriteString("\n")
	}
	// The targets table follows the default algorithm when it ran, else capacity.
	engine := sim.PolicyTail
	if !has(o.policies, engine) {
		engine = sim.PolicyCapacity
	}
	if has(o.policies, engine) && has(o.policies, sim.PolicyOracle) && has(o.policies, sim.PolicyLeastRequest) {
		fmt.Fprintf(&b, "\n`%s` against its targets. Steady: no load phases and no pod events, where p99 ≤ 1.1× oracle and a weight CV below 5%% are the targets. Weight writes: every write of the run, warm-up included (a user's first 10 minutes count), and in brackets those that reached the clients after the warm-up. Weight CV: the largest coefficient of variation of a pod's weight over the second half of the run. Recovery: for each speed change, the controller intervals until the p99 of every following interval stays within 10%% of the p99 of the minute before the change (\"never\" if it does not) / within 10%% of the level it settles at.\n\n", engine)
		b.WriteString("Best static split (steady scenarios): the lowest p99 found by `sim.SearchStatic` (its search is in the table after this one).\n\n")
		b.WriteString("| scenario | steady | p99 / oracle | p99 / best static split | p99 / least_request | total CPU / least_request | weight writes (after warm-up) | largest weight CV | settled after | recovery (intervals) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, r := range rows {
			c, or, lr := r.results[engine], r.results[sim.PolicyOracle], r.results[sim.PolicyLeastRequest]
			steady := "no"
			if r.steady {
				steady = "yes"
			}
			searched := "–"
			if r.searched != nil {
				searched = fmt.Sprintf("%.2f (%.1f ms)", c.Latency.P99/r.searched.P99, r.searched.P99)
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %.2f | %.2f | %d (%d) | %.1f%% | %.0f s | %s |\n", r.scenario, steady, c.Latency.P99/or.Latency.P99, searched, c.Latency.P99/lr.Latency.P99, c.TotalCPU/lr.TotalCPU, c.WeightWrites, writesAfter(c, r.warmupS), 100*weightCV(c), c.SteadyAfterS, recoveryCell(c))
		}
	}
	if slices.ContainsFunc(rows, func(r benchRow) bool { return r.searched != nil }) {
		b.WriteString("\nThe search for the best static split, per steady scenario: first weights ∝ capacity^α over a sweep of α (0 is equal weights; the sweep goes on past 12 while its best is at the top and the weights still change), then coordinate descent over the weight of each group of pods of equal true capacity, from the best α. Every candidate is a full run under the scenario's seed.\n\n")
		b.WriteString("| scenario | α swept | best α (p99) | best α at the edge | best weights per group | best p99 | groups left at weight 1 | runs |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, r := range rows {
			if r.searched == nil {
				continue
			}
			x := r.searched
			edge := "no"
			if x.AlphaAtEdge {
				edge = "**yes**"
			}
			floor := "–"
			if len(x.AtFloor) > 0 {
				floor = strings.Join(x.AtFloor, ", ")
			}
			fmt.Fprintf(&b, "| %s | %g – %g | %g (%.1f ms) | %s | %s | %.1f ms | %s | %d |\n", r.scenario, x.AlphaFrom, x.AlphaTo, x.Alpha, x.AlphaP99, edge, groupWeights(x.Weights), x.P99, floor, x.Runs)
		}
	}
	if o.seeds > 1 {
		b.WriteString(seedTable(rows, o.seeds))
	}
	b.WriteString(reactionTable(rows, o.policies))
	return b.String()
}

// seedTable is the robustness table: per scenario, tail's p99 over least_request's and over
// capacity's across the seeds of the sweep, and the seeds at which tail's p99 is the higher.
func seedTable(rows []benchRow, seeds int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nOver %d seeds (each scenario's own seed s to s+%d; the tables above are seed s): `tail`'s p99 divided by `least_request`'s and by `capacity`'s under the same seed, the worst (largest) and the median of the %d ratios, and the seeds at which `tail`'s p99 is higher.\n\n", seeds, seeds-1, seeds)
	b.WriteString("| scenario | seeds | tail / least_request: worst | median | tail / capacity: worst | median | seeds where tail > least_request | seeds where tail > capacity |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		lr := seedRatios(r.seedP99, sim.PolicyLeastRequest)
		cp := seedRatios(r.seedP99, sim.PolicyCapacity)
		fmt.Fprintf(&b, "| %s | %d – %d | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", r.scenario, r.firstSeed, r.firstSeed+int64(len(r.seedP99))-1,
			slices.Max(lr), median(lr), slices.Max(cp), median(cp), seedsAbove(lr, r.firstSeed), seedsAbove(cp, r.firstSeed))
	}
	return b.String()
}

// seedRatios is tail's p99 over the baseline's, per seed of the sweep.
func seedRatios(p99s []map[string]float64, baseline string) []float64 {
	ratios := make([]float64, len(p99s))
	for k, p := range p99s {
		ratios[k] = p[sim.PolicyTail] / p[baseline]
	}
	return ratios
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// seedsAbove lists the seeds whose ratio is above 1 with the ratio, or "none". Three decimals,
// so that a seed listed as worse never reads as a ratio of 1.00.
func seedsAbove(ratios []float64, firstSeed int64) string {
	var cells []string
	for k, x := range ratios {
		if x > 1 {
			cells = append(cells, fmt.Sprintf("%d (%.3f)", firstSeed+int64(k), x))
		}
	}
	if len(cells) == 0 {
		return "none"
	}
	return strings.Join(cells, ", ")
}

// groupWeights lists weights per pod group in name order.
func groupWeights(ws map[string]int) string {
	names := make([]string, 0, len(ws))
	for n := range ws {
		names = append(names, n)
	}
	sort.Strings(names)
	var cells []string
	for _, n := range names {
		cells = append(cells, fmt.Sprintf("%s %d", n, ws[n]))
	}
	return strings.Join(cells, ", ")
}

// isSteady reports whether nothing changes during a scenario.
func isSteady(sc *sim.Scenario) bool {
	if len(sc.Load.Phases) > 0 {
		return false
	}
	for _, pg := range sc.Pods {
		if len(pg.Events) > 0 {
			return false
		}
	}
	return true
}

// recoveryCell lists each speed change's recovery as "at: to-before / to-settled".
func recoveryCell(r *sim.Result) string {
	if len(r.Recoveries) == 0 {
		return "–"
	}
	intervals := func(k int) string {
		if k < 0 {
			return "never"
		}
		return strconv.Itoa(k)
	}
	var cells []string
	for _, rec := range r.Recoveries {
		cells = append(cells, fmt.Sprintf("t=%.0fs: %s / %s (p99 %.0f → %.0f ms)", rec.AtS, intervals(rec.Intervals), intervals(rec.IntervalsToSettle), rec.BeforeP99, rec.SettledP99))
	}
	return strings.Join(cells, "; ")
}

// writesAfter counts the weight writes that reached the clients after the warm-up ended at
// warmupS. The bench's primary figure stays the count over the whole run.
func writesAfter(r *sim.Result, warmupS float64) int {
	n := 0
	for _, wp := range r.Weights {
		if wp.TimeS > warmupS {
			n++
		}
	}
	return n
}

// weightCV is the largest coefficient of variation of one pod's weight over the second half of
// the run, sampling the weight in force every second.
func weightCV(r *sim.Result) float64 {
	if len(r.Weights) == 0 || len(r.Timeline) == 0 {
		return 0
	}
	end := r.Timeline[len(r.Timeline)-1].TimeS
	worst := 0.0
	for pod := range r.Weights[len(r.Weights)-1].Weights {
		var xs []float64
		for t := end / 2; t <= end; t++ {
			w := 0
			for _, wp := range r.Weights {
				if wp.TimeS <= t {
					w = wp.Weights[pod]
				}
			}
			if w > 0 {
				xs = append(xs, float64(w))
			}
		}
		if len(xs) < 2 {
			continue
		}
		var mean, sq float64
		for _, x := range xs {
			mean += x
		}
		mean /= float64(len(xs))
		for _, x := range xs {
			sq += (x - mean) * (x - mean)
		}
		worst = math.Max(worst, math.Sqrt(sq/float64(len(xs)))/mean)
	}
	return worst
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// replaceGenerated rewrites the text between the bench markers, appending a section if absent.
func replaceGenerated(path, table string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read --doc: %w", err)
	}
	block := benchBegin + "\n" + table + benchEnd
	i, j := bytes.Index(data, []byte(benchBegin)), bytes.Index(data, []byte(benchEnd))
	var out []byte
	if i >= 0 && j > i {
		out = append(append(append([]byte{}, data[:i]...), block...), data[j+len(benchEnd):]...)
	} else {
		out = append(append(data, []byte("\n## Scenario suite\n\n")...), block+"\n"...)
	}
	return os.WriteFile(path, out, 0o644)
}
