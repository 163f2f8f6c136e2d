// Package simcli is the simulate command: its flags, its runs of the simulator and its tables. Two
// binaries share it: adaptive-lb (the operator, whose `adaptive-lb simulate` adds the what-if
// fitted to a live Service) and cmd/simulate, the simulator alone. It imports no Kubernetes
// package, so that cmd/simulate compiles a few hundred packages instead of the operator's 1,100;
// TestSimulateMain_ImportsNoKubernetesPackage in cmd/simulate keeps it so.
package simcli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Options are the simulate command's flags for a run on a scenario, and what they resolve to.
type Options struct {
	ScenarioFile string
	Policies     []string
	JSONFile     string
	PlotFile     string
	Seed         int64
	Duration     time.Duration
	Warmup       time.Duration
	// Progress is --progress: whether a live percentage is drawn (ProgressSet says it was given).
	Progress bool
	Export   ExportOptions
	NoLag    bool
	History  string

	// SeedSet, PoliciesSet and ProgressSet: the flags were given (a what-if keeps its own
	// defaults otherwise).
	SeedSet, PoliciesSet, ProgressSet bool
	// Scenario is the scenario to run, with the flags applied, once LoadScenario has run.
	Scenario *sim.Scenario
}

// Long is the description of the simulate command shared by both binaries.
const Long = `simulate runs a discrete-event model of Envoy client proxies and CPU-limited pods, with
adaptive-lb's weight engine in the loop, and compares policies on the same request stream.

Without --scenario it runs the built-in seed-fib scenario, a reproduction of the published
experiment: 15 pods computing fib(25..29) under 1,500 rps.`

// NewCommand returns the simulate command bound to o, for a run on a scenario; the caller sets
// its examples, and may add flags and replace its PreRunE and RunE (adaptive-lb adds the
// what-if).
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate Envoy balancing with and without adaptive-lb on a heterogeneous fleet",
		Long:  Long,
		Args:  cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.CheckFlags(cmd); err != nil {
				return err
			}
			return o.LoadScenario(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.Run(cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// AddFlags registers the flags of a run on a scenario.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.ScenarioFile, "scenario", "", "scenario YAML file (default: the built-in seed-fib)")
	f.StringSliceVar(&o.Policies, "policies", sim.DefaultPolicies, "policies to compare: "+strings.Join(sim.Policies, ", "))
	f.StringVar(&o.JSONFile, "json", "", "write the full results as JSON to this file")
	f.StringVar(&o.PlotFile, "plot", "", "write latency and weights over time to this .png or .svg file")
	f.Int64Var(&o.Seed, "seed", 0, "random seed (default: the scenario's)")
	f.DurationVar(&o.Duration, "duration", 0, "simulated duration (default: the scenario's)")
	// Unset flags are told apart with Changed, not with sentinel defaults, which --help would print.
	f.DurationVar(&o.Warmup, "warmup", 0, "simulated warm-up excluded from statistics (default: the scenario's)")
	f.BoolVar(&o.Progress, "progress", false, "show progress on stderr: a live percentage (default: when stderr is a terminal) and a line per policy as it finishes (unless --progress=false)")
	o.Export.addFlags(f)
	f.BoolVar(&o.NoLag, NoLagFlag, false, NoLagUsage)
	f.StringVar(&o.History, HistoryFlag, "", HistoryUsage)
}

// CheckFlags checks the flags that every run uses and records which were given.
func (o *Options) CheckFlags(cmd *cobra.Command) error {
	for _, p := range o.Policies {
		if err := sim.ValidatePolicy(p); err != nil {
			return UsageError{Err: fmt.Errorf("--policies: %w", err)}
		}
	}
	if len(o.Policies) == 0 {
		return NewUsageError("--policies: name at least one of %s", strings.Join(sim.Policies, ", "))
	}
	if o.PlotFile != "" && !strings.HasSuffix(strings.ToLower(o.PlotFile), ".png") && !strings.HasSuffix(strings.ToLower(o.PlotFile), ".svg") {
		return NewUsageError("--plot %q must end in .png or .svg", o.PlotFile)
	}
	fl := cmd.Flags()
	o.SeedSet, o.PoliciesSet, o.ProgressSet = fl.Changed("seed"), fl.Changed("policies"), fl.Changed("progress")
	return nil
}

// LoadScenario reads the scenario (the built-in seed-fib without --scenario) and applies the
// flags that override it.
func (o *Options) LoadScenario(cmd *cobra.Command) error {
	var err error
	if o.ScenarioFile == "" {
		o.Scenario, err = sim.Builtin(sim.DefaultScenario)
	} else {
		o.Scenario, err = sim.LoadScenarioFile(o.ScenarioFile)
	}
	if err != nil {
		return UsageError{Err: err}
	}
	fl := cmd.Flags()
	if fl.Changed("seed") {
		o.Scenario.Seed = o.Seed
	}
	if o.Duration != 0 {
		o.Scenario.Duration.Duration = o.Duration
	}
	if fl.Changed("warmup") {
		if o.Warmup < 0 {
			return NewUsageError("--warmup %v must not be negative", o.Warmup)
		}
		o.Scenario.Warmup.Duration = o.Warmup
	}
	if o.NoLag {
		o.Scenario.Controller.Metrics = sim.NoMetricsLag()
	}
	if err := OverrideHistory(o.Scenario, o.History); err != nil {
		return err
	}
	if !fl.Changed("progress") {
		o.Progress = isTerminal(os.Stderr)
	}
	if o.Scenario.Duration.Duration <= 0 {
		return NewUsageError("--duration %v must be positive", o.Scenario.Duration.Duration)
	}
	if o.Scenario.Warmup.Duration >= o.Scenario.Duration.Duration {
		return NewUsageError("the warm-up %v must be shorter than the duration %v; pass a shorter --warmup", o.Scenario.Warmup.Duration, o.Scenario.Duration.Duration)
	}
	return o.Export.complete(o.Scenario, time.Now())
}

// Run simulates every policy on the scenario and prints the tables on stdout; progress goes to
// stderr, so that stdout holds only the tables.
func (o *Options) Run(stdout, stderr io.Writer) error {
	results, err := RunPolicies(o.Scenario, o.Policies, RunOptions{
		Stderr:      stderr,
		Percent:     o.Progress,
		PolicyLines: !o.ProgressSet || o.Progress,
		Recorder:    o.Export.recorder,
	})
	if err != nil {
		return err
	}
	// Write every file before printing, so a failure never leaves a table that looks complete.
	if err := o.WriteFiles(o.Scenario, results, nil); err != nil {
		return err
	}
	if err := o.Export.write(stderr, o.Policies[0]); err != nil {
		return err
	}
	return PrintResults(stdout, o.Scenario, results)
}

// Report is the --json document. Field names are a public format: add, never rename.
type Report struct {
	Scenario string `json:"scenario"`
	Seed     int64  `json:"seed"`
	Duration string `json:"duration"`
	Warmup   string `json:"warmup"`
	// Metrics is how the simulated controller read its metrics (the scenario's, or none with
	// --no-metrics-lag).
	Metrics sim.Metrics   `json:"metrics"`
	Results []*sim.Result `json:"results"`
	// WhatIf is set by adaptive-lb's --from-tsdb: the Service, the model check and the advice.
	WhatIf any `json:"what_if,omitempty"`
}

// WriteFiles writes the --json report (with whatIf, when it is not nil) and the --plot, when
// they are asked for.
func (o *Options) WriteFiles(sc *sim.Scenario, results []*sim.Result, whatIf any) error {
	if o.JSONFile != "" {
		rep := Report{Scenario: sc.Name, Seed: sc.Seed, Duration: sc.Duration.String(), Warmup: sc.Warmup.String(), Metrics: sc.Controller.Metrics, Results: results, WhatIf: whatIf}
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := os.WriteFile(o.JSONFile, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write --json file: %w", err)
		}
	}
	if o.PlotFile != "" {
		if err := sim.WritePlot(o.PlotFile, sc.Name, results); err != nil {
			return fmt.Errorf("write --plot file: %w", err)
		}
	}
	return nil
}

// The flags that turn the metrics lag off and set the load history, shared with adaptive-lb's
// bench.
const (
	NoLagFlag    = "no-metrics-lag"
	NoLagUsage   = "read metrics as from an ideal TSDB (every counter sampled each second, queries answered for the instant asked) instead of the scenario's controller.metrics (default: a stock install's 15s scrape, adaptive-lb reading the newest data, ingested 4s after each scrape, and the published operator's rules 30s in the past)"
	HistoryFlag  = "history"
	HistoryUsage = "the load history the controller learns its caution from, for every scenario: same (its past days had the run's load shape), steady (its load never rose) or none (a new Service); default: each scenario's load.history, same unless set"
)

// OverrideHistory sets the scenario's load history to h, when h is set.
func OverrideHistory(sc *sim.Scenario, h string) error {
	if h == "" {
		return nil
	}
	if !slices.Contains([]string{sim.HistorySame, sim.HistorySteady, sim.HistoryNone}, h) {
		return NewUsageError("--%s %q: give same, steady or none", HistoryFlag, h)
	}
	sc.Load.History = h
	return nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
