package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// loadCheckFleet imports two fresh pods and one stale pod (see internal/metrics for the same
// arithmetic): api-1 0.75 cores, 100 rps, 2 err/s, p99 95 ms; web-1 last scraped 60 s ago (the last 15 s step before now-50s).
func loadCheckFleet(t *testing.T, vm *vmtest.Server) time.Time {
	t.Helper()
	// An hour back: VictoriaMetrics with its default -search.latencyOffset answers queries for
	// the last 30 s as of 30 s ago; the checks evaluate at this time with --at.
	now := time.Now().Add(-time.Hour).Truncate(time.Second)
	from, step := now.Add(-5*time.Minute), 15*time.Second
	var b strings.Builder
	add := func(labels string, rate float64, end time.Time) {
		b.WriteString(vmtest.Counter(labels, rate, from, end, step))
	}
	add(`container_cpu_usage_seconds_total{namespace="shop",pod="api-1",container="app"}`, 0.5, now)
	add(`container_cpu_usage_seconds_total{namespace="shop",pod="api-1",container="worker"}`, 0.25, now)
	add(`container_cpu_usage_seconds_total{namespace="shop",pod="api-1",container="istio-proxy"}`, 5, now)
	add(`istio_requests_total{reporter="destination",namespace="shop",pod="api-1",response_code="200"}`, 98, now)
	add(`istio_requests_total{reporter="destination",namespace="shop",pod="api-1",response_code="503"}`, 2, now)
	for le, rate := range map[string]float64{"10": 50, "50": 90, "100": 100, "+Inf": 100} {
		add(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace="shop",pod="api-1",le=%q}`, le), rate, now)
	}
	add(`container_cpu_usage_seconds_total{namespace="pay",pod="web-1",container="app"}`, 0.2, now.Add(-50*time.Second))
	add(`istio_requests_total{reporter="destination",namespace="pay",pod="web-1",response_code="200"}`, 10, now.Add(-50*time.Second))
	vm.ImportText(t, b.String())
	return now
}

// squash collapses runs of spaces so table rows can be matched regardless of column widths.
func squash(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

func TestMetricsCheck_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	at := loadCheckFleet(t, vm).Format(time.RFC3339)

	t.Run("prints the queries and one row per discovered pod", func(t *testing.T) {
		code, stdout, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--window", "2m", "--interval", "10s", "--at", at)
		if code != exitOK {
			t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, stdout)
		}
		out := squash(stdout)
		for _, want := range []string{
			`sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{namespace=~".+", pod=~".+", container!="", container!="POD", container!="istio-proxy"}[2m]))`,
			"stale after 20s",
			"shop api-1 0.750 100.00 2.00 95ms",
			"pay web-1 0.200 10.00 0.00 - 1m0s stale: cpu,requestRate,errorRate; missing: latencyP99",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, stdout)
			}
		}
		if !strings.Contains(out, "shop api-1 0.750 100.00 2.00 95ms 0s fresh\n") {
			t.Errorf("api-1 must be fresh:\n%s", stdout)
		}
		// The fleet's TSDB does not scrape istiod: what --mesh-multi-cluster=auto would then do.
		if !strings.Contains(out, "cannot be read") || !strings.Contains(out, "refuses every Service (MultiCluster) unless the TSDB scrapes istiod's metrics") {
			t.Errorf("the output does not say that istiod's count of its remote clusters is missing, and what follows:\n%s", stdout)
		}
	})

	t.Run("shows istiod's count of its remote clusters", func(t *testing.T) {
		parsed, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatal(err)
		}
		vm.ImportText(t, fmt.Sprintf("istiod_managed_clusters{cluster_type=\"remote\",namespace=\"istio-system\",pod=\"istiod-7d9f\"} 0 %d\n", parsed.Add(-15*time.Second).UnixMilli()))
		code, stdout, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--at", at)
		if code != exitOK {
			t.Fatalf("exit %d\nstderr: %s", code, stderr)
		}
		if !strings.Contains(squash(stdout), "which --mesh-multi-cluster=auto needs:\nistio-system/istiod-7d9f 0\n") {
			t.Errorf("the output does not list istiod's count:\n%s", stdout)
		}
	})

	// Samples scraped every 5 s up to the wall clock, checked now.
	live := time.Now().Truncate(time.Second)
	vm.ImportText(t, vmtest.Counter(`container_cpu_usage_seconds_total{namespace="live",pod="api-1",container="app"}`, 0.5, live.Add(-5*time.Minute), live, 5*time.Second)+
		vmtest.Counter(`istio_requests_total{reporter="destination",namespace="live",pod="api-1",response_code="200"}`, 100, live.Add(-5*time.Minute), live, 5*time.Second))

	t.Run("by default the newest samples are read: fresh at a 5s interval", func(t *testing.T) {
		code, stdout, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "live", "--interval", "5s")
		if code != exitOK {
			t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, stdout)
		}
		if !strings.Contains(stdout, "latency offset 0s") || strings.Contains(stdout, "Every pod is stale") || !strings.Contains(squash(stdout), "live api-1 0.500 100.00") {
			t.Errorf("want api-1 read up to now and fresh at a 5s interval:\n%s", stdout)
		}
	})

	t.Run("without latency_offset, at a short interval: every pod stale, and what to set", func(t *testing.T) {
		// VictoriaMetrics answers 30 s back.
		code, stdout, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "live", "--interval", "5s", "--latency-offset", "none")
		if code != exitOK {
			t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr, stdout)
		}
		for _, want := range []string{"latency offset none", "accepts samples up to 10s old", "Every pod is stale", "No latency_offset argument was sent", "-search.latencyOffset", "default interval, 30s, allows 1m0s"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("output lacks %q:\n%s", want, stdout)
			}
		}
		code, stdout, _ = runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "live", "--latency-offset", "none")
		if code != exitOK || strings.Contains(stdout, "Every pod is stale") || !strings.Contains(stdout, "accepts samples up to 1m0s old") {
			t.Errorf("at the default 30s interval the pod is fresh; exit %d:\n%s", code, stdout)
		}
	})

	t.Run("the newest data asked for and still every pod stale: the scrape is too rare for the interval", func(t *testing.T) {
		code, stdout, _ := runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "pay", "--window", "2m", "--interval", "10s", "--at", at)
		if code != exitOK || !strings.Contains(stdout, "Every pod is stale") || !strings.Contains(stdout, "The newest data was asked for") {
			t.Errorf("exit %d:\n%s", code, stdout)
		}
	})

	t.Run("--namespace narrows the queries", func(t *testing.T) {
		code, stdout, _ := runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "shop", "--window", "2m", "--at", at)
		if code != exitOK || strings.Contains(stdout, "web-1") || !strings.Contains(stdout, `namespace=~"shop"`) {
			t.Errorf("exit %d:\n%s", code, stdout)
		}
	})

	t.Run("a namespace without series exits 1 with a clear message", func(t *testing.T) {
		code, _, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--namespace", "nothing-here", "--at", at)
		if code != exitFailure || !strings.Contains(stderr, "returned no pod series for namespace(s) nothing-here") {
			t.Errorf("exit %d, stderr %s", code, stderr)
		}
	})

	t.Run("a rejected query exits 1 and names the problem", func(t *testing.T) {
		code, _, stderr := runCLI(t, "metrics", "check", "--url", vm.URL, "--query-cpu", "sum(", "--at", at)
		if code != exitFailure || !strings.Contains(stderr, "HTTP 422") || !strings.Contains(stderr, "fix the query template") {
			t.Errorf("exit %d, stderr %s", code, stderr)
		}
	})

	t.Run("an unreachable TSDB exits 1 and says so", func(t *testing.T) {
		vm.Stop()
		code, _, stderr := runCLI(t, "metrics", "check", "--url", vm.URL)
		if code != exitFailure || !strings.Contains(stderr, "TSDB unreachable") || !strings.Contains(stderr, "6 of 6 queries failed") {
			t.Errorf("exit %d, stderr %s", code, stderr)
		}
	})
}

func TestMetricsCheck_BadFlagsExit2(t *testing.T) {
	cases := map[string][]string{
		"missing url":           {"metrics", "check"},
		"url without a scheme":  {"metrics", "check", "--url", "localhost:8428"},
		"header without value":  {"metrics", "check", "--url", "http://x", "--header", "X-Scope-OrgID"},
		"zero window":           {"metrics", "check", "--url", "http://x", "--window", "0s"},
		"broken query template": {"metrics", "check", "--url", "http://x", "--query-cpu", "{{.Window"},
		"cert without key":      {"metrics", "check", "--url", "http://x", "--tls-cert-file", "c.pem"},
		"unparsable --at":       {"metrics", "check", "--url", "http://x", "--at", "yesterday"},
		"unknown flag":          {"metrics", "check", "--url", "http://x", "--nope"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCLI(t, args...)
			if code != exitUsageError || stderr == "" {
				t.Errorf("exit %d, stderr %q", code, stderr)
			}
		})
	}
}

func TestMetricsCheck_BadLatencyOffsetSaysWhatToWrite(t *testing.T) {
	cases := map[string]struct {
		value, want string
	}{
		"a word":           {"off", `--latency-offset: latency offset "off": want a duration such as 0s (read the newest data) or 5s, or "none" to send no latency_offset argument`},
		"negative":         {"-1s", `--latency-offset: latency offset -1s must not be negative: 0s reads the newest data; use "none"`},
		"below 1 ms":       {"100us", `--latency-offset: latency offset 100µs: VictoriaMetrics counts it in whole milliseconds`},
		"a Prometheus day": {"1d", `latency offset "1d": want a duration`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCLI(t, "metrics", "check", "--url", "http://127.0.0.1:1", "--latency-offset", tc.value)
			if code != exitUsageError || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, exitUsageError, tc.want)
			}
		})
	}
}
