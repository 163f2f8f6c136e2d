package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// BenchmarkRateHistory_ThreeDaysOfAServiceOfTwentyPods measures one refresh of one Service's load
// history against a real VictoriaMetrics, as the operator sends it with the defaults: three days
// of the Service's summed rate at a 30 s step (8,641 points, one query) and its irate at a 15 s
// step (17,281 points, two queries), over twenty pods' request series with two response codes
// scraped every 15 s (40 series, 691,000 samples). Reported: the time per refresh and the
// response bytes per refresh.
func BenchmarkRateHistory_ThreeDaysOfAServiceOfTwentyPods(b *testing.B) {
	vm := vmtest.Start(b)
	end := time.Now().Add(-time.Hour).Truncate(time.Minute)
	start := end.Add(-72 * time.Hour)
	for pod := range 20 {
		for _, code := range []string{"200", "503"} {
			var text strings.Builder
			labels := fmt.Sprintf(`istio_requests_total{reporter="destination",destination_service_namespace="shop",destination_service_name="api",namespace="shop",pod="api-%d",response_code=%q}`, pod, code)
			rate := 10.0
			if code == "503" {
				rate = 0.1
			}
			text.WriteString(vmtest.Counter(labels, rate, start.Add(-5*time.Minute), end, 15*time.Second))
			vm.ImportText(b, text.String())
		}
	}
	var bytes int64
	src, err := New(Config{URL: vm.URL}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ps := src.(*prometheusSource)
	ps.http.Transport = countingTransport{next: ps.http.Transport, n: &bytes}
	b.ResetTimer()
	for range b.N {
		for _, r := range []HistoryRequest{
			{Namespace: "shop", Service: "api", Start: start, End: end, Step: 30 * time.Second, Window: time.Minute},
			{Namespace: "shop", Service: "api", Start: start, End: end, Step: 15 * time.Second, Window: time.Minute, Instant: true},
		} {
			points, err := ps.RateHistory(context.Background(), r)
			if err != nil || len(points) < int(72*time.Hour/r.Step) {
				b.Fatalf("%d points, %v", len(points), err)
			}
		}
	}
	b.ReportMetric(float64(bytes)/float64(b.N), "bytes/refresh")
}

// countingTransport adds the size of every response body it passes to *n.
type countingTransport struct {
	next http.RoundTripper
	n    *int64
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: c.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	*c.n += int64(n)
	return n, err
}
