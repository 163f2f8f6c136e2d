package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

type simulateOptions struct {
	scenarioFile string
	policies     []string
	jsonFile     string
	plotFile     string
	seed         int64
	duration     time.Duration
	warmup       time.Duration
	progress     bool
	noLag        bool

	scenario *sim.Scenario
}

// simulateReport is the --json document. Field names are a public format: add, never rename.
type simulateReport struct {
	Scenario string `json:"scenario"`
	Seed     int64  `json:"seed"`
	Duration string `json:"duration"`
	Warmup   string `json:"warmup"`
	// Metrics is how the simulated controller read its metrics (the scenario's, or none with
	// --no-metrics-lag).
	Metrics sim.Metrics   `json:"metrics"`
	Results []*sim.Result `json:"results"`
}

func newSimulateCmd() *cobra.Command { return newSimulateCmdFor(&simulateOptions{}) }

// newSimulateCmdFor binds the command to o, so tests can inspect the parsed options.
func newSimulateCmdFor(o *simulateOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate Envoy balancing with and without adaptive-lb on a heterogeneous fleet",
		Long: `simulate runs a discrete-event model of Envoy client proxies and CPU-limited pods, with
adaptive-lb's weight engine in the loop, and compares policies on the same request stream.

Without --scenario it runs the built-in seed-fib scenario, a reproduction of the published
experiment: 15 pods computing fib(25..29) under 1,500 rps.`,
		Example: `  adaptive-lb simulate
  adaptive-lb simulate --policies least_request,capacity --plot out/seed-fib.png
  adaptive-lb simulate --scenario bench/scenarios/noisy-neighbour.yaml --json out/result.json`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.complete(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.scenarioFile, "scenario", "", "scenario YAML file (default: the built-in seed-fib)")
	f.StringSliceVar(&o.policies, "policies", sim.DefaultPolicies, "policies to compare: "+strings.Join(sim.Policies, ", "))
	f.StringVar(&o.jsonFile, "json", "", "write the full results as JSON to this file")
	f.StringVar(&o.plotFile, "plot", "", "write latency and weights over time to this .png or .svg file")
	f.Int64Var(&o.seed, "seed", 0, "random seed (default: the scenario's)")
	f.DurationVar(&o.duration, "duration", 0, "simulated duration (default: the scenario's)")
	// Unset flags are told apart with Changed, not with sentinel defaults, which --help would print.
	f.DurationVar(&o.warmup, "warmup", 0, "simulated warm-up excluded from statistics (default: the scenario's)")
	f.BoolVar(&o.progress, "progress", false, "show progress on stderr (default: when stderr is a terminal)")
	f.BoolVar(&o.noLag, noLagFlag, false, noLagUsage)
	return cmd
}

func (o *simulateOptions) complete(cmd *cobra.Command) error {
	for _, p := range o.policies {
		if err := sim.ValidatePolicy(p); err != nil {
			return usageError{err: fmt.Errorf("--policies: %w", err)}
		}
	}
	if len(o.policies) == 0 {
		return newUsageError("--policies: name at least one of %s", strings.Join(sim.Policies, ", "))
	}
	var err error
	if o.scenarioFile == "" {
		o.scenario, err = sim.Builtin(sim.DefaultScenario)
	} else {
		o.scenario, err = sim.LoadScenarioFile(o.scenarioFile)
	}
	if err != nil {
		return usageError{err: err}
	}
	if cmd.Flags().Changed("seed") {
		o.scenario.Seed = o.seed
	}
	if o.duration != 0 {
		o.scenario.Duration.Duration = o.duration
	}
	if cmd.Flags().Changed("warmup") {
		if o.warmup < 0 {
			return newUsageError("--warmup %v must not be negative", o.warmup)
		}
		o.scenario.Warmup.Duration = o.warmup
	}
	if o.noLag {
		o.scenario.Controller.Metrics = sim.NoMetricsLag()
	}
	if !cmd.Flags().Changed("progress") {
		o.progress = isTerminal(os.Stderr)
	}
	if o.scenario.Duration.Duration <= 0 {
		return newUsageError("--duration %v must be positive", o.scenario.Duration.Duration)
	}
	if o.scenario.Warmup.Duration >= o.scenario.Duration.Duration {
		return newUsageError("the warm-up %v must be shorter than the duration %v; pass a shorter --warmup", o.scenario.Warmup.Duration, o.scenario.Duration.Duration)
	}
	if o.plotFile != "" && !strings.HasSuffix(strings.ToLower(o.plotFile), ".png") && !strings.HasSuffix(strings.ToLower(o.plotFile), ".svg") {
		return newUsageError("--plot %q must end in .png or .svg", o.plotFile)
	}
	return nil
}

func (o *simulateOptions) run(stdout, stderr io.Writer) error {
	results, err := runPolicies(o.scenario, o.policies, o.progress, stderr)
	if err != nil {
		return err
	}
	// Write every file before printing, so a failure never leaves a table that looks complete.
	if o.jsonFile != "" {
		rep := simulateReport{Scenario: o.scenario.Name, Seed: o.scenario.Seed, Duration: o.scenario.Duration.String(), Warmup: o.scenario.Warmup.String(), Metrics: o.scenario.Controller.Metrics, Results: results}
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := os.WriteFile(o.jsonFile, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write --json file: %w", err)
		}
	}
	if o.plotFile != "" {
		if err := sim.WritePlot(o.plotFile, o.scenario.Name, results); err != nil {
			return fmt.Errorf("write --plot file: %w", err)
		}
	}
	return printResults(stdout, o.scenario, results)
}

// runPolicies simulates each policy on its own goroutine; runs are independent and deterministic.
func runPolicies(sc *sim.Scenario, policies []string, progress bool, stderr io.Writer) ([]*sim.Result, error) {
	results := make([]*sim.Result, len(policies))
	errs := make([]error, len(policies))
	done := make([]float64, len(policies))
	var mu sync.Mutex
	lastShown := -1
	report := func(i int, f float64) {
		mu.Lock()
		defer mu.Unlock()
		done[i] = f
		total := 0.0
		for _, d := range done {
			total += d
		}
		pct := int(100 * total / float64(len(done)))
		if pct != lastShown {
			lastShown = pct
			fmt.Fprintf(stderr, "\rsimulating %s: %3d%%", sc.Name, pct)
		}
	}
	var wg sync.WaitGroup
	for i, p := range policies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := sim.Options{}
			if progress {
				opts.Progress = func(f float64) { report(i, f) }
			}
			results[i], errs[i] = sim.Run(sc, p, opts)
		}()
	}
	wg.Wait()
	if progress {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("simulation failed: %w", err)
	}
	return results, nil
}

// The flag that turns the metrics lag off, shared by simulate and bench.
const (
	noLagFlag  = "no-metrics-lag"
	noLagUsage = "read metrics as from an ideal TSDB (every counter sampled each second, queries answered for the instant asked) instead of the scenario's controller.metrics (default: a stock install's 15s scrape and 30s latency offset)"
)

// describeLag says how the controller reads its metrics, for a table's header.
func describeLag(m sim.Metrics) string {
	if m.Lagless() {
		return "metrics without lag"
	}
	s := fmt.Sprintf("metrics scraped every %v, read %v in the past", m.ScrapeInterval.Duration, m.LatencyOffset.Duration)
	if m.IngestionDelay.Duration > 0 {
		s += fmt.Sprintf(", ingested after %v", m.IngestionDelay.Duration)
	}
	return s
}

func printResults(w io.Writer, sc *sim.Scenario, results []*sim.Result) error {
	pods, rps := 0, sc.Load.RPS
	for _, p := range sc.Pods {
		pods += p.Replicas
	}
	fmt.Fprintf(w, "Scenario %s: %d pods, %.0f rps, %v simulated (first %v excluded), seed %d, clients: %d proxies × %d workers on %s; %s\n\n",
		sc.Name, pods, rps, sc.Duration.Duration, sc.Warmup.Duration, sc.Seed, sc.Clients.Proxies, sc.Clients.Workers, sc.Clients.LB, describeLag(sc.Controller.Metrics))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tp50 ms\tp90 ms\tp95 ms\tp99 ms\tp99.9 ms\tmean ms\ttotal CPU\trequests\tweight writes\t")
	for _, r := range results {
		l := r.Latency
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%d\t%d\t\n", r.Policy, l.P50, l.P90, l.P95, l.P99, l.P999, l.Mean, r.TotalCPU, r.Requests, r.WeightWrites)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nPer pod: rps, CPU cores, p99 ms and final weight under each policy")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "pod\t"
	for _, r := range results {
		header += r.Policy + " rps\tcpu\tp99\tweight\t"
	}
	fmt.Fprintln(tw, header)
	byName := make([]map[string]sim.PodResult, len(results))
	var names []string
	for i, r := range results {
		byName[i] = map[string]sim.PodResult{}
		for _, p := range r.Pods {
			byName[i][p.Name] = p
			if i == 0 {
				names = append(names, p.Name)
			}
		}
	}
	for _, n := range names {
		row := n + "\t"
		for i := range results {
			p, ok := byName[i][n]
			if !ok {
				row += "-\t-\t-\t-\t"
				continue
			}
			row += fmt.Sprintf("%.1f\t%.2f\t%.1f\t%d\t", p.RPS, p.CPU, p.Latency.P99, p.FinalWeight)
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
