package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// The series drawn with --seed 39 starts with a short two-class scenario (a step up at 3m53s over
// 8m10s), so that the end-to-end test stays within seconds.
const quickRandomSeed = "39"

func TestBenchRandom_ReportDoesNotDependOnTheWorkersAndKeepsRunnableWorstCases(t *testing.T) {
	dir := t.TempDir()
	args := []string{"bench", "--random", "1", "--seed", quickRandomSeed, "--seeds", "1"}
	code, one, errOut := runCLI(t, append(args, "--workers", "1")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	code, three, errOut := runCLI(t, append(args, "--workers", "3", "--keep-worst", dir)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	kept := filepath.Join(dir, "random-s39-000.yaml")
	if strings.ReplaceAll(three, "[random-s39-000]("+kept+")", "random-s39-000") != one {
		t.Fatalf("the report changed with the number of workers:\n%s\nwith one worker:\n%s", three, one)
	}
	for _, want := range []string{"| tail / least_request |", "| tail / capacity |", "| tail / peak-ewma |", "| 1 | [random-s39-000](" + kept + ") |", "bench --random 1 --seed 39 --seeds 1`"} {
		if !strings.Contains(three, want) {
			t.Errorf("report lacks %q:\n%s", want, three)
		}
	}
	// The kept file is a scenario a user can re-run: it loads, and it is the drawn one.
	data, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), "# Drawn by `adaptive-lb bench --random 1 --seed 39` (scenario 0)") {
		t.Fatalf("kept file does not say where it comes from:\n%s", data)
	}
	sc, err := sim.LoadScenarioFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	drawn, err := sim.GenerateScenario(39, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != drawn.Scenario.Name || sc.Seed != drawn.Scenario.Seed || len(sc.Load.Phases) != len(drawn.Scenario.Load.Phases) {
		t.Fatalf("kept scenario %s (seed %d) is not the drawn %s (seed %d)", sc.Name, sc.Seed, drawn.Scenario.Name, drawn.Scenario.Seed)
	}
}

func TestBenchRandom_FlagsThatDoNotApplyAreRefused(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"--seed without --random":       {[]string{"--seed", "4"}, "--seed applies to --random only"},
		"--keep-worst without --random": {[]string{"--keep-worst", "x"}, "--keep-worst applies to --random only"},
		"--policies with --random":      {[]string{"--random", "3", "--policies", "tail"}, "--policies applies to the suite; --random draws its own scenarios and runs least_request, capacity, peak-ewma, tail"},
		"--write-docs with --random":    {[]string{"--random", "3", "--write-docs"}, "--write-docs applies to the suite"},
		"no workers":                    {[]string{"--random", "3", "--workers", "0"}, "--workers 0: give from 1 to 64"},
		"too many scenarios":            {[]string{"--random", "10001"}, "--random 10001: give a number of scenarios from 1 to 10000"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"bench"}, c.args...)...)
			if code != exitUsageError || !strings.Contains(errOut, c.want) || out != "" {
				t.Fatalf("exit %d stdout %q stderr %q, want a usage error containing %q", code, out, errOut, c.want)
			}
		})
	}
}

func TestBenchRandom_WorstCasesAndQuantiles(t *testing.T) {
	mk := func(index int, runs ...[4]float64) randomCase {
		c := randomCase{index: index, writes: make([]int, len(runs))}
		for _, r := range runs {
			c.p99 = append(c.p99, map[string]float64{sim.PolicyLeastRequest: r[0], sim.PolicyCapacity: r[1], sim.PolicyPeakEWMA: r[2], sim.PolicyTail: r[3]})
		}
		return c
	}
	cases := []randomCase{
		mk(0, [4]float64{100, 50, 50, 40}, [4]float64{100, 50, 50, 45}), // never worse: 0.90 at worst
		mk(1, [4]float64{100, 50, 50, 60}, [4]float64{100, 50, 50, 40}), // 1.20 against capacity at seed 0
		mk(2, [4]float64{100, 90, 90, 50}, [4]float64{40, 80, 80, 60}),  // 1.50 against least_request at seed 1
	}
	worst := worstCases(cases, 2)
	if len(worst) != 2 || worst[0].index != 2 || worst[1].index != 1 {
		t.Fatalf("worst cases %d, %d; want scenarios 2 then 1", worst[0].index, worst[1].index)
	}
	if k, r := worst[0].worst(); k != 1 || math.Abs(r-1.5) > 1e-12 {
		t.Fatalf("scenario 2 worst at seed offset %d with %v; want offset 1 with 1.5", k, r)
	}
	xs := []float64{1, 2, 3, 4, 5}
	for q, want := range map[float64]float64{0: 1, 0.5: 3, 0.9: 4.6, 1: 5} {
		if got := quantileOf(xs, q); math.Abs(got-want) > 1e-12 {
			t.Errorf("quantile %v of 1..5 = %v, want %v", q, got, want)
		}
	}
	if got := countAbove([]float64{0.9, 1, 1.05, 1.2}, 1); got != 2 {
		t.Fatalf("countAbove 1: %d, want 2 (equal is not above)", got)
	}
}
