package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// twoScenarioSuite writes a suite of two short scenarios with different seeds in their files.
func twoScenarioSuite(t *testing.T, dir string) string {
	t.Helper()
	suite := tinySuite(t, dir)
	other := "name: other\nduration: 30s\nwarmup: 5s\nseed: 7\nload: {rps: 300}\nclients: {proxies: 2}\ncontroller: {interval: 5s}\n" +
		"pods:\n  - {name: fast, replicas: 3, workers: 4, cpu_limit: 1, cost: {mean: 2ms}}\n  - {name: slow, replicas: 1, workers: 4, cpu_limit: 1, speed: 0.4, cost: {mean: 2ms}}\n"
	if err := os.WriteFile(filepath.Join(suite, "other.yaml"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	return suite
}

// robustnessRows returns the rows of the robustness table in the bench's output.
func robustnessRows(t *testing.T, out string) []string {
	t.Helper()
	_, table, found := strings.Cut(out, "| scenario | seeds | tail / least_request: worst |")
	if !found {
		t.Fatalf("no robustness table in:\n%s", out)
	}
	var rows []string
	for _, line := range strings.Split(table, "\n")[2:] {
		if strings.HasPrefix(line, "| ") {
			rows = append(rows, line)
		}
	}
	return rows
}

func TestBench_SeedsAddsOneRobustnessRowPerScenarioFromEverySeedsRuns(t *testing.T) {
	suite := twoScenarioSuite(t, t.TempDir())
	const seeds = 3
	// --policies without tail: the sweep runs its three policies all the same.
	code, out, errOut := runCLI(t, "bench", "--suite", suite, "--policies", "least_request,capacity", "--seeds", "3")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rows := robustnessRows(t, out)
	if len(rows) != 2 {
		t.Fatalf("want one row per scenario (2), got %d:\n%s", len(rows), out)
	}
	// Each row must be what independent runs of the three policies under the seeds s..s+2 give.
	for i, file := range []string{"other.yaml", "tiny.yaml"} {
		sc, err := sim.LoadScenarioFile(filepath.Join(suite, file))
		if err != nil {
			t.Fatal(err)
		}
		var p99s []map[string]float64
		for k := range seeds {
			seeded := *sc
			seeded.Seed = sc.Seed + int64(k)
			p99 := map[string]float64{}
			for _, p := range seedPolicies {
				r, err := sim.Run(&seeded, p, sim.Options{})
				if err != nil {
					t.Fatal(err)
				}
				p99[p] = r.Latency.P99
			}
			p99s = append(p99s, p99)
		}
		lr, cp := seedRatios(p99s, sim.PolicyLeastRequest), seedRatios(p99s, sim.PolicyCapacity)
		want := fmt.Sprintf("| %s | %d – %d | %.2f | %.2f | %.2f | %.2f | %s | %s |", sc.Name, sc.Seed, sc.Seed+seeds-1,
			slices.Max(lr), median(lr), slices.Max(cp), median(cp), seedsAbove(lr, sc.Seed), seedsAbove(cp, sc.Seed))
		if rows[i] != want {
			t.Errorf("row %d:\n got %s\nwant %s", i, rows[i], want)
		}
	}
	if !strings.Contains(out, "Over 3 seeds") || !strings.Contains(out, "bench --write-docs --seeds 3") {
		t.Fatalf("robustness table not introduced or reproduce line without --seeds:\n%s", out)
	}
}

func TestBench_SeedsOutsideOneToTwentyIsRefused(t *testing.T) {
	suite := tinySuite(t, t.TempDir())
	for _, n := range []string{"0", "-2", "21"} {
		code, out, errOut := runCLI(t, "bench", "--suite", suite, "--seeds", n)
		if code != exitUsageError || !strings.Contains(errOut, "--seeds "+n+": give a number of seeds from 1") || out != "" {
			t.Errorf("--seeds %s: exit %d stdout %q stderr %q", n, code, out, errOut)
		}
	}
}

func TestBench_OneSeedPrintsAndWritesExactlyWhatTheBenchDidWithoutTheFlag(t *testing.T) {
	dir := t.TempDir()
	suite := twoScenarioSuite(t, dir)
	args := []string{"bench", "--suite", suite, "--policies", "least_request,oracle,capacity,tail"}
	_, without, _ := runCLI(t, args...)
	code, withOne, errOut := runCLI(t, append(args, "--seeds", "1")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if withOne != without || strings.Contains(without, "Over ") || strings.Contains(without, "--seeds") {
		t.Fatalf("--seeds 1 changed the output:\n%s\nwithout the flag:\n%s", withOne, without)
	}
	// With more seeds, everything before the robustness table is still seed s's tables.
	_, withThree, _ := runCLI(t, append(args, "--seeds", "3")...)
	head, _, _ := strings.Cut(withThree, "\nOver 3 seeds")
	reproduce := func(s string) string { _, rest, _ := strings.Cut(s, "\n"); return rest }
	if reproduce(head) != reproduce(without) {
		t.Fatalf("--seeds 3 changed the single-seed tables:\n%s\nwithout the flag:\n%s", head, without)
	}
	// The generated block of --doc is the printed output, so it too is unchanged at one seed.
	doc := filepath.Join(dir, "bench.md")
	for _, extra := range [][]string{nil, {"--seeds", "1"}} {
		if err := os.WriteFile(doc, []byte(benchBegin+"\nold\n"+benchEnd+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := runCLI(t, append(append(args, "--doc", doc), extra...)...); code != exitOK {
			t.Fatalf("--doc %v: exit %d: %s", extra, code, errOut)
		}
		if got, _ := os.ReadFile(doc); string(got) != benchBegin+"\n"+without+benchEnd+"\n" {
			t.Fatalf("--doc %v wrote:\n%s", extra, got)
		}
	}
}

func TestBench_MedianAndSeedsAboveOne(t *testing.T) {
	if got := median([]float64{1.3, 0.9, 1.1, 0.8}); got != 1.0 {
		t.Fatalf("median of four: %v, want 1.0 (the mean of the middle two)", got)
	}
	if got := median([]float64{1.3, 0.9, 1.1}); got != 1.1 {
		t.Fatalf("median of three: %v, want 1.1", got)
	}
	if got := seedsAbove([]float64{0.9, 1.04, 1, 1.2}, 3); got != "4 (1.040), 6 (1.200)" {
		t.Fatalf("seedsAbove: %q", got)
	}
	if got := seedsAbove([]float64{0.9, 1}, 3); got != "none" {
		t.Fatalf("seedsAbove with none above: %q", got)
	}
}
