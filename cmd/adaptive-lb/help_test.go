package main

import (
	"regexp"
	"strings"
	"testing"
)

// A flag whose default is "the scenario's" or "when stderr is a terminal" must not also print a
// sentinel value such as -1ns, and an optional flag must not say it is required.
func TestHelp_SaysWhatEachDefaultIs(t *testing.T) {
	cases := map[string]struct {
		args    []string
		flag    string
		want    string
		notWant []string
	}{
		"simulate --warmup":                 {[]string{"simulate", "--help"}, "--warmup", "(default: the scenario's)", []string{"(default -1ns)", "(default 0s)"}},
		"simulate --progress":               {[]string{"simulate", "--help"}, "--progress", "(default: when stderr is a terminal)", []string{"(default true)", "(default false)"}},
		"run --tsdb-url":                    {[]string{"run", "--help"}, "--tsdb-url", "optional: without it endpoints are mirrored with equal weights", []string{"(required)"}},
		"metrics check --url":               {[]string{"metrics", "check", "--help"}, "--url", "(required)", nil},
		"run --tsdb-latency-offset":         {[]string{"run", "--help"}, "--tsdb-latency-offset", `0s reads the newest samples; none sends no argument`, nil},
		"run --tsdb-latency-offset default": {[]string{"run", "--help"}, "--tsdb-latency-offset", `(default "0s")`, nil},
		"bench --doc":                       {[]string{"bench", "--help"}, "--doc", "(default: none, the tables are only printed)", []string{"docs/benchmarks.md\")"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			line := regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(tc.flag) + ` .*$`).FindString(out)
			if line == "" {
				t.Fatalf("no %s in the help:\n%s", tc.flag, out)
			}
			if !strings.Contains(line, tc.want) {
				t.Errorf("%s help %q lacks %q", tc.flag, line, tc.want)
			}
			for _, bad := range tc.notWant {
				if strings.Contains(line, bad) {
					t.Errorf("%s help %q says %q", tc.flag, line, bad)
				}
			}
		})
	}
}

func TestSimulate_WarmupFlagOverridesTheScenarioOnlyWhenGiven(t *testing.T) {
	cases := map[string]struct {
		args       []string
		wantWarmup string
	}{
		"unset keeps the scenario's warm-up": {[]string{"--duration", "10m"}, ""},
		"zero is a real warm-up of zero":     {[]string{"--duration", "90s", "--warmup", "0s"}, "0s"},
		"set replaces it":                    {[]string{"--duration", "90s", "--warmup", "20s"}, "20s"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := &simulateOptions{}
			cmd := newSimulateCmdFor(o)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := cmd.PreRunE(cmd, nil); err != nil {
				t.Fatal(err)
			}
			if tc.wantWarmup == "" {
				if o.Scenario.Warmup.Duration <= 0 {
					t.Fatalf("the built-in scenario's warm-up was replaced by %v", o.Scenario.Warmup.Duration)
				}
				return
			}
			if got := o.Scenario.Warmup.Duration.String(); got != tc.wantWarmup {
				t.Fatalf("warm-up %s, want %s", got, tc.wantWarmup)
			}
		})
	}
	if code, _, errOut := runCLI(t, "simulate", "--warmup", "-5s"); code != exitUsageError || !strings.Contains(errOut, "--warmup -5s must not be negative") {
		t.Fatalf("negative warm-up: exit %d %q", code, errOut)
	}
}
