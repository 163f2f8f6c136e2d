package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/adaptive-lb/adaptive-lb/internal/simcli"
)

// The simulator alone must build without the operator's dependencies: they are what made the
// README's first command compile 1,160 packages. A package from one of these trees means an
// import crept into internal/sim, internal/simcli or what they import; `go list -deps
// ./cmd/simulate` and `go mod why -m MODULE` show which.
func TestSimulateMain_ImportsNoKubernetesPackage(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{"k8s.io/", "sigs.k8s.io/controller-runtime", "sigs.k8s.io/structured-merge-diff", "istio.io/",
		"github.com/prometheus/", "google.golang.org/grpc", "google.golang.org/protobuf",
		"github.com/adaptive-lb/adaptive-lb/internal/controller", "github.com/adaptive-lb/adaptive-lb/internal/metrics",
		"github.com/adaptive-lb/adaptive-lb/internal/whatif"}
	pkgs := strings.Fields(string(out))
	for _, pkg := range pkgs {
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("cmd/simulate depends on %s", pkg)
			}
		}
	}
	// About 210 today, standard library included; the operator's binary needs 1,160.
	if len(pkgs) > 300 {
		t.Errorf("cmd/simulate depends on %d packages; it needed about 210 when the README's first command was timed (docs/benchmarks.md)", len(pkgs))
	}
}

func TestSimulateMain_PrintsTheTable(t *testing.T) {
	var out, errb bytes.Buffer
	code := simcli.Execute(newCommand(), []string{"--duration", "40s", "--warmup", "10s", "--policies", "least_request,tail"}, &out, &errb)
	if code != simcli.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"Scenario seed-fib: 15 pods, 1500 rps", "least_request", "tail", "p99 ms", "Per pod", "fib29-0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errb.String(), "tail done in ") {
		t.Errorf("no progress line for tail on stderr: %q", errb.String())
	}
}

func TestSimulateMain_FromTSDBSaysWhichBinaryHasTheWhatIf(t *testing.T) {
	var out, errb bytes.Buffer
	code := simcli.Execute(newCommand(), []string{"--from-tsdb", "http://127.0.0.1:1"}, &out, &errb)
	if code != simcli.ExitUsageError || !strings.Contains(errb.String(), "go run ./cmd/adaptive-lb simulate --from-tsdb http://127.0.0.1:1") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if out.Len() != 0 {
		t.Fatalf("stdout %q", out.String())
	}
}

func TestSimulateMain_HelpHasNoHiddenFlagsAndNamesItsCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := simcli.Execute(newCommand(), []string{"--help"}, &out, &errb); code != simcli.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "--from-tsdb string") || !strings.Contains(out.String(), "go run ./cmd/simulate --policies") {
		t.Fatalf("help:\n%s", out.String())
	}
}

// The README's Quick start is two commands, and the first is this package: the one a new user
// runs before anything else must stay the light one.
func TestReadme_QuickStartsFirstCommandIsTheSimulatorAlone(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	_, quickStart, ok := strings.Cut(readme, "## Quick start\n")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	_, block, ok := strings.Cut(quickStart, "```sh\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("README.md's Quick start has no sh block")
	}
	var commands []string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		command, _, _ := strings.Cut(line, "#")
		commands = append(commands, strings.TrimSpace(command))
	}
	if len(commands) != 2 || commands[0] != "go run ./cmd/simulate" || commands[1] != "make test" {
		t.Fatalf("the Quick start's commands are %q, want [go run ./cmd/simulate, make test]", commands)
	}
}
