package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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
	export       exportOptions
	whatIf       whatIfOptions
	noLag        bool
	history      string

	// seedSet and policiesSet: the flags were given (a what-if keeps its own defaults otherwise).
	seedSet, policiesSet bool
	scenario             *sim.Scenario
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
	// WhatIf is set by --from-tsdb: the Service, the model check and the advice.
	WhatIf *whatIfReport `json:"what_if,omitempty"`
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
experiment: 15 pods computing fib(25..29) under 1,500 rps.

With --from-tsdb URL --service NAMESPACE/NAME it fits a scenario to that Service's own metrics
over --window (pod groups, speeds, CPU limits, node CPUs, clients, load over time), checks it
by simulating the policy in force and comparing with what was measured, and only then predicts
least_request, capacity, tail and cpu-share on the window's load, with advice.`,
		Example: `  adaptive-lb simulate
  adaptive-lb simulate --policies least_request,capacity --plot out/seed-fib.png
  adaptive-lb simulate --scenario bench/scenarios/noisy-neighbour.yaml --json out/result.json
  adaptive-lb simulate --from-tsdb http://vmselect.monitoring:8481 --tsdb-path-prefix /select/0/prometheus \
      --service shop/web --window 1h --kubeconfig ~/.kube/config --write-scenario web.yaml --plot web.png`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.complete(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.whatIf.enabled() {
				return o.runWhatIf(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
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
	o.export.addFlags(f)
	o.whatIf.addFlags(f)
	f.BoolVar(&o.noLag, noLagFlag, false, noLagUsage)
	f.StringVar(&o.history, historyFlag, "", historyUsage)
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
	if o.plotFile != "" && !strings.HasSuffix(strings.ToLower(o.plotFile), ".png") && !strings.HasSuffix(strings.ToLower(o.plotFile), ".svg") {
		return newUsageError("--plot %q must end in .png or .svg", o.plotFile)
	}
	o.seedSet, o.policiesSet = cmd.Flags().Changed("seed"), cmd.Flags().Changed("policies")
	if err := o.whatIf.complete(cmd, time.Now()); err != nil || o.whatIf.enabled() {
		return err
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
	if err := overrideHistory(o.scenario, o.history); err != nil {
		return err
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
	return o.export.complete(o.scenario, time.Now())
}

func (o *simulateOptions) run(stdout, stderr io.Writer) error {
	results, err := runPoliciesRecorded(o.scenario, o.policies, o.progress, stderr, o.export.recorder)
	if err != nil {
		return err
	}
	// Write every file before printing, so a failure never leaves a table that looks complete.
	if err := o.writeFiles(o.scenario, results, nil); err != nil {
		return err
	}
	if err := o.export.write(stderr, o.policies[0]); err != nil {
		return err
	}
	return printResults(stdout, o.scenario, results)
}

// writeFiles writes the --json report (with the what-if part when there is one) and the --plot,
// when they are asked for.
func (o *simulateOptions) writeFiles(sc *sim.Scenario, results []*sim.Result, whatIf *whatIfReport) error {
	if o.jsonFile != "" {
		rep := simulateReport{Scenario: sc.Name, Seed: sc.Seed, Duration: sc.Duration.String(), Warmup: sc.Warmup.String(), Metrics: sc.Controller.Metrics, Results: results, WhatIf: whatIf}
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := os.WriteFile(o.jsonFile, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write --json file: %w", err)
		}
	}
	if o.plotFile != "" {
		if err := sim.WritePlot(o.plotFile, sc.Name, results); err != nil {
			return fmt.Errorf("write --plot file: %w", err)
		}
	}
	return nil
}

// runPolicies simulates each policy on its own goroutine; runs are independent and deterministic.
func runPolicies(sc *sim.Scenario, policies []string, progress bool, stderr io.Writer) ([]*sim.Result, error) {
	return runPoliciesRecorded(sc, policies, progress, stderr, nil)
}

// runPoliciesRecorded is runPolicies with the first policy's run recorded by rec, when it is set.
func runPoliciesRecorded(sc *sim.Scenario, policies []string, progress bool, stderr io.Writer, rec *sim.MetricsRecorder) ([]*sim.Result, error) {
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
			if i == 0 {
				opts.Metrics = rec
			}
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
	noLagFlag    = "no-metrics-lag"
	noLagUsage   = "read metrics as from an ideal TSDB (every counter sampled each second, queries answered for the instant asked) instead of the scenario's controller.metrics (default: a stock install's 15s scrape, adaptive-lb reading the newest data, ingested 4s after each scrape, and the published operator's rules 30s in the past)"
	historyFlag  = "history"
	historyUsage = "the load history the controller learns its caution from, for every scenario: same (its past days had the run's load shape), steady (its load never rose) or none (a new Service); default: each scenario's load.history, same unless set"
)

// overrideHistory sets every scenario's load history to h, when h is set.
func overrideHistory(sc *sim.Scenario, h string) error {
	if h == "" {
		return nil
	}
	if !slices.Contains([]string{sim.HistorySame, sim.HistorySteady, sim.HistoryNone}, h) {
		return newUsageError("--%s %q: give same, steady or none", historyFlag, h)
	}
	sc.Load.History = h
	return nil
}

// describeLag says how the controller reads its metrics, for a table's header.
func describeLag(m sim.Metrics) string {
	if m.Lagless() {
		return "metrics without lag"
	}
	s := fmt.Sprintf("metrics scraped every %v", m.ScrapeInterval.Duration)
	if q := m.QueryLatencyOffset.Duration; q == 0 {
		s += ", adaptive-lb reading the newest data"
	} else {
		s += fmt.Sprintf(", adaptive-lb reading %v in the past", q)
	}
	if m.IngestionDelay.Duration > 0 {
		s += fmt.Sprintf(" (ingested %v after each scrape)", m.IngestionDelay.Duration)
	}
	return s + fmt.Sprintf(", the published rules %v in the past", m.LatencyOffset.Duration)
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
