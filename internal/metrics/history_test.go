package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// Prometheus refuses a range of more than 11,000 points per series: three days at a 15 s step
// (17,281 points) go out as two queries of at most 10,000 points that cover the range exactly
// once.
func TestHistoryChunks_SplitsARangeIntoQueriesOfAtMostTenThousandPoints(t *testing.T) {
	end := time.Unix(1795348200, 0)
	for name, tc := range map[string]struct {
		span, step time.Duration
		chunks     int
	}{
		"three days at 15s":         {72 * time.Hour, 15 * time.Second, 2},
		"three days at 30s":         {72 * time.Hour, 30 * time.Second, 1},
		"exactly 10,000 points":     {9999 * 30 * time.Second, 30 * time.Second, 1},
		"one point more than that":  {10000 * 30 * time.Second, 30 * time.Second, 2},
		"a month at 15s":            {31 * 24 * time.Hour, 15 * time.Second, 18},
		"a range shorter than step": {10 * time.Second, 15 * time.Second, 1},
	} {
		t.Run(name, func(t *testing.T) {
			start := end.Add(-tc.span)
			chunks := historyChunks(start, end, tc.step)
			if len(chunks) != tc.chunks {
				t.Fatalf("%d chunks, want %d: %v", len(chunks), tc.chunks, chunks)
			}
			next := start
			for i, c := range chunks {
				points := int(c.end.Sub(c.start)/tc.step) + 1
				if points > maxPointsPerQuery {
					t.Errorf("chunk %d asks for %d points", i, points)
				}
				if !c.start.Equal(next) || c.end.After(end) || c.end.Before(c.start) {
					t.Errorf("chunk %d is %v to %v; want it to start at %v and end by %v", i, c.start, c.end, next, end)
				}
				next = c.end.Add(tc.step)
			}
			if last := chunks[len(chunks)-1].end; end.Sub(last) >= tc.step {
				t.Errorf("the chunks end at %v, a step or more before the range's end %v", last, end)
			}
		})
	}
}

// rangeServer answers each range query with one series holding a point at every step of the
// requested range (value: the Unix time), and records the ranges asked for.
func rangeServer(t *testing.T) (string, func() [][3]float64) {
	t.Helper()
	var mu sync.Mutex
	var asked [][3]float64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		start, _ := strconv.ParseFloat(r.Form.Get("start"), 64)
		end, _ := strconv.ParseFloat(r.Form.Get("end"), 64)
		step, _ := strconv.ParseFloat(r.Form.Get("step"), 64)
		mu.Lock()
		asked = append(asked, [3]float64{start, end, step})
		mu.Unlock()
		var values []string
		for ts := start; ts <= end; ts += step {
			values = append(values, fmt.Sprintf(`[%g,"%g"]`, ts, ts))
		}
		fmt.Fprintf(w, `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[%s]}]}}`, strings.Join(values, ","))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() [][3]float64 {
		mu.Lock()
		defer mu.Unlock()
		return asked
	}
}

func TestRateHistory_ReadsALongRangeInChunksAndJoinsThem(t *testing.T) {
	addr, asked := rangeServer(t)
	src, _ := newTestSource(t, Config{URL: addr})
	end := time.Unix(1795348200, 0)
	req := HistoryRequest{Namespace: "shop", Service: "api", Start: end.Add(-72 * time.Hour), End: end, Step: 15 * time.Second, Window: time.Minute, Instant: true}
	points, err := src.RateHistory(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := asked(); len(got) != 2 {
		t.Fatalf("%d range queries for three days at 15s, want 2: %v", len(got), got)
	}
	for _, a := range asked() {
		if n := int((a[1]-a[0])/a[2]) + 1; n > maxPointsPerQuery {
			t.Errorf("a query asked for %d points (%v)", n, a)
		}
	}
	if want := 72*3600/15 + 1; len(points) != want {
		t.Fatalf("%d points, want %d", len(points), want)
	}
	for i, p := range points {
		if want := req.Start.Add(time.Duration(i) * req.Step); !p.Time.Equal(want) || p.Rate != float64(want.Unix()) {
			t.Fatalf("point %d is %v %v, want %v", i, p.Time, p.Rate, want)
		}
	}
}

// What the TSDB answers that is no usable history is an error that says what is wrong and what
// to do, with its kind for errors.Is; no series at all is a Service without history, not an error.
func TestRateHistory_BadResponsesAreClearErrors(t *testing.T) {
	const onePoint = `[1795348200,"5"]`
	for name, tc := range map[string]struct {
		status   int
		body     string
		maxBytes int64
		want     error
		message  string
	}{
		"several series: the template does not sum": {body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"pod":"a"},"values":[` + onePoint + `]},{"metric":{"pod":"b"},"values":[` + onePoint + `]}]}}`,
			want: ErrSeveralSeries, message: "returned 2 series, want one: wrap it in sum(...)"},
		"an instant vector instead of a matrix": {body: `{"status":"success","data":{"resultType":"vector","result":[]}}`,
			want: ErrUnexpectedResultType, message: "range query returned a vector, want a matrix"},
		"a query the TSDB rejects": {status: 422, body: `{"status":"error","errorType":"bad_data","error":"unknown func foo"}`,
			want: ErrInvalidQuery, message: "unknown func foo"},
		"not JSON": {body: `<html>proxy error</html>`, want: ErrMalformedResponse, message: "is the URL a Prometheus-compatible API?"},
		"a value that is no number": {body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1795348200,"many"]]}]}}`,
			want: ErrMalformedResponse, message: `sample value "many"`},
		"a pair of three": {body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1795348200,"1","2"]]}]}}`,
			want: ErrMalformedResponse, message: "more than two elements"},
		"a partial answer": {body: `{"status":"success","warnings":["store eu-1 did not answer"],"data":{"resultType":"matrix","result":[]}}`,
			want: ErrPartialResponse, message: "store eu-1 did not answer"},
		"a server failing": {status: 503, body: `overloaded`, want: ErrHTTPStatus, message: "the TSDB is failing"},
		"a body beyond the response limit": {maxBytes: 64, body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[` + strings.Repeat(onePoint+",", 20) + onePoint + `]}]}}`,
			want: ErrResponseTooLarge, message: "more than 64 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status != 0 {
					w.WriteHeader(tc.status)
				}
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			src, _ := newTestSource(t, Config{URL: srv.URL, MaxResponseBytes: tc.maxBytes})
			end := time.Unix(1795348200, 0)
			points, err := src.RateHistory(context.Background(), HistoryRequest{Namespace: "shop", Service: "api", Start: end.Add(-time.Hour), End: end, Step: 30 * time.Second, Window: time.Minute})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("error %v (points %v); want %v saying %q", err, points, tc.want, tc.message)
			}
			if !strings.Contains(err.Error(), "loadHistory query") {
				t.Errorf("error %q does not name the load history query", err)
			}
			if n := testutil.ToFloat64(src.metrics.errors.WithLabelValues(historyQueryName, Reason(err))); n != 1 {
				t.Errorf("adaptivelb_metrics_query_errors_total{signal=%q,reason=%q} = %v, want 1", historyQueryName, Reason(err), n)
			}
		})
	}
	t.Run("no series: no history, no error", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"matrix","result":[]}}`))
		}))
		defer srv.Close()
		src, _ := newTestSource(t, Config{URL: srv.URL})
		end := time.Unix(1795348200, 0)
		points, err := src.RateHistory(context.Background(), HistoryRequest{Namespace: "shop", Service: "api", Start: end.Add(-time.Hour), End: end, Step: 30 * time.Second, Window: time.Minute})
		if err != nil || len(points) != 0 {
			t.Fatalf("points %v, error %v; want none and no error", points, err)
		}
	})
}

func TestRateHistory_InvalidRequestsAndTemplates(t *testing.T) {
	end := time.Unix(1795348200, 0)
	good := HistoryRequest{Namespace: "shop", Service: "api", Start: end.Add(-time.Hour), End: end, Step: 30 * time.Second, Window: time.Minute}
	src, _ := newTestSource(t, Config{URL: "http://127.0.0.1:1"})
	for name, tc := range map[string]struct {
		mutate  func(*HistoryRequest)
		message string
	}{
		"no service":              {func(r *HistoryRequest) { r.Service = "" }, "namespace and service are required"},
		"a range that ends first": {func(r *HistoryRequest) { r.End = r.Start }, "start must be before end"},
		"a step under a second":   {func(r *HistoryRequest) { r.Step = time.Millisecond }, "must be at least 1s"},
		"a window under the step": {func(r *HistoryRequest) { r.Window = time.Second }, "must be at least the step"},
	} {
		t.Run(name, func(t *testing.T) {
			req := good
			tc.mutate(&req)
			if _, err := src.RateHistory(context.Background(), req); err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("error %v, want one saying %q", err, tc.message)
			}
		})
	}
	for tmpl, message := range map[string]string{
		`sum(rate(x{ns="{{.Namespace}}"}[{{.Windw}}]))`: "available: .Namespace .Service .Window .Function",
		`sum(rate(x[{{.Window}}])`:                      "", // PromQL is the TSDB's to judge; the template renders
		`{{.Namespace`:                                  "unclosed action",
	} {
		err := ValidateHistoryTemplate(tmpl)
		if message == "" {
			if err != nil {
				t.Errorf("ValidateHistoryTemplate(%q) = %v, want nil", tmpl, err)
			}
			continue
		}
		if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), message) {
			t.Errorf("ValidateHistoryTemplate(%q) = %v, want a template error saying %q", tmpl, err, message)
		}
	}
	if err := (Config{URL: "http://tsdb:8428", HistoryQuery: "{{.Pod}}"}).Validate(); err == nil || !strings.Contains(err.Error(), "load history query") {
		t.Errorf("a config with a broken history template validates: %v", err)
	}
}

// The default query against a real VictoriaMetrics: a Service of two pods, one of them on
// another Service too, at 40 and 60 rps, rising to 100 and 150 rps for the last ten minutes. The
// planned series (rate over a minute) and the short one (irate) are both the Service's total, and
// the Service's own labels select it whatever its pods are called.
func TestRateHistory_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	now := time.Now().Add(-time.Hour).Truncate(time.Minute)
	from, rise := now.Add(-time.Hour), now.Add(-10*time.Minute)
	var b strings.Builder
	series := func(svc, pod string, before, after float64) {
		labels := fmt.Sprintf(`istio_requests_total{reporter="destination",destination_service_namespace="shop",destination_service_name=%q,namespace="shop",pod=%q,response_code="200"}`, svc, pod)
		total := 0.0
		for ts := from; !ts.After(now); ts = ts.Add(15 * time.Second) {
			fmt.Fprintf(&b, "%s %g %d\n", labels, total, ts.UnixMilli())
			rate := before
			if !ts.Before(rise) {
				rate = after
			}
			total += rate * 15
		}
	}
	series("api", "api-1", 40, 100)
	series("api", "api-2", 60, 150)
	series("web", "web-1", 500, 500) // another Service of the namespace
	vm.ImportText(t, b.String())
	src, _ := newTestSource(t, Config{URL: vm.URL})
	for _, instant := range []bool{false, true} {
		points, err := src.RateHistory(context.Background(), HistoryRequest{Namespace: "shop", Service: "api", Start: from.Add(5 * time.Minute), End: now, Step: 30 * time.Second, Window: time.Minute, Instant: instant})
		if err != nil {
			t.Fatal(err)
		}
		if want := int(now.Sub(from.Add(5*time.Minute))/(30*time.Second)) + 1; len(points) != want {
			t.Fatalf("instant=%v: %d points, want %d", instant, len(points), want)
		}
		for _, p := range points {
			want := 100.0
			if p.Time.After(rise.Add(time.Minute)) {
				want = 250
			} else if p.Time.After(rise) {
				continue // the minute across the rise
			}
			if math.Abs(p.Rate-want) > 0.01*want {
				t.Fatalf("instant=%v: rate %v at %v, want %v", instant, p.Rate, p.Time, want)
			}
		}
	}
}
