package metrics

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinels for errors.Is. Every concrete error below matches exactly one of them, so callers can
// branch on the kind of failure without parsing messages.
var (
	// ErrHTTPStatus: the TSDB answered with a non-2xx status (see *HTTPStatusError for the code).
	ErrHTTPStatus = errors.New("TSDB returned an HTTP error status")
	// ErrInvalidQuery: the TSDB rejected the PromQL (HTTP 400/422 with errorType bad_data or similar).
	ErrInvalidQuery = errors.New("TSDB rejected the query")
	// ErrTimeout: the request did not complete within the configured timeout.
	ErrTimeout = errors.New("TSDB query timed out")
	// ErrResponseTooLarge: the response exceeded Config.MaxResponseBytes.
	ErrResponseTooLarge = errors.New("TSDB response too large")
	// ErrUnreachable: no connection could be made (refused, DNS failure, network unreachable, TLS).
	ErrUnreachable = errors.New("TSDB unreachable")
	// ErrMalformedResponse: the body was not a valid Prometheus API response.
	ErrMalformedResponse = errors.New("malformed TSDB response")
	// ErrUnexpectedResultType: the query returned another result type than it must (a matrix,
	// scalar or string instead of a vector; anything but a matrix for a range query).
	ErrUnexpectedResultType = errors.New("query result is not an instant vector")
	// ErrNonFinite: a pod's value was NaN or ±Inf.
	ErrNonFinite = errors.New("non-finite sample value")
	// ErrDuplicateSeries: more than one series carried the same namespace/pod labels.
	ErrDuplicateSeries = errors.New("duplicate series for one pod")
	// ErrNoData: the query matched nothing (for the whole query) or nothing for this pod.
	ErrNoData = errors.New("no data")
	// ErrPartialResponse: the TSDB returned warnings, so the result may be incomplete.
	ErrPartialResponse = errors.New("partial response")
	// ErrTemplate: a query template failed to parse or render.
	ErrTemplate = errors.New("query template error")
)

// HTTPStatusError is a non-2xx answer from the TSDB.
type HTTPStatusError struct {
	StatusCode int
	// RetryAfter is the server's Retry-After hint (429/503), zero when absent or unparsable.
	RetryAfter time.Duration
	// Detail is the server's error text or the start of the body.
	Detail string
}

func (e *HTTPStatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "TSDB returned HTTP %d", e.StatusCode)
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", truncate(e.Detail, 300))
	}
	switch {
	case e.StatusCode == 429:
		if e.RetryAfter > 0 {
			fmt.Fprintf(&b, " (rate limited; the server asks to retry after %s)", e.RetryAfter)
		} else {
			b.WriteString(" (rate limited; lower the query rate or raise the tenant's limits)")
		}
	case e.StatusCode == 401 || e.StatusCode == 403:
		b.WriteString(" (check the bearer token, basic auth credentials or tenant header)")
	case e.StatusCode == 404 || (e.StatusCode == 400 && strings.Contains(e.Detail, "unsupported path")):
		b.WriteString(" (check the URL and the path prefix, e.g. /select/0/prometheus for VictoriaMetrics cluster)")
	case e.isInvalidQuery():
		b.WriteString(" (the query text is invalid; fix the query template)")
	case e.StatusCode >= 500:
		b.WriteString(" (the TSDB is failing; check its health)")
	}
	return b.String()
}

func (e *HTTPStatusError) isInvalidQuery() bool {
	return (e.StatusCode == 400 || e.StatusCode == 422) && !strings.Contains(e.Detail, "unsupported path")
}

// Is lets errors.Is match ErrHTTPStatus, and ErrInvalidQuery for 400/422 answers to a bad query.
func (e *HTTPStatusError) Is(target error) bool {
	return target == ErrHTTPStatus || (target == ErrInvalidQuery && e.isInvalidQuery())
}

// UnexpectedResultTypeError names the result type a query produced instead of the one it must.
type UnexpectedResultTypeError struct {
	Got string
	// Want is the result type the query must produce: empty for an instant vector (the per-pod
	// queries), "matrix" for a range query (the load history).
	Want string
}

func (e *UnexpectedResultTypeError) Error() string {
	if e.Want == resultTypeMatrix {
		return fmt.Sprintf("range query returned a %s, want a matrix: the load history template must be an expression over a range vector such as sum(rate(...[{{.Window}}]))", e.Got)
	}
	return fmt.Sprintf("query returned a %s, want an instant vector: wrap the expression so it yields one series per pod (e.g. sum by (namespace, pod) (...))", e.Got)
}

func (e *UnexpectedResultTypeError) Is(target error) bool { return target == ErrUnexpectedResultType }

// NonFiniteValueError is a NaN or ±Inf value for one pod. The pod's signal is dropped, not clamped.
type NonFiniteValueError struct {
	Namespace, Pod string
	Value          float64
}

func (e *NonFiniteValueError) Error() string {
	return fmt.Sprintf("pod %s/%s: value is %v; a quantile over a window without requests, a division by zero or a broken histogram gives this, the signal is ignored for the pod", e.Namespace, e.Pod, e.Value)
}

func (e *NonFiniteValueError) Is(target error) bool { return target == ErrNonFinite }

// DuplicateSeriesError is reported when one pod has several series in a result, typically because
// the same target is scraped twice. The values are never summed: the pod is dropped for that signal.
type DuplicateSeriesError struct {
	Namespace, Pod string
	// Series are the label sets of the colliding series.
	Series []string
}

func (e *DuplicateSeriesError) Error() string {
	return fmt.Sprintf("pod %s/%s has %d series %s; the pod is probably scraped twice, or the query does not aggregate by (namespace, pod): deduplicate the scrape jobs or aggregate in the query",
		e.Namespace, e.Pod, len(e.Series), strings.Join(e.Series, ", "))
}

func (e *DuplicateSeriesError) Is(target error) bool { return target == ErrDuplicateSeries }

// NoDataError is a query that matched nothing, or a pod absent from an otherwise non-empty result.
type NoDataError struct {
	// Namespace and Pod are empty when the whole query returned no series.
	Namespace, Pod string
}

func (e *NoDataError) Error() string {
	if e.Pod == "" {
		return "query matched no series: check that the metric is scraped, that the label names match (--label-namespace/--label-pod) and that the namespaces are right"
	}
	return fmt.Sprintf("pod %s/%s has no series in the result: it is not scraped yet, or it is scraped under other label values", e.Namespace, e.Pod)
}

func (e *NoDataError) Is(target error) bool { return target == ErrNoData }

// PartialResponseError carries the warnings a TSDB returned with a result. Such a result may miss
// pods (a Thanos store or a VictoriaMetrics storage node did not answer), so it is not used.
type PartialResponseError struct{ Warnings []string }

func (e *PartialResponseError) Error() string {
	return fmt.Sprintf("TSDB returned a possibly partial result with warnings %q; the result is not used for this cycle", e.Warnings)
}

func (e *PartialResponseError) Is(target error) bool { return target == ErrPartialResponse }

// QueryError ties a failure to the query and the signals it served.
type QueryError struct {
	// Name is the query's name in metrics and logs, e.g. "cpu" or "freshness".
	Name string
	// Query is the rendered PromQL.
	Query string
	Err   error
}

func (e *QueryError) Error() string {
	return fmt.Sprintf("%s query %q: %v", e.Name, truncate(e.Query, 200), e.Err)
}

func (e *QueryError) Unwrap() error { return e.Err }

// Reason classifies an error into the short label used by adaptivelb_metrics_query_errors_total.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrInvalidQuery):
		return "invalid_query"
	case errors.Is(err, ErrHTTPStatus):
		return "http_status"
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrResponseTooLarge):
		return "too_large"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	case errors.Is(err, ErrMalformedResponse):
		return "malformed_response"
	case errors.Is(err, ErrUnexpectedResultType):
		return "unexpected_result_type"
	case errors.Is(err, ErrNonFinite):
		return "non_finite"
	case errors.Is(err, ErrDuplicateSeries):
		return "duplicate_series"
	case errors.Is(err, ErrNoData):
		return "no_data"
	case errors.Is(err, ErrPartialResponse):
		return "partial_response"
	case errors.Is(err, ErrTemplate):
		return "template"
	case errors.Is(err, ErrSeveralSeries):
		return "several_series"
	case errors.Is(err, ErrStale):
		return "stale"
	default:
		return "other"
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ErrStale: the pod's newest raw sample is older than twice the cycle interval.
var ErrStale = errors.New("stale sample")

// StaleError says how old a pod's newest sample is.
type StaleError struct {
	Namespace, Pod string
	// Age is Now minus the newest sample; zero with Unknown set when no freshness data was found.
	Age       time.Duration
	Threshold time.Duration
	Unknown   bool
}

func (e *StaleError) Error() string {
	if e.Unknown {
		return fmt.Sprintf("pod %s/%s: no recent raw sample found by the freshness probe; the pod is treated as having no metrics", e.Namespace, e.Pod)
	}
	return fmt.Sprintf("pod %s/%s: newest sample is %s old, older than %s (2× interval); the pod is treated as having no metrics until it is scraped again", e.Namespace, e.Pod, e.Age.Round(time.Millisecond), e.Threshold)
}

func (e *StaleError) Is(target error) bool { return target == ErrStale }
