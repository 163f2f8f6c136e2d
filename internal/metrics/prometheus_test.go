package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

const (
	testWindow   = 2 * time.Minute
	testInterval = 10 * time.Second
)

// loadFleet imports a small fleet into VictoriaMetrics and returns the evaluation time. Every
// counter grows linearly, so the expected rates below are exact:
//
//	shop/api-1    cpu app 0.5 + worker 0.25 (POD, istio-proxy and "" excluded) = 0.75 cores
//	              requests 98 (200) + 2 (503) = 100 rps, errors 2 rps
//	              latency buckets le10:50 le50:90 le100:100 → p99 = 50+50*(99-90)/10 = 95 ms
//	shop/api-2    cpu 1.5 cores, 50 rps, no 5xx series at all → 0 errors, every request ≤10 ms
//	              → p99 = 10*49.5/50 = 9.9 ms
//	pay.eu/web-1  cpu 0.2 cores, 10 rps, last scraped 50 s before now (stale at a 10 s interval)
func loadFleet(t *testing.T, vm *vmtest.Server) time.Time {
	t.Helper()
	// An hour back: VictoriaMetrics with its default -search.latencyOffset answers queries for
	// the last 30 s as of 30 s ago (see TestFetch_StockVictoriaMetricsAnswersInThePast).
	now := time.Now().Add(-time.Hour).Truncate(time.Second)
	from, step := now.Add(-5*time.Minute), 15*time.Second
	staleEnd := now.Add(-50 * time.Second)
	var b strings.Builder
	cpu := func(ns, pod, container string, cores float64, end time.Time) {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`container_cpu_usage_seconds_total{namespace=%q,pod=%q,container=%q}`, ns, pod, container), cores, from, end, step))
	}
	requests := func(ns, pod, reporter, code string, rps float64, end time.Time) {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_requests_total{reporter=%q,namespace=%q,pod=%q,response_code=%q}`, reporter, ns, pod, code), rps, from, end, step))
	}
	buckets := func(ns, pod string, perBucket map[string]float64) {
		for le, rate := range perBucket {
			b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace=%q,pod=%q,le=%q}`, ns, pod, le), rate, from, now, step))
		}
	}
	cpu("shop", "api-1", "app", 0.5, now)
	cpu("shop", "api-1", "worker", 0.25, now)
	cpu("shop", "api-1", "POD", 3, now)
	cpu("shop", "api-1", "istio-proxy", 5, now)
	cpu("shop", "api-1", "", 9, now)
	cpu("shop", "api-2", "app", 1.5, now)
	cpu("pay.eu", "web-1", "app", 0.2, staleEnd)
	requests("shop", "api-1", "destination", "200", 98, now)
	requests("shop", "api-1", "destination", "503", 2, now)
	requests("shop", "api-1", "source", "200", 1000, now)
	requests("shop", "api-2", "destination", "200", 50, now)
	requests("pay.eu", "web-1", "destination", "200", 10, staleEnd)
	buckets("shop", "api-1", map[string]float64{"10": 50, "50": 90, "100": 100, "+Inf": 100})
	buckets("shop", "api-2", map[string]float64{"10": 50, "50": 50, "100": 50, "+Inf": 50})
	vm.ImportText(t, b.String())
	return now
}

func newTestSource(t *testing.T, cfg Config) (*prometheusSource, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	src, err := New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	return src.(*prometheusSource), reg
}

func fleetPods() []Pod {
	return []Pod{
		{Namespace: "shop", Name: "api-1", IP: "10.0.0.1", CPULimitCores: 2},
		{Namespace: "shop", Name: "api-2", IP: "10.0.0.2", CPULimitCores: 4},
		{Namespace: "pay.eu", Name: "web-1", IP: "10.0.1.1"},
		{Namespace: "shop", Name: "ghost", IP: "10.0.0.9"},
	}
}

func assertValue(t *testing.T, what string, s Sample, want float64) {
	t.Helper()
	if !s.Present || math.Abs(s.Value-want) > 1e-6 {
		t.Errorf("%s = %+v, want %v", what, s, want)
	}
}

func TestPrometheusSource_Fetch_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	now := loadFleet(t, vm)
	src, _ := newTestSource(t, Config{URL: vm.URL})

	batch, err := src.Fetch(context.Background(), Request{Pods: fleetPods(), Now: now, Window: testWindow, Interval: testInterval})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if len(batch.Observations) != 4 {
		t.Fatalf("%d observations", len(batch.Observations))
	}
	api1, api2, web1, ghost := batch.Observations[0], batch.Observations[1], batch.Observations[2], batch.Observations[3]

	t.Run("values are the hand-computed rates", func(t *testing.T) {
		assertValue(t, "api-1 cpu", api1.CPUCores, 0.75)
		assertValue(t, "api-1 rps", api1.RequestRate, 100)
		assertValue(t, "api-1 errors", api1.ErrorRate, 2)
		assertValue(t, "api-1 p99", api1.LatencyP99Seconds, 0.095)
		assertValue(t, "api-2 cpu", api2.CPUCores, 1.5)
		assertValue(t, "api-2 rps", api2.RequestRate, 50)
		assertValue(t, "api-2 errors (no 5xx series)", api2.ErrorRate, 0)
		assertValue(t, "api-2 p99", api2.LatencyP99Seconds, 0.0099)
	})
	t.Run("scraped pods are fresh, stamped with their newest sample", func(t *testing.T) {
		for _, obs := range []Observation{api1, api2} {
			for _, signal := range Signals {
				s := obs.Sample(signal)
				if !s.Usable() || !s.Timestamp.Equal(now) {
					t.Errorf("%s %s: %+v", obs.Name, signal, *s)
				}
			}
		}
	})
	t.Run("a pod last scraped 50s ago is stale at a 10s interval", func(t *testing.T) {
		assertValue(t, "web-1 cpu", web1.CPUCores, 0.2)
		for _, s := range []Sample{web1.CPUCores, web1.RequestRate} {
			if s.Fresh || !errors.Is(s.Err, ErrStale) || s.Usable() {
				t.Errorf("web-1: %+v", s)
			}
		}
		if web1.LatencyP99Seconds.Present || !errors.Is(web1.LatencyP99Seconds.Err, ErrNoData) {
			t.Errorf("web-1 has no histogram: %+v", web1.LatencyP99Seconds)
		}
	})
	t.Run("a pod the TSDB does not know has no data", func(t *testing.T) {
		for _, signal := range Signals {
			if s := ghost.Sample(signal); s.Present || !errors.Is(s.Err, ErrNoData) {
				t.Errorf("ghost %s: %+v", signal, *s)
			}
		}
	})
	t.Run("the pod spec's CPU limit and IP pass through", func(t *testing.T) {
		if api2.CPULimitCores != 4 || api2.IP != "10.0.0.2" {
			t.Errorf("api-2 pod %+v", api2.Pod)
		}
	})
	t.Run("one query per signal, the two freshness probes and the latency histogram", func(t *testing.T) {
		var names []string
		for _, q := range batch.Queries {
			names = append(names, q.Name)
		}
		if got := strings.Join(names, ","); got != "cpu,freshness,requestRate,freshness,errorRate,latencyP99,latencyHistogram" {
			t.Errorf("queries %s", got)
		}
		want, _ := RenderQuery("cpu", DefaultCPUQuery, NewTemplateData([]string{"shop", "pay.eu"}, "", testWindow, DefaultLabels))
		if batch.Queries[0].Text != want {
			t.Errorf("cpu query %s, want %s", batch.Queries[0].Text, want)
		}
	})
}

// countingProxy forwards to target and counts the query requests it sees.
func countingProxy(t *testing.T, target string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/api/v1/query") {
			n.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

func TestPrometheusSource_QueriesPerCycleDoNotGrowWithServices(t *testing.T) {
	vm := vmtest.Start(t)
	now := loadFleet(t, vm)
	proxyURL, requests := countingProxy(t, vm.URL)
	src, _ := newTestSource(t, Config{URL: proxyURL})

	count := func(pods []Pod) int64 {
		t.Helper()
		requests.Store(0)
		batch, err := src.Fetch(context.Background(), Request{Pods: pods, Now: now, Window: testWindow, Interval: testInterval})
		if err != nil && !errors.Is(err, ErrNoData) {
			t.Fatal(err)
		}
		if len(batch.Observations) != len(pods) {
			t.Fatalf("%d observations for %d pods", len(batch.Observations), len(pods))
		}
		return requests.Load()
	}
	one := count(fleetPods()[:1])
	// 500 Services, each alone in its own namespace, plus the real fleet.
	many := fleetPods()
	for i := range 500 {
		many = append(many, Pod{Namespace: fmt.Sprintf("team-%03d", i), Name: "svc-0"})
	}
	fiveHundred := count(many)
	if one != 7 || fiveHundred != one {
		t.Errorf("HTTP query requests per cycle: %d for 1 Service, %d for 500; want 7 for both", one, fiveHundred)
	}
}

func TestPrometheusSource_Overrides_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	now := loadFleet(t, vm)
	proxyURL, requests := countingProxy(t, vm.URL)
	src, _ := newTestSource(t, Config{URL: proxyURL})

	// api-1's AdaptiveLoadBalancer counts only the "app" container and forgets to aggregate its
	// request rate; api-2 and web-1 use the defaults.
	override := QueryTemplates{
		CPU:         `sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{namespace=~"{{.Namespaces}}", container="app"}[{{.Window}}]))`,
		RequestRate: `rate(istio_requests_total{reporter="destination", namespace=~"{{.Namespaces}}"}[{{.Window}}])`,
	}
	pods := fleetPods()[:3]
	pods[0].Queries = override
	batch, err := src.Fetch(context.Background(), Request{Pods: pods, Now: now, Window: testWindow, Interval: testInterval})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("pods sharing a template set share one query per signal", func(t *testing.T) {
		if got := requests.Load(); got != 9 {
			t.Errorf("%d queries, want 9 (7 + one per overridden signal)", got)
		}
	})
	t.Run("the override applies only to its pods", func(t *testing.T) {
		assertValue(t, "api-1 cpu (app only)", batch.Observations[0].CPUCores, 0.5)
		assertValue(t, "api-2 cpu (default)", batch.Observations[1].CPUCores, 1.5)
		assertValue(t, "api-2 rps (default)", batch.Observations[1].RequestRate, 50)
	})
	t.Run("an unaggregated query gives two series for api-1: the pod fails, nothing is summed", func(t *testing.T) {
		var dup *DuplicateSeriesError
		if s := batch.Observations[0].RequestRate; s.Present || !errors.As(s.Err, &dup) || len(dup.Series) != 2 {
			t.Errorf("api-1 rps: %+v", s)
		}
	})
}

func TestPrometheusSource_Faults_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	now := loadFleet(t, vm)
	req := Request{Pods: fleetPods()[:2], Now: now, Window: testWindow, Interval: testInterval}

	t.Run("an invalid query fails its signal only, as an invalid-query HTTP error", func(t *testing.T) {
		src, _ := newTestSource(t, Config{URL: vm.URL})
		bad := req
		bad.Pods = []Pod{req.Pods[0], req.Pods[1]}
		bad.Pods[0].Queries = QueryTemplates{LatencyP99: `histogram_quantile(0.99, sum by (namespace, pod, le) (`}
		batch, err := src.Fetch(context.Background(), bad)
		var status *HTTPStatusError
		if !errors.Is(err, ErrInvalidQuery) || !errors.As(err, &status) || status.StatusCode != 422 {
			t.Fatalf("got %v", err)
		}
		if s := batch.Observations[0].LatencyP99Seconds; s.Present || !errors.Is(s.Err, ErrInvalidQuery) {
			t.Errorf("api-1 p99: %+v", s)
		}
		assertValue(t, "api-1 cpu still served", batch.Observations[0].CPUCores, 0.75)
		assertValue(t, "api-2 p99 (default query)", batch.Observations[1].LatencyP99Seconds, 0.0099)
	})

	t.Run("a wrong path prefix is an HTTP error pointing at the prefix", func(t *testing.T) {
		src, _ := newTestSource(t, Config{URL: vm.URL, PathPrefix: "/select/0/prometheus"})
		_, err := src.Fetch(context.Background(), req)
		var status *HTTPStatusError
		// VictoriaMetrics single-node answers unknown paths with 400 "unsupported path".
		if !errors.As(err, &status) || status.StatusCode != http.StatusBadRequest || errors.Is(err, ErrInvalidQuery) {
			t.Fatalf("got %v", err)
		}
		if !strings.Contains(err.Error(), "path prefix") {
			t.Errorf("message does not point at the path prefix: %v", err)
		}
	})

	t.Run("a namespace without series is no data for every query", func(t *testing.T) {
		src, _ := newTestSource(t, Config{URL: vm.URL})
		batch, err := src.Fetch(context.Background(), Request{Pods: []Pod{{Namespace: "empty", Name: "x"}}, Now: now, Window: testWindow, Interval: testInterval})
		var noData *NoDataError
		if !errors.As(err, &noData) || noData.Pod != "" {
			t.Fatalf("got %v", err)
		}
		if batch.Observations[0].CPUCores.Present {
			t.Error("no data must not be present")
		}
	})

	t.Run("stopping the server mid-run makes every signal unreachable and counts it", func(t *testing.T) {
		src, reg := newTestSource(t, Config{URL: vm.URL})
		if _, err := src.Fetch(context.Background(), req); err != nil {
			t.Fatalf("before stop: %v", err)
		}
		vm.Stop()
		batch, err := src.Fetch(context.Background(), req)
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("after stop: %v", err)
		}
		for _, obs := range batch.Observations {
			for _, signal := range Signals {
				if s := obs.Sample(signal); s.Present || !errors.Is(s.Err, ErrUnreachable) {
					t.Errorf("%s %s after stop: %+v", obs.Name, signal, *s)
				}
			}
		}
		if got := testutil.ToFloat64(src.metrics.errors.WithLabelValues("cpu", "unreachable")); got != 1 {
			t.Errorf("adaptivelb_metrics_query_errors_total{signal=cpu,reason=unreachable} = %v", got)
		}
		if n, err := testutil.GatherAndCount(reg, "adaptivelb_metrics_query_duration_seconds"); err != nil || n != 6 {
			t.Errorf("duration series: %d, %v (want one per query name)", n, err)
		}
	})
}

// A stock VictoriaMetrics (-search.latencyOffset=30s) answers a query for a time within 30 s
// of the wall clock as of 30 s ago. Samples scraped every 5 s up to now therefore look about
// 30 s old (less the time the import took): stale at a 5 s interval (limit 10 s), fresh at the
// default 30 s interval (limit 60 s). The stale ones are counted in
// adaptivelb_metrics_stale_samples_total.
func TestFetch_StockVictoriaMetricsAnswersInThePast(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Truncate(time.Second)
	from := now.Add(-5 * time.Minute)
	vm.ImportText(t, vmtest.Counter(`container_cpu_usage_seconds_total{namespace="shop",pod="api-1",container="app"}`, 0.5, from, now, 5*time.Second)+
		vmtest.Counter(`istio_requests_total{reporter="destination",namespace="shop",pod="api-1",response_code="200"}`, 100, from, now, 5*time.Second))
	src, _ := newTestSource(t, Config{URL: vm.URL})
	pods := []Pod{{Namespace: "shop", Name: "api-1"}}

	batch, _ := src.Fetch(context.Background(), Request{Pods: pods, Now: now, Window: time.Minute, Interval: 5 * time.Second})
	cpu := batch.Observations[0].CPUCores
	var stale *StaleError
	if !cpu.Present || cpu.Usable() || !errors.As(cpu.Err, &stale) || stale.Age < 20*time.Second {
		t.Fatalf("at a 5s interval the CPU sample should be present but stale by about the 30s offset: %+v", cpu)
	}
	if got := testutil.ToFloat64(src.metrics.stale.WithLabelValues(string(SignalCPU))); got != 1 {
		t.Errorf("adaptivelb_metrics_stale_samples_total{signal=cpu} = %v, want 1", got)
	}

	batch, _ = src.Fetch(context.Background(), Request{Pods: pods, Now: now, Window: time.Minute, Interval: 30 * time.Second})
	if cpu := batch.Observations[0].CPUCores; !cpu.Usable() {
		t.Fatalf("at the default 30s interval the CPU sample should be fresh: %+v", cpu)
	}
}

// The latency histogram comes back per pod from one query: each pod's cumulative buckets over
// the window, bounds converted from Istio's milliseconds to seconds, sorted, +Inf included.
func TestFetch_LatencyHistogramPerPod(t *testing.T) {
	vm := vmtest.Start(t)
	now := loadFleet(t, vm)
	src, _ := newTestSource(t, Config{URL: vm.URL})
	batch, err := src.Fetch(context.Background(), Request{Pods: fleetPods(), Now: now, Window: testWindow, Interval: testInterval})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	window := testWindow.Seconds()
	want := map[string][]LatencyBucket{
		"api-1": {{0.01, 50 * window}, {0.05, 90 * window}, {0.1, 100 * window}, {math.Inf(1), 100 * window}},
		"api-2": {{0.01, 50 * window}, {0.05, 50 * window}, {0.1, 50 * window}, {math.Inf(1), 50 * window}},
	}
	for _, obs := range batch.Observations {
		w, ok := want[obs.Name]
		if !ok {
			if len(obs.LatencyBuckets) != 0 || !errors.Is(obs.LatencyBucketsErr, ErrNoData) {
				t.Errorf("%s has no histogram series: buckets %v, error %v; want none and ErrNoData", obs.Name, obs.LatencyBuckets, obs.LatencyBucketsErr)
			}
			continue
		}
		if obs.LatencyBucketsErr != nil || len(obs.LatencyBuckets) != len(w) {
			t.Errorf("%s: buckets %v (error %v), want %v", obs.Name, obs.LatencyBuckets, obs.LatencyBucketsErr, w)
			continue
		}
		for i, b := range obs.LatencyBuckets {
			if b.UpperBoundSeconds != w[i].UpperBoundSeconds || math.Abs(b.Count-w[i].Count) > 0.01*w[i].Count {
				t.Errorf("%s bucket %d: %+v, want %+v (all %v)", obs.Name, i, b, w[i], obs.LatencyBuckets)
			}
		}
	}
	histograms := 0
	for _, q := range batch.Queries {
		if q.Name == histogramQueryName {
			histograms++
			if q.Series != 8 {
				t.Errorf("the histogram query returned %d series, want 8 (4 buckets of 2 pods)", q.Series)
			}
		}
	}
	if histograms != 1 {
		t.Errorf("%d histogram queries for 4 pods in 2 namespaces, want 1", histograms)
	}

	t.Run("disabled, no query is sent and no pod has buckets", func(t *testing.T) {
		off, _ := newTestSource(t, Config{URL: vm.URL, DisableLatencyHistogram: true})
		batch, err := off.Fetch(context.Background(), Request{Pods: fleetPods()[:2], Now: now, Window: testWindow, Interval: testInterval})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range batch.Queries {
			if q.Name == histogramQueryName {
				t.Errorf("histogram query sent while disabled: %s", q.Text)
			}
		}
		for _, obs := range batch.Observations {
			if obs.LatencyBuckets != nil || obs.LatencyBucketsErr != nil {
				t.Errorf("%s: buckets %v, error %v while disabled", obs.Name, obs.LatencyBuckets, obs.LatencyBucketsErr)
			}
		}
	})
}
