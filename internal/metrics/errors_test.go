package metrics

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestErrors_IsAndReason(t *testing.T) {
	cases := map[string]struct {
		err      error
		sentinel error
		reason   string
		mentions string
	}{
		"429 carries its Retry-After": {&HTTPStatusError{StatusCode: 429, RetryAfter: 30 * time.Second}, ErrHTTPStatus, "http_status", "retry after 30s"},
		"422 is an invalid query":     {&HTTPStatusError{StatusCode: 422, Detail: "unexpected token"}, ErrInvalidQuery, "invalid_query", "fix the query template"},
		"VictoriaMetrics' unsupported path is a path problem, not a query problem": {&HTTPStatusError{StatusCode: 400, Detail: `unsupported path requested: "/x/api/v1/query"`}, ErrHTTPStatus, "http_status", "path prefix"},
		"404 points at the path prefix":                                            {&HTTPStatusError{StatusCode: 404}, ErrHTTPStatus, "http_status", "path prefix"},
		"unexpected result type":                                                   {&UnexpectedResultTypeError{Got: "matrix"}, ErrUnexpectedResultType, "unexpected_result_type", "matrix"},
		"NaN names the pod":                                                        {&NonFiniteValueError{Namespace: "shop", Pod: "api-1", Value: math.NaN()}, ErrNonFinite, "non_finite", "shop/api-1"},
		"duplicate series lists them":                                              {&DuplicateSeriesError{Namespace: "shop", Pod: "api-1", Series: []string{"{a}", "{b}"}}, ErrDuplicateSeries, "duplicate_series", "scraped twice"},
		"empty query result":                                                       {&NoDataError{}, ErrNoData, "no_data", "matched no series"},
		"warnings make a partial result":                                           {&PartialResponseError{Warnings: []string{"store down"}}, ErrPartialResponse, "partial_response", "store down"},
		"stale":                                                                    {&StaleError{Namespace: "shop", Pod: "api-1", Age: time.Minute, Threshold: 20 * time.Second}, ErrStale, "stale", "1m0s old"},
		"wrapped in a QueryError":                                                  {&QueryError{Name: "cpu", Query: "q", Err: fmt.Errorf("%w: refused", ErrUnreachable)}, ErrUnreachable, "unreachable", `cpu query "q"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.sentinel) {
				t.Errorf("errors.Is(%v, %v) = false", tc.err, tc.sentinel)
			}
			if got := Reason(tc.err); got != tc.reason {
				t.Errorf("Reason = %q, want %q", got, tc.reason)
			}
			if !strings.Contains(tc.err.Error(), tc.mentions) {
				t.Errorf("message %q does not mention %q", tc.err.Error(), tc.mentions)
			}
		})
	}
}

func TestHTTPStatusError_As(t *testing.T) {
	err := fmt.Errorf("cycle: %w", &QueryError{Name: "cpu", Err: &HTTPStatusError{StatusCode: 429, RetryAfter: 7 * time.Second}})
	var status *HTTPStatusError
	if !errors.As(err, &status) || status.RetryAfter != 7*time.Second {
		t.Fatalf("errors.As did not find the 429 with its Retry-After: %v", err)
	}
	if errors.Is(err, ErrInvalidQuery) {
		t.Error("a 429 is not an invalid query")
	}
}
