package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// outlierYAML is bench/scenarios/slow-outlier.yaml cut to five minutes: eleven fast pods and one
// ten times slower, behind thirty client sidecars.
const outlierYAML = `
name: outlier
duration: 300s
warmup: 60s
seed: 1
load: {rps: 666}
clients: {proxies: 30, workers: 2, network_latency: 2ms}
pods:
  - {name: fast, replicas: 11, workers: 4, cores: 4, cpu_limit: 1, speed: 1.0, cost: {mean: 10ms, dist: lognormal, cv: 0.6}}
  - {name: outlier, replicas: 1, workers: 4, cores: 4, cpu_limit: 1, speed: 0.1, cost: {mean: 10ms, dist: lognormal, cv: 0.6}}
`

// exportedSeries simulates the outlier scenario with the clients balancing by lb (a sim client
// policy) and returns the series a mesh would expose for it, in namespace "nsx" (inNamespace moves
// them) for Service "web", starting at start.
func exportedSeries(t *testing.T, lb string, start time.Time) string {
	t.Helper()
	sc, err := sim.ParseScenario([]byte(outlierYAML), "test")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: "nsx", Service: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Run(sc, lb, sim.Options{Metrics: rec}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rec.WriteText(&b, start); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// inNamespace moves exported series to namespace ns.
func inNamespace(series, ns string) string { return strings.ReplaceAll(series, "nsx", ns) }

// filterLines keeps the lines for which keep is true.
func filterLines(series string, keep func(line string) bool) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(series, "\n") {
		if line != "" && keep(line) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// sampleTime is a sample line's timestamp.
func sampleTime(line string) time.Time {
	f := strings.Fields(line)
	ms, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
	return time.UnixMilli(ms)
}

func whatIfArgs(url, service string, end time.Time, extra ...string) []string {
	return append([]string{"simulate", "--from-tsdb", url, "--service", service, "--window", "4m", "--at", end.UTC().Format(time.RFC3339)}, extra...)
}

func TestSimulateFromTSDB_FitsChecksAndPredicts(t *testing.T) {
	vm := vmtest.Start(t)
	start := time.Now().Add(-3 * time.Hour).Truncate(time.Minute)
	vm.ImportText(t, inNamespace(exportedSeries(t, sim.LBLeastRequest, start), "shop"))
	dir := t.TempDir()
	scenario, jsonPath, plot := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "web.json"), filepath.Join(dir, "web.png")
	code, out, errOut := runCLI(t, whatIfArgs(vm.URL, "shop/web", start.Add(5*time.Minute), "--write-scenario", scenario, "--json", jsonPath, "--plot", plot)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	for _, want := range []string{
		"What-if for Service shop/web",
		"Measured: 12 pods in 2 groups, called by 30 client proxies",
		"Assumed (not measured, not read from the cluster):",
		"the client sidecars balance with LEAST_REQUEST, Istio's default",
		"Model check: the policy in force (least_request)",
		"The model reproduces the measurements",
		"least_request", "capacity", "tail", "cpu-share",
		"Advice. On the window's own load",
		"The model, run under today's policy, reproduced the measured p99s within",
		"kind: AdaptiveLoadBalancer",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The fitted scenario is an ordinary scenario file with a comment per field.
	data, err := os.ReadFile(scenario)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cpu_limit: 1", "# kube-state-metrics: the pods' CPU limit", "proxies: 30", "# measured: client pods whose sidecars", "speed: 0.1"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("scenario file lacks %q:\n%s", want, data)
		}
	}
	for _, line := range strings.Split(string(data), "\n") {
		if field := regexp.MustCompile(`^\s*(-\s)?[a-z_]+: [^{]`); field.MatchString(line) && !strings.Contains(line, "#") && !strings.HasPrefix(strings.TrimSpace(line), "name:") && !strings.HasPrefix(strings.TrimSpace(line), "seed:") && !strings.HasPrefix(strings.TrimSpace(line), "- name:") {
			t.Errorf("scenario line %q says not where its value came from", line)
		}
	}
	if code, _, errOut := runCLI(t, "simulate", "--scenario", scenario, "--duration", "40s", "--warmup", "10s", "--policies", "least_request"); code != exitOK {
		t.Fatalf("the written scenario does not run: exit %d: %s", code, errOut)
	}
	var rep struct {
		Results []struct {
			Policy string `json:"policy"`
		} `json:"results"`
		WhatIf struct {
			Service string `json:"service"`
			Advice  string `json:"advice"`
			Check   []any  `json:"check"`
			Cost    struct {
				Chosen     string `json:"chosen"`
				Candidates []struct {
					Family string  `json:"family"`
					Score  float64 `json:"score"`
				} `json:"candidates"`
			} `json:"request_cost"`
		} `json:"what_if"`
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 4 || rep.WhatIf.Service != "web" || rep.WhatIf.Advice == "" || len(rep.WhatIf.Check) != 3 {
		t.Errorf("JSON report: %d results, service %q, advice %q, %d check rows", len(rep.Results), rep.WhatIf.Service, rep.WhatIf.Advice, len(rep.WhatIf.Check))
	}
	var families []string
	for _, c := range rep.WhatIf.Cost.Candidates {
		families = append(families, c.Family)
	}
	if rep.WhatIf.Cost.Chosen == "" || strings.Join(families, ",") != "exponential,gamma,lognormal,mixture" {
		t.Errorf("JSON report's request cost: chosen %q, candidates %v; want the chosen shape and the four families", rep.WhatIf.Cost.Chosen, families)
	}
	if !strings.Contains(out, "How each family fitted") || !strings.Contains(out, "  chosen") {
		t.Errorf("the output lacks the families' fit:\n%s", out)
	}
	if png, err := os.ReadFile(plot); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("no PNG plot (%v)", err)
	}
}

func TestSimulateFromTSDB_BadInputGetsAClearMessageAndNoPrediction(t *testing.T) {
	vm := vmtest.Start(t)
	start := time.Now().Add(-3 * time.Hour).Truncate(time.Minute)
	end := start.Add(5 * time.Minute)
	series := exportedSeries(t, sim.LBLeastRequest, start)

	// Under a minute: the last 45 s of the window only.
	vm.ImportText(t, inNamespace(filterLines(series, func(l string) bool {
		return strings.HasPrefix(l, "#") || !sampleTime(l).Before(end.Add(-45*time.Second))
	}), "short"))
	// No mesh: cAdvisor sees the pods, nothing else does.
	vm.ImportText(t, inNamespace(filterLines(series, func(l string) bool {
		return strings.HasPrefix(l, "container_cpu_usage_seconds_total")
	}), "plain"))
	// Missing CPU limits: kube-state-metrics without kube_pod_container_resource_limits.
	vm.ImportText(t, inNamespace(filterLines(series, func(l string) bool {
		return !strings.HasPrefix(l, "kube_pod_container_resource_limits")
	}), "nolimits"))
	// Mixed Istio versions: fast-0's sidecar reports the seconds histogram of Istio before 1.5.
	vm.ImportText(t, inNamespace(filterLines(series, func(l string) bool {
		return !(strings.HasPrefix(l, "istio_request_duration_milliseconds") && strings.Contains(l, `pod="fast-0"`))
	})+secondsHistogram(series, "fast-0"), "mixed"))
	// A client balancer other than the one assumed: round robin keeps sending the outlier its
	// twelfth of the load, which it cannot serve.
	vm.ImportText(t, inNamespace(exportedSeries(t, sim.LBRoundRobin, start), "rr"))

	cases := map[string]struct {
		service string
		want    []string
	}{
		"a Service with no metrics":                    {"empty/web", []string{"no metrics for the Service", "has no series for Service empty/web", "metrics check --namespace empty"}},
		"a window with under a minute of data":         {"short/web", []string{"too little data in the window", "widen --window"}},
		"a Service without a mesh":                     {"plain/web", []string{"the Service is not in the mesh", "none runs an istio-proxy sidecar", "istio-injection=enabled"}},
		"missing CPU limits":                           {"nolimits/web", []string{"CPU limits unknown", "fast-0", "--kubeconfig", "kube_pod_container_resource_limits"}},
		"mixed Istio versions":                         {"mixed/web", []string{"different Istio metric names", "fast-0 report istio_request_duration_seconds", "11 other pod(s)"}},
		"a model that disagrees with the measurements": {"rr/web", []string{"the model does not reproduce the measurements under least_request, so no gain is predicted", "the p99 of group outlier is", "Suspected: the split of requests between groups: group outlier ran at 100% of its CPU and queued far longer than simulated", "so the clients' balancer, least_request, is not what the real clients did: pass --kubeconfig"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, whatIfArgs(vm.URL, tc.service, end)...)
			if code != exitFailure {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitFailure, out, errOut)
			}
			t.Logf("%s", errOut)
			for _, want := range tc.want {
				if !strings.Contains(errOut, want) {
					t.Errorf("message lacks %q:\n%s", want, errOut)
				}
			}
			for _, never := range []string{"Prediction on the window's load", "Advice."} {
				if strings.Contains(out, never) {
					t.Errorf("printed %q despite the bad input:\n%s", never, out)
				}
			}
		})
	}
}

// secondsHistogram rewrites a pod's istio_request_duration_milliseconds series the way Istio
// before 1.5 named them: istio_request_duration_seconds, bounds and sum in seconds.
func secondsHistogram(series, pod string) string {
	var b strings.Builder
	le := regexp.MustCompile(`le="([^"]+)"`)
	for _, line := range strings.Split(series, "\n") {
		if !strings.HasPrefix(line, "istio_request_duration_milliseconds") || !strings.Contains(line, `pod="`+pod+`"`) {
			continue
		}
		line = strings.Replace(line, "istio_request_duration_milliseconds", "istio_request_duration_seconds", 1)
		line = le.ReplaceAllStringFunc(line, func(m string) string {
			v := le.FindStringSubmatch(m)[1]
			if v == "+Inf" {
				return m
			}
			f, _ := strconv.ParseFloat(v, 64)
			return `le="` + strconv.FormatFloat(f/1000, 'g', -1, 64) + `"`
		})
		if strings.HasPrefix(line, "istio_request_duration_seconds_sum") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[1], 64)
			line = f[0] + " " + strconv.FormatFloat(v/1000, 'g', -1, 64) + " " + f[2]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func TestSimulateFromTSDB_FlagsAreCheckedBeforeAnyQuery(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"no --service":                {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1"}, `--service "": want NAMESPACE/NAME`},
		"a Service without namespace": {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "web"}, `want NAMESPACE/NAME`},
		"a name that is not one":      {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/Web_1"}, `the name "Web_1" is not a Kubernetes name`},
		"--service alone":             {[]string{"simulate", "--service", "shop/web"}, "--service needs --from-tsdb URL"},
		"with --scenario":             {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/web", "--scenario", "x.yaml"}, "--scenario cannot be combined with --from-tsdb"},
		"a window too short":          {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/web", "--window", "90s"}, "--window 1m30s must be at least 2m0s"},
		"a bad --at":                  {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/web", "--at", "yesterday"}, `--at "yesterday": want an RFC 3339 time`},
		"a bad TSDB flag":             {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/web", "--tsdb-header", "nonsense"}, `--header "nonsense"`},
		"an URL that is none":         {[]string{"simulate", "--from-tsdb", "ftp://x", "--service", "shop/web"}, "scheme must be http or https"},
		"a bad latency offset":        {[]string{"simulate", "--from-tsdb", "http://127.0.0.1:1", "--service", "shop/web", "--tsdb-latency-offset", "soon"}, `--tsdb-latency-offset: latency offset "soon": want a duration`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code != exitUsageError || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errOut, exitUsageError, tc.want)
			}
		})
	}
}
