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
}

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
both for the repository's own docs/benchmarks.md and docs/img (run it from the repository root).`,
		Example: `  adaptive-lb bench
  adaptive-lb bench --plots out/
  adaptive-lb bench --write-docs`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
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
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd.OutOrStdout(), cmd.ErrOrStderr()) },
	}
	f := cmd.Flags()
	f.StringVar(&o.suite, "suite", "bench/scenarios", "directory of scenario YAML files")
	f.StringSliceVar(&o.policies, "policies", benchPolicies, "policies to compare")
	f.StringVar(&o.doc, "doc", "", "markdown file whose generated section is rewritten (default: none, the tables are only printed)")
	f.StringVar(&o.plots, "plots", "", "directory for one PNG per scenario (default: none)")
	f.BoolVar(&o.writeDocs, "write-docs", false, "rewrite "+benchDocsPage+" and the PNGs in "+benchDocsPlots+" of the repository in the current directory")
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

func (o *benchOptions) markdown(rows []benchRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Reproduce with `go run ./cmd/adaptive-lb bench --write-docs` (suite `%s`, seed of each scenario file).\n\n", o.suite)
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
	return b.String()
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
