package main

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
	"github.com/adaptive-lb/adaptive-lb/internal/simcli"
)

// simulateOptions are the simulate command's: the run on a scenario, shared with cmd/simulate
// through internal/simcli, and the what-if fitted to a live Service, which needs this binary's
// metrics client and Kubernetes client.
type simulateOptions struct {
	simcli.Options
	whatIf whatIfOptions
}

func newSimulateCmd() *cobra.Command { return newSimulateCmdFor(&simulateOptions{}) }

// newSimulateCmdFor binds the command to o, so tests can inspect the parsed options.
func newSimulateCmdFor(o *simulateOptions) *cobra.Command {
	cmd := simcli.NewCommand(&o.Options)
	cmd.Long = simcli.Long + `

With --from-tsdb URL --service NAMESPACE/NAME it fits a scenario to that Service's own metrics
over --window (pod groups, speeds, CPU limits, node CPUs, clients, load over time), checks it
by simulating the policy in force and comparing with what was measured, and only then predicts
least_request, capacity, tail and cpu-share on the window's load, with advice.`
	cmd.Example = `  adaptive-lb simulate
  adaptive-lb simulate --policies least_request,capacity --plot out/seed-fib.png
  adaptive-lb simulate --scenario bench/scenarios/noisy-neighbour.yaml --json out/result.json
  adaptive-lb simulate --from-tsdb http://vmselect.monitoring:8481 --tsdb-path-prefix /select/0/prometheus \
      --service shop/web --window 1h --kubeconfig ~/.kube/config --write-scenario web.yaml --plot web.png`
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		return o.complete(cmd)
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if o.whatIf.enabled() {
			return o.runWhatIf(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		}
		return o.Run(cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	o.whatIf.addFlags(cmd.Flags())
	return cmd
}

func (o *simulateOptions) complete(cmd *cobra.Command) error {
	if err := o.CheckFlags(cmd); err != nil {
		return err
	}
	if err := o.whatIf.complete(cmd, time.Now()); err != nil || o.whatIf.enabled() {
		return err
	}
	return o.LoadScenario(cmd)
}

// writeFiles writes the --json report with the what-if's part, and the --plot, when asked for.
func (o *simulateOptions) writeFiles(sc *sim.Scenario, results []*sim.Result, whatIf *whatIfReport) error {
	return o.WriteFiles(sc, results, whatIf)
}

// What bench shares with simulate, under the names bench uses.
const (
	noLagFlag    = simcli.NoLagFlag
	noLagUsage   = simcli.NoLagUsage
	historyFlag  = simcli.HistoryFlag
	historyUsage = simcli.HistoryUsage
)

// runPolicies simulates each policy on its own goroutine, with a live percentage on stderr when
// progress is set.
func runPolicies(sc *sim.Scenario, policies []string, progress bool, stderr io.Writer) ([]*sim.Result, error) {
	return simcli.RunPolicies(sc, policies, simcli.RunOptions{Stderr: stderr, Percent: progress})
}

func overrideHistory(sc *sim.Scenario, h string) error { return simcli.OverrideHistory(sc, h) }

func describeLag(m sim.Metrics) string { return simcli.DescribeLag(m) }

func printResults(w io.Writer, sc *sim.Scenario, results []*sim.Result) error {
	return simcli.PrintResults(w, sc, results)
}
