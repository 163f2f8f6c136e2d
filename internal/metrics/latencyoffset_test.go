package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
)

func TestParseLatencyOffset(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    *time.Duration
		wantErr string
	}{
		"0s reads the newest data":        {in: "0s", want: ptr(time.Duration(0))},
		"a few seconds":                   {in: "5s", want: ptr(5 * time.Second)},
		"milliseconds":                    {in: "250ms", want: ptr(250 * time.Millisecond)},
		"none sends no argument":          {in: "none", want: nil},
		"negative is refused":             {in: "-1s", wantErr: `latency offset -1s must not be negative: 0s reads the newest data; use "none" to send no latency_offset argument`},
		"finer than a millisecond":        {in: "1500us", wantErr: "latency offset 1.5ms: VictoriaMetrics counts it in whole milliseconds; use e.g. 1ms"},
		"a word that is no duration":      {in: "off", wantErr: `latency offset "off": want a duration such as 0s (read the newest data) or 5s, or "none" to send no latency_offset argument`},
		"a bare number is no Go duration": {in: "30", wantErr: `latency offset "30": want a duration`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseLatencyOffset(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseLatencyOffset(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("ParseLatencyOffset(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			if back := FormatLatencyOffset(got); back != tc.in {
				t.Errorf("FormatLatencyOffset gives %q, which does not read back as %q", back, tc.in)
			}
		})
	}
}

// VictoriaMetrics refuses latency_offset=0 (422 "out of allowed range [1ms ..."), so no offset
// goes on the wire as 1ms; the rest in Prometheus duration syntax, which it parses.
func TestLatencyOffsetValue(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1ms", time.Millisecond: "1ms", 5 * time.Second: "5s", 90 * time.Second: "1m30s"} {
		if got := latencyOffsetValue(d); got != want {
			t.Errorf("latencyOffsetValue(%v) = %q, want %q", d, got, want)
		}
	}
}

// recordQueries serves an empty vector and records the query string and form of every request.
// With refusePOST it answers POST with 405, as a read-only gateway does.
func recordQueries(t *testing.T, refusePOST bool) (string, func() []url.Values) {
	t.Helper()
	var mu sync.Mutex
	var seen []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refusePOST && r.Method == http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		_ = r.ParseForm()
		mu.Lock()
		seen = append(seen, url.Values{"path": {r.URL.Path}, "method": {r.Method}, "url_query": {r.URL.RawQuery}, "latency_offset": r.Form[LatencyOffsetArg]})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "query_range") {
			_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"matrix","result":[]}}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[]}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// Every query carries latency_offset once, whoever sends it: the source's instant queries (POST,
// and GET when a gateway refuses POST), its load history's range queries and the what-if's
// client_golang API (instant and range).
// Without a configured offset nothing is added.
func TestLatencyOffset_GoesWithEveryQuery(t *testing.T) {
	req := Request{Pods: []Pod{{Namespace: "shop", Name: "api-1"}}, Now: time.Unix(1795348200, 0), Window: time.Minute, Interval: 30 * time.Second}
	fetch := func(t *testing.T, cfg Config) {
		t.Helper()
		src, _ := newTestSource(t, cfg)
		_, _ = src.Fetch(context.Background(), req) // every query matches nothing: no data
	}
	useAPI := func(t *testing.T, cfg Config) {
		t.Helper()
		api, err := NewAPI(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _ = api.Query(context.Background(), "up", req.Now)
		_, _, _ = api.QueryRange(context.Background(), "up", v1.Range{Start: req.Now.Add(-time.Hour), End: req.Now, Step: time.Minute})
	}
	history := func(t *testing.T, cfg Config) {
		t.Helper()
		src, _ := newTestSource(t, cfg)
		_, _ = src.RateHistory(context.Background(), HistoryRequest{Namespace: "shop", Service: "api", Start: req.Now.Add(-time.Hour), End: req.Now, Step: 30 * time.Second, Window: time.Minute})
	}
	cases := map[string]struct {
		refusePOST bool
		offset     *time.Duration
		send       func(*testing.T, Config)
		requests   int
		want       []string
	}{
		"the source's queries, 0s sent as 1ms":    {offset: ptr(time.Duration(0)), send: fetch, requests: 7, want: []string{"1ms"}},
		"the source's queries over the GET retry": {refusePOST: true, offset: ptr(5 * time.Second), send: fetch, requests: 7, want: []string{"5s"}},
		"the what-if's instant and range queries": {offset: ptr(time.Duration(0)), send: useAPI, requests: 2, want: []string{"1ms"}},
		"no offset configured, no argument":       {offset: nil, send: fetch, requests: 7, want: nil},
		"the load history's range query":          {offset: ptr(time.Duration(0)), send: history, requests: 1, want: []string{"1ms"}},
		"the load history over the GET retry":     {refusePOST: true, offset: ptr(5 * time.Second), send: history, requests: 1, want: []string{"5s"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			addr, seen := recordQueries(t, tc.refusePOST)
			tc.send(t, Config{URL: addr, LatencyOffset: tc.offset})
			requests := seen()
			if len(requests) != tc.requests {
				t.Fatalf("%d query requests, want %d: %v", len(requests), tc.requests, requests)
			}
			for _, r := range requests {
				if got := r[LatencyOffsetArg]; strings.Join(got, ",") != strings.Join(tc.want, ",") {
					t.Errorf("%s %s carries latency_offset %q, want %q (query string %q)", r.Get("method"), r.Get("path"), got, tc.want, r.Get("url_query"))
				}
			}
		})
	}
}
