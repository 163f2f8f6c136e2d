package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// visibilityPoll is how often the benchmark asks whether an imported sample is visible; it
// bounds the measurement's resolution.
const visibilityPoll = 10 * time.Millisecond

// visibilityDeadline bounds the wait for one sample; VictoriaMetrics flushes pending rows every
// 2 s, so anything near this is a fault, not a measurement.
const visibilityDeadline = 30 * time.Second

// BenchmarkVictoriaMetrics_IngestionToVisibility measures how long after its timestamp a sample
// imported at "now" becomes visible to an instant query sent with latency_offset (as the operator
// sends it), on the pinned single-node VictoriaMetrics. Each iteration imports one sample stamped
// with the wall clock (/api/v1/import/prometheus, no forced flush: the same insert path as remote
// write) and polls every 10 ms until timestamp() returns it. Imports are spaced by a random 0-2 s,
// so they land at every phase of VictoriaMetrics' 2 s pending-rows flush. It reports the median,
// the slowest and the fastest delay in milliseconds, for a series that already exists (a scraped
// pod's next sample) and for a new one (its first sample, which the index must take in too).
//
//	go test ./internal/metrics/ -run '^$' -bench BenchmarkVictoriaMetrics_IngestionToVisibility -benchtime 20x
func BenchmarkVictoriaMetrics_IngestionToVisibility(b *testing.B) {
	vm := vmtest.Start(b)
	const metric = "adaptivelb_bench_visibility"
	vm.ImportText(b, fmt.Sprintf("%s{series=\"existing\"} 0 %d\n", metric, time.Now().Add(-time.Minute).UnixMilli()))
	for _, tc := range []struct {
		name   string
		series func(i int) string
	}{
		{"existing-series", func(int) string { return "existing" }},
		{"new-series", func(i int) string { return fmt.Sprintf("new-%d-%d", time.Now().UnixNano(), i) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			pause := rand.New(rand.NewPCG(1, 2))
			var delays []time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				time.Sleep(time.Duration(pause.Int64N(int64(2 * time.Second))))
				b.StartTimer()
				series := tc.series(i)
				stamp := time.Now().Truncate(time.Millisecond)
				vm.ImportTextUnflushed(b, fmt.Sprintf("%s{series=%q} %d %d\n", metric, series, i+1, stamp.UnixMilli()))
				visible := waitVisible(b, vm.URL, fmt.Sprintf("timestamp(%s{series=%q})", metric, series), stamp)
				delays = append(delays, visible.Sub(stamp))
			}
			b.StopTimer()
			slices.Sort(delays)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(delays[len(delays)/2]), "median-ms")
			b.ReportMetric(ms(delays[len(delays)-1]), "max-ms")
			b.ReportMetric(ms(delays[0]), "min-ms")
		})
	}
}

// waitVisible polls an instant query for "now" with latency_offset until it returns a sample
// stamped at or after stamp, and returns when it first did.
func waitVisible(b *testing.B, base, query string, stamp time.Time) time.Time {
	b.Helper()
	deadline := time.Now().Add(visibilityDeadline)
	for {
		now := time.Now()
		if newest, ok := newestSampleTime(b, base, query, now); ok && !newest.Before(stamp) {
			return now
		}
		if now.After(deadline) {
			b.Fatalf("the sample stamped %s was not visible within %v", stamp.Format(time.RFC3339Nano), visibilityDeadline)
		}
		time.Sleep(visibilityPoll)
	}
}

// newestSampleTime runs a timestamp() query at `at`, read with the smallest latency_offset, and
// returns the sample time it answers; ok is false when it answers nothing yet.
func newestSampleTime(b *testing.B, base, query string, at time.Time) (time.Time, bool) {
	b.Helper()
	form := url.Values{"query": {query}, "time": {formatTime(at)}, LatencyOffsetArg: {latencyOffsetValue(0)}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?"+form.Encode(), nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || answer.Status != "success" {
		b.Fatalf("query %s: %v %s", query, err, answer.Error)
	}
	if len(answer.Data.Result) == 0 {
		return time.Time{}, false
	}
	text, _ := answer.Data.Result[0].Value[1].(string)
	secs, err := strconv.ParseFloat(text, 64)
	if err != nil {
		b.Fatalf("query %s: sample value %q is no timestamp", query, text)
	}
	return unixSeconds(secs), true
}
