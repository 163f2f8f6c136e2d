package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSimulate_DefaultScenarioPrintsATableForEachPolicy(t *testing.T) {
	// The default policies on the built-in scenario, shortened so the test stays quick.
	code, out, errOut := runCLI(t, "simulate", "--duration", "90s", "--warmup", "30s")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{"Scenario seed-fib: 15 pods, 1500 rps", "least_request", "cpu-distance", "capacity", "p99 ms", "fib29-0", "Per pod"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(errOut, "simulating") {
		t.Errorf("progress printed although stderr is not a terminal: %q", errOut)
	}
}

func TestSimulate_JSONAndPlotFiles(t *testing.T) {
	dir := t.TempDir()
	jsonPath, pngPath, svgPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.png"), filepath.Join(dir, "r.svg")
	code, _, errOut := runCLI(t, "simulate", "--duration", "60s", "--warmup", "20s", "--policies", "least_request,capacity", "--json", jsonPath, "--plot", pngPath, "--seed", "7")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc map[string]any
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	if doc["scenario"] != "seed-fib" || doc["seed"] != float64(7) {
		t.Fatalf("scenario/seed = %v/%v", doc["scenario"], doc["seed"])
	}
	results := doc["results"].([]any)
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	first := results[0].(map[string]any)
	for _, key := range []string{"policy", "latency_ms", "total_cpu", "requests", "weight_writes", "pods"} {
		if _, ok := first[key]; !ok {
			t.Errorf("result lacks %q", key)
		}
	}
	for _, key := range []string{"p50", "p90", "p95", "p99", "p999", "mean"} {
		if _, ok := first["latency_ms"].(map[string]any)[key]; !ok {
			t.Errorf("latency_ms lacks %q", key)
		}
	}
	pod := first["pods"].([]any)[0].(map[string]any)
	for _, key := range []string{"name", "rps", "cpu", "latency_ms", "final_weight"} {
		if _, ok := pod[key]; !ok {
			t.Errorf("pod lacks %q", key)
		}
	}
	png, err := os.ReadFile(pngPath)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("plot is not a PNG (err %v)", err)
	}
	code, _, errOut = runCLI(t, "simulate", "--duration", "30s", "--warmup", "10s", "--policies", "capacity", "--plot", svgPath)
	if code != exitOK {
		t.Fatalf("svg: exit %d: %s", code, errOut)
	}
	if svg, _ := os.ReadFile(svgPath); !bytes.Contains(svg, []byte("<svg")) {
		t.Fatal("plot is not an SVG")
	}
}

func TestSimulate_BadInputExitsTwoWithAClearMessage(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	negative := write("negative.yaml", "name: x\nduration: 60s\nload: {rps: -1}\npods: [{name: a, replicas: 1, cost: {mean: 1ms}}]\n")
	unknown := write("unknown.yaml", "name: x\nduration: 60s\nload: {rps: 1}\nfoo: 1\npods: [{name: a, replicas: 1, cost: {mean: 1ms}}]\n")
	cases := map[string]struct {
		args []string
		want string
	}{
		"negative rps":       {[]string{"simulate", "--scenario", negative}, "scenario " + negative + ": field load.rps: -1 must be a positive request rate"},
		"unknown field":      {[]string{"simulate", "--scenario", unknown}, `unknown field "foo"`},
		"missing file":       {[]string{"simulate", "--scenario", filepath.Join(dir, "nope.yaml")}, "cannot read it"},
		"unknown policy":     {[]string{"simulate", "--policies", "least_request,fastest"}, `policy "fastest" is unknown; valid policies are round_robin, random, least_request, cpu-distance, capacity`},
		"warm-up too long":   {[]string{"simulate", "--duration", "60s"}, "the warm-up 2m0s must be shorter than the duration 1m0s"},
		"bad plot extension": {[]string{"simulate", "--plot", "out.gif"}, `--plot "out.gif" must end in .png or .svg`},
		"unknown flag":       {[]string{"simulate", "--fast"}, "unknown flag: --fast"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != exitUsageError {
				t.Fatalf("exit %d, want %d (stderr %q)", code, exitUsageError, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Fatalf("stderr %q lacks %q", errOut, tc.want)
			}
			if strings.Contains(out, "p99") {
				t.Fatalf("a table was printed despite the error:\n%s", out)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != exitOK || !strings.HasPrefix(out, "adaptive-lb ") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

func TestSimulate_NoMetricsLagReadsEveryCounterEachSecondAndSaysSo(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args       []string
		header     string
		scrape     string
		offsetJSON string
	}{
		{nil, "metrics scraped every 15s, adaptive-lb reading the newest data (ingested 4s after each scrape), the published rules 30s in the past", "15s", "30s"},
		{[]string{"--no-metrics-lag"}, "metrics without lag", "1s", "0s"},
	} {
		jsonPath := filepath.Join(dir, "r.json")
		args := append([]string{"simulate", "--duration", "40s", "--warmup", "10s", "--policies", "capacity", "--json", jsonPath}, c.args...)
		code, out, errOut := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", c.args, code, errOut)
		}
		if !strings.Contains(out, "; "+c.header+"\n") {
			t.Errorf("%v: the header does not say %q:\n%s", c.args, c.header, out)
		}
		var doc struct {
			Metrics struct {
				ScrapeInterval string `json:"scrape_interval"`
				LatencyOffset  string `json:"latency_offset"`
			} `json:"metrics"`
		}
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Metrics.ScrapeInterval != c.scrape || doc.Metrics.LatencyOffset != c.offsetJSON {
			t.Errorf("%v: JSON metrics %+v, want scrape %s and offset %s", c.args, doc.Metrics, c.scrape, c.offsetJSON)
		}
	}
}
