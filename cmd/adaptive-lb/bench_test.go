package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

func TestBench_RunsTheSuiteAndRewritesOnlyTheGeneratedBlock(t *testing.T) {
	dir := t.TempDir()
	suite := filepath.Join(dir, "suite")
	if err := os.Mkdir(suite, 0o755); err != nil {
		t.Fatal(err)
	}
	scenario := "name: tiny\nduration: 30s\nwarmup: 5s\nload: {rps: 200}\nclients: {proxies: 4}\ncontroller: {interval: 5s}\n" +
		"pods:\n  - {name: fast, replicas: 2, workers: 4, cpu_limit: 1, cost: {mean: 2ms}}\n  - {name: slow, replicas: 2, workers: 4, cpu_limit: 1, speed: 0.5, cost: {mean: 2ms}}\n"
	if err := os.WriteFile(filepath.Join(suite, "tiny.yaml"), []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "bench.md")
	before := "# Hand-written\n\nkeep me\n\n" + benchBegin + "\nold table\n" + benchEnd + "\n\ntrailer\n"
	if err := os.WriteFile(doc, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "bench", "--suite", suite, "--doc", doc, "--plots", filepath.Join(dir, "img"), "--policies", "least_request,oracle,capacity")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "| tiny |") || !strings.Contains(out, "p99 / oracle") || !strings.Contains(out, "best α at the edge") {
		t.Fatalf("output:\n%s", out)
	}
	got, _ := os.ReadFile(doc)
	s := string(got)
	if !strings.Contains(s, "keep me") || !strings.Contains(s, "trailer") || strings.Contains(s, "old table") || !strings.Contains(s, "| tiny |") {
		t.Fatalf("doc not rewritten in place:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(dir, "img", "bench-tiny.png")); err != nil {
		t.Fatalf("plot missing: %v", err)
	}
	if code, _, errOut := runCLI(t, "bench", "--suite", filepath.Join(dir, "none")); code != exitUsageError || !strings.Contains(errOut, "holds no scenario files") {
		t.Fatalf("empty suite: exit %d %q", code, errOut)
	}
}

// tinySuite writes a one-scenario suite that runs in well under a second.
func tinySuite(t *testing.T, dir string) string {
	t.Helper()
	suite := filepath.Join(dir, "suite")
	if err := os.MkdirAll(suite, 0o755); err != nil {
		t.Fatal(err)
	}
	scenario := "name: tiny\nduration: 30s\nwarmup: 5s\nload: {rps: 200}\nclients: {proxies: 4}\ncontroller: {interval: 5s}\n" +
		"pods:\n  - {name: fast, replicas: 2, workers: 4, cpu_limit: 1, cost: {mean: 2ms}}\n  - {name: slow, replicas: 2, workers: 4, cpu_limit: 1, speed: 0.5, cost: {mean: 2ms}}\n"
	if err := os.WriteFile(filepath.Join(suite, "tiny.yaml"), []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	return suite
}

func TestBench_WritesTheRepositoryDocsOnlyWithWriteDocs(t *testing.T) {
	dir := t.TempDir()
	suite := tinySuite(t, dir)
	repo := filepath.Join(dir, "repo")
	page := filepath.Join(repo, "docs", "benchmarks.md")
	if err := os.MkdirAll(filepath.Dir(page), 0o755); err != nil {
		t.Fatal(err)
	}
	before := "# Benchmarks\n\n" + benchBegin + "\nold table\n" + benchEnd + "\n"
	if err := os.WriteFile(page, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(repo)

	// No flags: the table goes to stdout and nothing in the current directory changes.
	code, out, errOut := runCLI(t, "bench", "--suite", suite, "--policies", "least_request,capacity")
	if code != exitOK || !strings.Contains(out, "| tiny |") {
		t.Fatalf("exit %d stderr %s stdout %s", code, errOut, out)
	}
	if got, _ := os.ReadFile(page); string(got) != before {
		t.Fatalf("bench without --write-docs rewrote %s:\n%s", page, got)
	}
	if _, err := os.Stat(filepath.Join(repo, "docs", "img")); !os.IsNotExist(err) {
		t.Fatalf("bench without --write-docs created docs/img (stat: %v)", err)
	}

	// --write-docs rewrites the page's generated block and writes the plots.
	code, _, errOut = runCLI(t, "bench", "--suite", suite, "--policies", "least_request,capacity", "--write-docs")
	if code != exitOK {
		t.Fatalf("--write-docs: exit %d: %s", code, errOut)
	}
	got, _ := os.ReadFile(page)
	if strings.Contains(string(got), "old table") || !strings.Contains(string(got), "| tiny |") || !strings.Contains(string(got), "bench --write-docs") {
		t.Fatalf("page not rewritten:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(repo, "docs", "img", "bench-tiny.png")); err != nil {
		t.Fatalf("plot missing: %v", err)
	}

	// --write-docs with its own paths is contradictory; outside a repository it says where to run it.
	if code, _, errOut := runCLI(t, "bench", "--suite", suite, "--write-docs", "--doc", "x.md"); code != exitUsageError || !strings.Contains(errOut, "pass either it or --doc/--plots") {
		t.Fatalf("--write-docs with --doc: exit %d %q", code, errOut)
	}
	t.Chdir(dir)
	if code, _, errOut := runCLI(t, "bench", "--suite", suite, "--write-docs"); code != exitUsageError || !strings.Contains(errOut, "run it from the repository root") {
		t.Fatalf("--write-docs outside the repository: exit %d %q", code, errOut)
	}
}

func TestBench_WritesAfterCountsOnlyTheWritesThatReachedTheClientsAfterTheWarmUp(t *testing.T) {
	r := &sim.Result{WeightWrites: 4, Weights: []sim.WeightPoint{{TimeS: 31}, {TimeS: 91}, {TimeS: 181}, {TimeS: 241}}}
	if got := writesAfter(r, 120); got != 2 {
		t.Fatalf("writes after a 120 s warm-up: %d, want 2 (those at 181 and 241 s)", got)
	}
	if got := writesAfter(r, 0); got != 4 {
		t.Fatalf("writes after no warm-up: %d, want all 4", got)
	}
}
