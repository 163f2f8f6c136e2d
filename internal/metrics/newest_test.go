package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// Tests of reading the newest data a stock VictoriaMetrics (-search.latencyOffset=30s) has, with
// samples stamped at the wall clock. Each evaluates at that wall-clock time, as the operator does.

// counterChangingRate writes a counter sampled every step from `from` to `to`, growing at
// before per second until change and at after per second from then on.
func counterChangingRate(labels string, before, after float64, from, change, to time.Time, step time.Duration) string {
	var b strings.Builder
	for ts := from; !ts.After(to); ts = ts.Add(step) {
		v := before * ts.Sub(from).Seconds()
		if ts.After(change) {
			v = before*change.Sub(from).Seconds() + after*ts.Sub(change).Seconds()
		}
		fmt.Fprintf(&b, "%s %g %d\n", labels, v, ts.UnixMilli())
	}
	return b.String()
}

// A pod's load quadruples 30 s before now. Without the argument VictoriaMetrics answers as of
// 30 s ago: the old rate, its newest sample 30 s old, stale at a 10 s interval. With
// latency_offset (0s, sent as 1ms) the same Fetch reads the new rate and a sample stamped now.
func TestFetch_LatencyOffsetReadsTheNewestSamples(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Truncate(time.Second)
	from, change, step := now.Add(-5*time.Minute), now.Add(-30*time.Second), 15*time.Second
	vm.ImportText(t, counterChangingRate(`container_cpu_usage_seconds_total{namespace="shop",pod="api-1",container="app"}`, 0.5, 2, from, change, now, step)+
		counterChangingRate(`istio_requests_total{reporter="destination",namespace="shop",pod="api-1",response_code="200"}`, 50, 200, from, change, now, step))
	req := Request{Pods: []Pod{{Namespace: "shop", Name: "api-1"}}, Now: now, Window: 20 * time.Second, Interval: 10 * time.Second}

	t.Run("without latency_offset the newest 30 s are not seen", func(t *testing.T) {
		src, _ := newTestSource(t, Config{URL: vm.URL})
		batch, _ := src.Fetch(context.Background(), req)
		obs := batch.Observations[0]
		assertValue(t, "cpu (the rate before the change)", obs.CPUCores, 0.5)
		assertValue(t, "requests (the rate before the change)", obs.RequestRate, 50)
		for _, s := range []Sample{obs.CPUCores, obs.RequestRate} {
			var stale *StaleError
			if !s.Timestamp.Equal(change) || !errors.As(s.Err, &stale) || s.Usable() {
				t.Errorf("want the sample of %s (30 s old), stale at a 10s interval: %+v", change.Format(time.TimeOnly), s)
			}
		}
	})
	t.Run("with latency_offset=0s they are", func(t *testing.T) {
		src, _ := newTestSource(t, Config{URL: vm.URL, LatencyOffset: ptr(time.Duration(0))})
		batch, err := src.Fetch(context.Background(), req)
		requireOnlyNoData(t, batch, err)
		obs := batch.Observations[0]
		assertValue(t, "cpu (the new rate)", obs.CPUCores, 2)
		assertValue(t, "requests (the new rate)", obs.RequestRate, 200)
		for _, s := range []Sample{obs.CPUCores, obs.RequestRate} {
			if !s.Timestamp.Equal(now) || !s.Usable() {
				t.Errorf("want the sample stamped now (%s), fresh: %+v", now.Format(time.TimeOnly), s)
			}
		}
	})
}

// requireOnlyNoData fails the test unless every failed query merely matched nothing (a fleet
// imported without latency histograms).
func requireOnlyNoData(t *testing.T, batch Batch, err error) {
	t.Helper()
	for _, q := range batch.Queries {
		if q.Err != nil && !errors.Is(q.Err, ErrNoData) {
			t.Fatalf("Fetch: %v", err)
		}
	}
}

// scrapedPod describes a pod's CPU and request series, scraped every step up to their own ends.
type scrapedPod struct {
	name string
	// requests maps a source workload to its request rate and the time of its newest visible
	// sample (the scrape at `now` of a half-visible scrape is missing from some series only).
	requests map[string]struct {
		rps float64
		end time.Time
	}
	cpu        float64
	cpuEnd     time.Time
	bucketsEnd time.Time
}

// loadScrapedPods writes the pods' cAdvisor and sidecar series, every step from `from`.
func loadScrapedPods(t *testing.T, vm *vmtest.Server, from time.Time, step time.Duration, pods []scrapedPod) {
	t.Helper()
	var b strings.Builder
	for _, p := range pods {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`container_cpu_usage_seconds_total{namespace="shop",pod=%q,container="app"}`, p.name), p.cpu, from, p.cpuEnd, step))
		total := 0.0
		for source, r := range p.requests {
			total += r.rps
			b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_requests_total{reporter="destination",namespace="shop",pod=%q,source_workload=%q,response_code="200"}`, p.name, source), r.rps, from, r.end, step))
		}
		if !p.bucketsEnd.IsZero() {
			// 60% of the requests within 10 ms, 90% within 50 ms, all within 100 ms.
			for le, share := range map[string]float64{"10": 0.6, "50": 0.9, "100": 1, "+Inf": 1} {
				b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace="shop",pod=%q,le=%q}`, p.name, le), share*total, from, p.bucketsEnd, step))
			}
		}
	}
	vm.ImportText(t, b.String())
}

type rateUntil = struct {
	rps float64
	end time.Time
}

// Read with latency_offset, a pod whose newest scrape the TSDB has not made visible yet (every
// series of it ends one scrape early) reads the same rate as a pod scraped up to now:
// VictoriaMetrics' rate() is the increase from the last sample before the window to the last
// one in it, over their time apart, with no extrapolation to the window's end. Its timestamp says
// how far its data reaches, for the weight cycle's window-coverage rule. Its latency histogram,
// an increase() over the same window, holds fewer requests, in the same shape.
func TestFetch_NewestData_APodWhoseNewestScrapeIsNotYetVisibleIsNotReadQuieter(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Truncate(time.Second)
	step := 15 * time.Second
	scrapedUntil := func(end time.Time) scrapedPod {
		return scrapedPod{
			requests: map[string]rateUntil{"checkout": {60, end}, "cart": {40, end}},
			cpu:      1, cpuEnd: end, bucketsEnd: end,
		}
	}
	complete, behind := scrapedUntil(now), scrapedUntil(now.Add(-step))
	complete.name, behind.name = "api-1", "api-2"
	loadScrapedPods(t, vm, now.Add(-5*time.Minute), step, []scrapedPod{complete, behind})

	src, _ := newTestSource(t, Config{URL: vm.URL, LatencyOffset: ptr(time.Duration(0))})
	batch, err := src.Fetch(context.Background(), Request{
		Pods: []Pod{{Namespace: "shop", Name: "api-1"}, {Namespace: "shop", Name: "api-2"}},
		Now:  now, Window: time.Minute, Interval: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	api1, api2 := batch.Observations[0], batch.Observations[1]
	for _, obs := range []Observation{api1, api2} {
		assertValue(t, obs.Name+" requests", obs.RequestRate, 100)
		assertValue(t, obs.Name+" cpu", obs.CPUCores, 1)
		assertValue(t, obs.Name+" p99", obs.LatencyP99Seconds, 0.095)
		if !obs.RequestRate.Usable() || !obs.CPUCores.Usable() {
			t.Errorf("%s must be usable: %+v / %+v", obs.Name, obs.RequestRate, obs.CPUCores)
		}
	}
	if got, want := api2.RequestRate.Timestamp, now.Add(-step); !got.Equal(want) {
		t.Errorf("api-2's request rate is stamped %s, want its newest visible scrape %s", got.Format(time.TimeOnly), want.Format(time.TimeOnly))
	}

	t.Run("its histogram holds fewer requests, in the same shape", func(t *testing.T) {
		total := func(o Observation) float64 { return o.LatencyBuckets[len(o.LatencyBuckets)-1].Count }
		if len(api1.LatencyBuckets) != 4 || len(api2.LatencyBuckets) != 4 {
			t.Fatalf("buckets %v / %v", api1.LatencyBuckets, api2.LatencyBuckets)
		}
		// 60 s of requests against 45 s: (now-15s) - (now-60s).
		if got := total(api2) / total(api1); math.Abs(got-0.75) > 0.01 {
			t.Errorf("api-2 has %.3f of api-1's requests, want 0.75", got)
		}
		for k := range api1.LatencyBuckets {
			s1, s2 := api1.LatencyBuckets[k].Count/total(api1), api2.LatencyBuckets[k].Count/total(api2)
			if math.Abs(s1-s2) > 0.005 {
				t.Errorf("bucket %v: share %.3f against %.3f", api1.LatencyBuckets[k].UpperBoundSeconds, s2, s1)
			}
		}
	})
}

// When the window holds a single scrape (scraped every 40 s, read over 30 s), a scrape that is
// only part visible leaves the series not yet updated with no sample in the window:
// VictoriaMetrics' rate() then drops it and the pod's sum would read half its load. The sidecar
// freshness probe reports the oldest of the pod's series' newest samples, 40 s old, so the pod is
// stale, never quieter; the pod whose scrape is wholly visible is read in full.
func TestFetch_NewestData_AHalfVisibleScrapeMakesThePodStaleNotQuieter(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Truncate(time.Second)
	step := 40 * time.Second
	loadScrapedPods(t, vm, now.Add(-10*step), step, []scrapedPod{
		{name: "web-1", cpu: 1, cpuEnd: now, requests: map[string]rateUntil{"checkout": {50, now}, "cart": {50, now}}},
		{name: "web-2", cpu: 1, cpuEnd: now, requests: map[string]rateUntil{"checkout": {50, now}, "cart": {50, now.Add(-step)}}},
	})

	src, _ := newTestSource(t, Config{URL: vm.URL, LatencyOffset: ptr(time.Duration(0))})
	batch, err := src.Fetch(context.Background(), Request{
		Pods: []Pod{{Namespace: "shop", Name: "web-1"}, {Namespace: "shop", Name: "web-2"}},
		Now:  now, Window: 30 * time.Second, Interval: 15 * time.Second,
	})
	requireOnlyNoData(t, batch, err)
	web1, web2 := batch.Observations[0], batch.Observations[1]
	assertValue(t, "web-1 requests", web1.RequestRate, 100)
	if !web1.RequestRate.Usable() {
		t.Errorf("web-1 is wholly visible and must be usable: %+v", web1.RequestRate)
	}
	// The hazard is real: the series whose newest sample is missing is not in the sum.
	assertValue(t, "web-2 requests as summed (the cart series dropped)", web2.RequestRate, 50)
	var stale *StaleError
	if web2.RequestRate.Usable() || !errors.As(web2.RequestRate.Err, &stale) || stale.Age != step {
		t.Errorf("web-2 must be stale, its cart series' newest sample %v old: %+v", step, web2.RequestRate)
	}
	if !web2.CPUCores.Usable() {
		t.Errorf("web-2's CPU is wholly visible: %+v", web2.CPUCores)
	}
}

// The what-if reads ranges through NewAPI, on the same transport: without the argument
// VictoriaMetrics repeats, for the points of a range query within 30 s of its clock, the last
// point before them; with it the last point is the sample stamped now.
func TestNewAPI_LatencyOffsetReadsTheNewestPointsOfARange(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Truncate(time.Second)
	step := 15 * time.Second
	vm.ImportText(t, vmtest.Counter(`istio_requests_total{reporter="destination",namespace="shop",pod="api-1"}`, 10, now.Add(-5*time.Minute), now, step))
	lastPoint := func(t *testing.T, cfg Config) float64 {
		t.Helper()
		api, err := NewAPI(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v, _, err := api.QueryRange(context.Background(), `istio_requests_total{namespace="shop"}`, v1.Range{Start: now.Add(-2 * time.Minute), End: now, Step: step})
		if err != nil {
			t.Fatal(err)
		}
		m, ok := v.(model.Matrix)
		if !ok || len(m) != 1 || len(m[0].Values) == 0 {
			t.Fatalf("want one series, got %v", v)
		}
		values := m[0].Values
		if last := values[len(values)-1]; !last.Timestamp.Time().Equal(now) {
			t.Fatalf("the range ends at %s, want %s", last.Timestamp.Time(), now)
		}
		return float64(values[len(values)-1].Value)
	}
	// 10 requests a second for 5 minutes: 3000 at now, 2700 at now-30s.
	if got := lastPoint(t, Config{URL: vm.URL}); got > 2700 {
		t.Errorf("without latency_offset the last point is %v, want at most 2700 (a point 30 s old or older)", got)
	}
	if got := lastPoint(t, Config{URL: vm.URL, LatencyOffset: ptr(time.Duration(0))}); got != 3000 {
		t.Errorf("with latency_offset=0s the last point is %v, want 3000 (the sample stamped now)", got)
	}
}
