package metrics

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Faults VictoriaMetrics cannot be made to produce are served by a tiny loopback server.

func fakeTSDB(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv.URL
}

func reply(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

var fakeNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func fakeRequest() Request {
	return Request{
		Pods:     []Pod{{Namespace: "shop", Name: "api-1"}, {Namespace: "shop", Name: "api-2"}},
		Now:      fakeNow,
		Window:   time.Minute,
		Interval: 10 * time.Second,
	}
}

func TestPrometheusSource_Faults_FakeServer(t *testing.T) {
	cases := map[string]struct {
		handler  http.HandlerFunc
		sentinel error
		check    func(t *testing.T, err error)
	}{
		"malformed JSON": {
			handler:  reply(200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":`),
			sentinel: ErrMalformedResponse,
		},
		"a body that is not the Prometheus API": {
			handler:  reply(200, `<html>login</html>`),
			sentinel: ErrMalformedResponse,
		},
		"429 carries Retry-After": {
			handler:  reply(429, `too many requests`, "Retry-After", "30"),
			sentinel: ErrHTTPStatus,
			check: func(t *testing.T, err error) {
				var status *HTTPStatusError
				if !errors.As(err, &status) || status.StatusCode != 429 || status.RetryAfter != 30*time.Second {
					t.Errorf("got %#v", status)
				}
			},
		},
		"503 from an overloaded TSDB": {
			handler:  reply(503, `overloaded`),
			sentinel: ErrHTTPStatus,
		},
		"401 points at the credentials": {
			handler:  reply(401, `unauthorized`),
			sentinel: ErrHTTPStatus,
		},
		"a matrix instead of a vector": {
			handler:  reply(200, `{"status":"success","data":{"resultType":"matrix","result":[]}}`),
			sentinel: ErrUnexpectedResultType,
		},
		"a scalar instead of a vector": {
			handler:  reply(200, `{"status":"success","data":{"resultType":"scalar","result":[1700000000,"1"]}}`),
			sentinel: ErrUnexpectedResultType,
		},
		"warnings mark a partial response, which is not used": {
			handler:  reply(200, `{"status":"success","warnings":["store eu-1 unavailable"],"data":{"resultType":"vector","result":[{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348200,"1"]}]}}`),
			sentinel: ErrPartialResponse,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			src, _ := newTestSource(t, Config{URL: fakeTSDB(t, tc.handler)})
			batch, err := src.Fetch(context.Background(), fakeRequest())
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("got %v, want %v", err, tc.sentinel)
			}
			for _, obs := range batch.Observations {
				for _, signal := range Signals {
					if s := obs.Sample(signal); s.Present || !errors.Is(s.Err, tc.sentinel) {
						t.Errorf("%s %s: bad data must not be present: %+v", obs.Name, signal, *s)
					}
				}
			}
			if tc.check != nil {
				tc.check(t, err)
			}
		})
	}
}

func TestPrometheusSource_NonFiniteValues(t *testing.T) {
	// api-1's p99 is NaN (no requests in the window), api-2's CPU is +Inf; everything else is 1,
	// stamped "now" by the freshness probes.
	vector := func(api1, api2 string) string {
		return `{"status":"success","data":{"resultType":"vector","result":[` +
			`{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348200,"` + api1 + `"]},` +
			`{"metric":{"namespace":"shop","pod":"api-2"},"value":[1795348200,"` + api2 + `"]}]}}`
	}
	body := func(q string) string {
		switch {
		case strings.HasPrefix(q, "histogram_quantile("):
			return vector("NaN", "0.1")
		case strings.Contains(q, "(timestamp("): // freshness probes
			return vector("1795348200", "1795348200")
		case strings.Contains(q, "rate(container_cpu_usage_seconds_total"):
			return vector("1", "+Inf")
		}
		return vector("1", "1")
	}
	url := fakeTSDB(t, func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		reply(200, body(r.Form.Get("query")))(w, r)
	})
	src, _ := newTestSource(t, Config{URL: url})
	req := fakeRequest()
	req.Now = time.Unix(1795348200, 0)
	batch, err := src.Fetch(context.Background(), req)
	if err != nil {
		t.Fatalf("non-finite values are per-pod problems, not query failures: %v", err)
	}
	api1, api2 := batch.Observations[0], batch.Observations[1]
	if s := api1.LatencyP99Seconds; s.Present || !errors.Is(s.Err, ErrNonFinite) || !math.IsNaN(s.Value) {
		t.Errorf("api-1 p99: %+v", s)
	}
	if s := api2.CPUCores; s.Present || !errors.Is(s.Err, ErrNonFinite) {
		t.Errorf("api-2 cpu: %+v", s)
	}
	if !api1.CPUCores.Usable() || !api2.LatencyP99Seconds.Usable() {
		t.Errorf("the finite values must stay usable: %+v %+v", api1.CPUCores, api2.LatencyP99Seconds)
	}
	if got := Reason(api2.CPUCores.Err); got != "non_finite" {
		t.Errorf("reason %q", got)
	}
}

func TestPrometheusSource_Timeout(t *testing.T) {
	url := fakeTSDB(t, func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm() // consume the body so the server notices the client hanging up
		select {          // hang until the client gives up (bounded in case it never does)
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	src, _ := newTestSource(t, Config{URL: url, Timeout: 100 * time.Millisecond})
	_, err := src.Fetch(context.Background(), fakeRequest())
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v", err)
	}
	if Reason(err) != "timeout" {
		t.Errorf("reason %q", Reason(err))
	}
}

// A body is decoded while it streams in, so a transport failure can surface in the middle of the
// JSON. It must be reported as what it is, not as a malformed response.
func TestPrometheusSource_TransportFailureMidBody(t *testing.T) {
	const head = `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348200,"1"]},`
	t.Run("the connection closes: unreachable", func(t *testing.T) {
		url := fakeTSDB(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "100000") // more than is sent: the server drops the connection
			_, _ = w.Write([]byte(head))
		})
		src, _ := newTestSource(t, Config{URL: url})
		_, err := src.Fetch(context.Background(), fakeRequest())
		if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrMalformedResponse) {
			t.Fatalf("got %v, want %v", err, ErrUnreachable)
		}
	})
	t.Run("the body stalls: timeout", func(t *testing.T) {
		url := fakeTSDB(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(head))
			w.(http.Flusher).Flush()
			select { // stall until the client gives up (bounded in case it never does)
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		})
		src, _ := newTestSource(t, Config{URL: url, Timeout: 200 * time.Millisecond})
		_, err := src.Fetch(context.Background(), fakeRequest())
		if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrMalformedResponse) {
			t.Fatalf("got %v, want %v", err, ErrTimeout)
		}
	})
}

func TestPrometheusSource_CallerCancellationIsNotATSDBFault(t *testing.T) {
	src, _ := newTestSource(t, Config{URL: fakeTSDB(t, reply(200, `{}`))})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := src.Fetch(ctx, fakeRequest())
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v", err)
	}
}

func TestPrometheusSource_SendsCredentialsHeadersAndPrefix(t *testing.T) {
	type seen struct{ path, auth, tenant, timeout, time string }
	got := make(chan seen, 16)
	url := fakeTSDB(t, func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		got <- seen{r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Scope-OrgID"), r.Form.Get("timeout"), r.Form.Get("time")}
		reply(200, `{"status":"success","data":{"resultType":"vector","result":[]}}`)(w, r)
	})
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, _ := newTestSource(t, Config{
		URL: url, PathPrefix: "/select/0/prometheus", BearerTokenFile: token,
		Headers: map[string]string{"X-Scope-OrgID": "team-a"}, Timeout: 3 * time.Second,
	})
	if _, err := src.Fetch(context.Background(), fakeRequest()); !errors.Is(err, ErrNoData) {
		t.Fatalf("got %v", err)
	}
	first := <-got
	want := seen{"/select/0/prometheus/api/v1/query", "Bearer s3cr3t", "team-a", "3s", "1795348800"}
	if first != want {
		t.Errorf("request %+v, want %+v", first, want)
	}
}

func TestNew_RejectsBadConfigAndRequests(t *testing.T) {
	if _, err := New(Config{URL: "ftp://x"}, nil); err == nil {
		t.Error("bad scheme accepted")
	}
	src, err := New(Config{URL: "http://127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Fetch(context.Background(), Request{Pods: []Pod{{Name: "x"}}})
	if err == nil {
		t.Fatal("an empty request was accepted")
	}
	for _, want := range []string{"Now is zero", "window", "interval", "namespace and name are required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

func TestPrometheusSource_BrokenOverrideFailsOnlyItsPods(t *testing.T) {
	url := fakeTSDB(t, reply(200, `{"status":"success","data":{"resultType":"vector","result":[`+
		`{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348800,"1"]},`+
		`{"metric":{"namespace":"shop","pod":"api-2"},"value":[1795348800,"1795348800"]}]}}`))
	src, reg := newTestSource(t, Config{URL: url})
	req := fakeRequest()
	req.Pods[0].Queries = QueryTemplates{CPU: `sum by (namespace, pod) (rate(x{namespace=~"{{.Namespace}}"}[{{.Window}}]))`}
	batch, err := src.Fetch(context.Background(), req)
	if !errors.Is(err, ErrTemplate) {
		t.Fatalf("got %v", err)
	}
	if s := batch.Observations[0].CPUCores; s.Present || !errors.Is(s.Err, ErrTemplate) {
		t.Errorf("api-1 cpu: %+v", s)
	}
	if s := batch.Observations[1].CPUCores; !s.Present {
		t.Errorf("api-2 uses the default query and must not be affected: %+v", s)
	}
	if n, _ := testutil.GatherAndCount(reg, "adaptivelb_metrics_query_errors_total"); n != 1 {
		t.Errorf("%d error series, want the one for the template", n)
	}
	if got := testutil.ToFloat64(src.metrics.errors.WithLabelValues("cpu", "template")); got != 1 {
		t.Errorf("template errors counted %v times", got)
	}
}

func TestPrometheusSource_FallsBackToGETWhenPOSTIsRefused(t *testing.T) {
	methods := make(chan string, 32)
	url := fakeTSDB(t, func(w http.ResponseWriter, r *http.Request) {
		methods <- r.Method
		if r.Method == http.MethodPost {
			reply(http.StatusMethodNotAllowed, `POST not allowed`)(w, r)
			return
		}
		if r.URL.Query().Get("query") == "" {
			reply(400, `{"status":"error","errorType":"bad_data","error":"no query"}`)(w, r)
			return
		}
		reply(200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"shop","pod":"api-1"},"value":[1795348800,"1795348800"]}]}}`)(w, r)
	})
	src, _ := newTestSource(t, Config{URL: url})
	batch, err := src.Fetch(context.Background(), fakeRequest())
	if err != nil {
		t.Fatalf("got %v", err)
	}
	if s := batch.Observations[0].CPUCores; !s.Present || s.Value != 1795348800 {
		t.Errorf("api-1 cpu %+v", s)
	}
	close(methods)
	var seen []string
	for m := range methods {
		seen = append(seen, m)
	}
	if !slices.Contains(seen, http.MethodGet) || len(seen) != 14 {
		t.Errorf("methods %v, want each of the 7 queries POSTed then retried with GET", seen)
	}
}

// A query whose answer is far larger than the Service's pods warrant (an override selecting every
// series) is cut off at MaxResponseBytes and fails, instead of holding the cycle and the memory.
func TestPrometheusSource_RefusesAResponseAboveTheSizeLimit(t *testing.T) {
	var series []string
	for i := range 200 {
		series = append(series, `{"metric":{"namespace":"shop","pod":"other-`+strings.Repeat("x", 40)+string(rune('a'+i%26))+`"},"value":[1795348200,"1"]}`)
	}
	body := `{"status":"success","data":{"resultType":"vector","result":[` + strings.Join(series, ",") + `]}}`
	src, _ := newTestSource(t, Config{URL: fakeTSDB(t, reply(200, body)), MaxResponseBytes: 4096})
	_, err := src.Fetch(context.Background(), fakeRequest())
	if !errors.Is(err, ErrResponseTooLarge) || !strings.Contains(err.Error(), "more than 4096 bytes") {
		t.Fatalf("got %v, want ErrResponseTooLarge naming the limit", err)
	}
	// The same answer under the limit is read.
	src, _ = newTestSource(t, Config{URL: fakeTSDB(t, reply(200, body))})
	if _, err := src.Fetch(context.Background(), fakeRequest()); errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("a %d-byte answer refused under the default limit: %v", len(body), err)
	}
}
