package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/adaptive-lb/adaptive-lb/internal/simcli"
)

// Exit codes. Scripts rely on bad input being distinguishable from a failed run.
const (
	exitOK         = simcli.ExitOK
	exitFailure    = simcli.ExitFailure
	exitUsageError = simcli.ExitUsageError
)

// usageError marks an error caused by the user's input (flags, files); it exits with status 2,
// as simcli.UsageError does, which the simulate and bench commands return.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func newUsageError(format string, args ...any) error {
	return usageError{err: fmt.Errorf(format, args...)}
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "adaptive-lb",
		Short: "Capacity-aware endpoint weights for Istio/Envoy meshes on mixed hardware",
		Long: `adaptive-lb reads per-pod signals from a Prometheus-compatible TSDB, computes a weight
for every endpoint of an opted-in Service and writes the weights through an Istio ServiceEntry.

Run "adaptive-lb simulate" to see its effect on a simulated heterogeneous fleet, no cluster needed.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err: err} })
	root.AddCommand(
		newSimulateCmd(),
		newBenchCmd(),
		newRunCmd(),
		newFailsafeCmd(),
		newMetricsCmd(),
		newVersionCmd(),
	)
	return root
}

// execute runs the CLI and maps errors to exit codes; it never calls os.Exit so tests can drive it.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || simcli.IsUsageError(err) {
		return exitUsageError
	}
	return exitFailure
}
