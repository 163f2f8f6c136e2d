// Command simulate is adaptive-lb's simulator on its own: the command `adaptive-lb simulate` runs
// on a scenario, from the same package (internal/simcli), in a binary without the operator. `go
// run ./cmd/simulate` compiles about 200 packages; `go run ./cmd/adaptive-lb simulate` compiles
// the operator's 1,160 (client-go, controller-runtime, Istio's clients), which takes half an hour
// on a fresh 2-core machine. The what-if fitted to a live Service (--from-tsdb) reads the TSDB
// and the cluster with the operator's clients, so it stays in `adaptive-lb simulate`.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/adaptive-lb/adaptive-lb/internal/simcli"
)

func main() {
	os.Exit(simcli.Execute(newCommand(), os.Args[1:], os.Stdout, os.Stderr))
}

func newCommand() *cobra.Command {
	o := &simcli.Options{}
	cmd := simcli.NewCommand(o)
	cmd.Long += `

This is the simulator alone, without the operator. The what-if fitted to a live Service's
metrics (--from-tsdb) is in the operator's binary: go run ./cmd/adaptive-lb simulate --from-tsdb URL.`
	cmd.Example = `  go run ./cmd/simulate
  go run ./cmd/simulate --policies least_request,capacity --plot out/seed-fib.png
  go run ./cmd/simulate --scenario bench/scenarios/noisy-neighbour.yaml --json out/result.json`
	// --from-tsdb is not a flag of this binary, but a user who read about it gets told where it is
	// rather than "unknown flag".
	var fromTSDB string
	cmd.Flags().StringVar(&fromTSDB, "from-tsdb", "", "")
	_ = cmd.Flags().MarkHidden("from-tsdb")
	check := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if cmd.Flags().Changed("from-tsdb") {
			return simcli.NewUsageError("--from-tsdb: the what-if fitted to a Service's metrics needs the operator's TSDB and Kubernetes clients; run it with go run ./cmd/adaptive-lb simulate --from-tsdb %s --service NAMESPACE/NAME", fromTSDB)
		}
		return check(cmd, args)
	}
	return cmd
}
