package metrics

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// LatencyOffsetArg is VictoriaMetrics' per-query override of its -search.latencyOffset (v1.85.2
// and later, single-node and vmselect): a query for a time within that offset of the server's
// clock is evaluated that long ago, 30 s by default, so the newest samples are never seen.
// Prometheus, Thanos and Mimir evaluate at the requested time and do not read the argument.
const LatencyOffsetArg = "latency_offset"

// LatencyOffsetNone is the flag value that sends no latency_offset argument at all, for a
// gateway that refuses unknown query arguments or to keep the TSDB's own offset.
const LatencyOffsetNone = "none"

// ParseLatencyOffset reads a latency offset as the flags spell it: a duration such as 0s or 5s,
// or "none" for no argument (nil).
func ParseLatencyOffset(s string) (*time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == LatencyOffsetNone {
		return nil, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("latency offset %q: want a duration such as 0s (read the newest data) or 5s, or %q to send no %s argument", s, LatencyOffsetNone, LatencyOffsetArg)
	}
	if err := validateLatencyOffset(d); err != nil {
		return nil, err
	}
	return &d, nil
}

// FormatLatencyOffset spells a configured offset the way ParseLatencyOffset reads it.
func FormatLatencyOffset(d *time.Duration) string {
	if d == nil {
		return LatencyOffsetNone
	}
	return d.String()
}

func validateLatencyOffset(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("latency offset %s must not be negative: 0s reads the newest data; use %q to send no %s argument", d, LatencyOffsetNone, LatencyOffsetArg)
	case d%time.Millisecond != 0:
		return fmt.Errorf("latency offset %s: VictoriaMetrics counts it in whole milliseconds; use e.g. %s", d, d.Truncate(time.Millisecond))
	}
	return nil
}

// latencyOffsetValue renders an offset for the query argument. VictoriaMetrics refuses 0
// ("latency_offset=0ms is out of allowed range [1ms ...]", 422, checked on v1.110.0), so "no
// offset" is sent as its smallest accepted value: it shifts a query only when the requested
// time is within 1 ms of the server's clock, and then by 1 ms.
func latencyOffsetValue(d time.Duration) string {
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return model.Duration(d).String()
}

// latencyOffsetRoundTripper adds latency_offset to every query request (/api/v1/query and
// /api/v1/query_range), whoever builds it: the source's own instant queries and client_golang's
// v1 API alike. It goes in the URL's query string, which VictoriaMetrics reads together with a
// POST's form body, so it survives the GET fallback too.
type latencyOffsetRoundTripper struct {
	value string
	next  http.RoundTripper
}

func newLatencyOffsetRoundTripper(d time.Duration, next http.RoundTripper) *latencyOffsetRoundTripper {
	return &latencyOffsetRoundTripper{value: latencyOffsetValue(d), next: next}
}

func (l *latencyOffsetRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || !isQueryPath(req.URL.Path) {
		return l.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	q := req.URL.Query()
	q.Set(LatencyOffsetArg, l.value)
	req.URL.RawQuery = q.Encode()
	return l.next.RoundTrip(req)
}

func isQueryPath(path string) bool {
	return strings.HasSuffix(path, "/api/v1/query") || strings.HasSuffix(path, "/api/v1/query_range")
}
