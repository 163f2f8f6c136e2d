package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/prometheus/common/model"
)

// This file reads a Service's request rate over its past (days), for the operator to learn how
// fast the Service's load has risen before (weights.LearnLoadHistory). Unlike Fetch, which sends
// one instant query per signal for every pod of a cycle, it sends range queries for one Service,
// rarely (once an hour by default) and off the weight cycle's path.

// HistorySource is the optional ability of a Source to read a Service's request rate over a past
// range. The Prometheus-API source has it.
type HistorySource interface {
	// RateHistory returns the Service's request rate at every step of [Start, End], oldest first.
	// No series at all (a new Service, or one the TSDB no longer holds) is no error: the result
	// is empty. A query that returns more than one series, or anything but a matrix, is.
	RateHistory(ctx context.Context, req HistoryRequest) ([]RatePoint, error)
}

var _ HistorySource = (*prometheusSource)(nil)

// HistoryRequest asks for one Service's request rate over a past range.
type HistoryRequest struct {
	// Namespace and Service name the Service (rendered as {{.Namespace}} and {{.Service}}).
	Namespace, Service string
	// Start and End bound the range; Step is the resolution.
	Start, End time.Time
	Step       time.Duration
	// Window is the range each rate is taken over ({{.Window}}).
	Window time.Duration
	// Instant asks for the rate between the last two samples of each window (irate), which shows
	// a burst shorter than the window at close to its height; otherwise the average over the
	// window (rate), as a weight cycle sees the load.
	Instant bool
}

// RatePoint is the Service's request rate at one step.
type RatePoint struct {
	Time time.Time
	// Rate is in requests per second. The TSDB may return NaN or ±Inf; they are passed on as
	// they came, for the caller to skip.
	Rate float64
}

// DefaultHistoryQuery is a Service's request rate summed over its pods, as their sidecars report
// it (the server side), by the Service's own labels: a pod's name changes with every rollout, the
// Service's does not.
const DefaultHistoryQuery = `sum({{.Function}}(istio_requests_total{reporter="destination", destination_service_namespace="{{.Namespace}}", destination_service_name="{{.Service}}"}[{{.Window}}]))`

// HistoryTemplateData is what a history query template sees.
//
//	{{.Namespace}}  the Service's namespace, escaped for a double-quoted PromQL string
//	{{.Service}}    the Service's name, escaped the same way
//	{{.Window}}     the range of each rate as a PromQL duration, e.g. 1m
//	{{.Function}}   rate (the average over the window) or irate (its last two samples)
//
// The query must return one series: a matrix of the Service's summed request rate.
type HistoryTemplateData struct {
	Namespace string
	Service   string
	Window    string
	Function  string
}

// maxPointsPerQuery is the most steps one range query asks for. Prometheus refuses more than
// 11,000 points per series ("exceeded maximum resolution of 11,000 points per timeseries"); a
// longer range is split into several queries.
const maxPointsPerQuery = 10_000

// historyQueryName labels the history queries in adaptivelb_metrics_query_errors_total and
// adaptivelb_metrics_query_duration_seconds.
const historyQueryName = "loadHistory"

// ErrSeveralSeries: a query that must return one series returned several.
var ErrSeveralSeries = errors.New("query returned several series")

// SeveralSeriesError is a history query that returned more than one series: the template does
// not sum over the Service's pods.
type SeveralSeriesError struct{ Series int }

func (e *SeveralSeriesError) Error() string {
	return fmt.Sprintf("the load history query returned %d series, want one: wrap it in sum(...) so that it gives the Service's total request rate", e.Series)
}

func (e *SeveralSeriesError) Is(target error) bool { return target == ErrSeveralSeries }

// ValidateHistoryTemplate parses a history query template and renders it with sample data, so
// that a typo is reported when the configuration is loaded.
func ValidateHistoryTemplate(text string) error {
	t, err := parseTemplate(historyQueryName, text)
	if err != nil {
		return err
	}
	_, err = executeHistory(t, historyData(HistoryRequest{Namespace: "default", Service: "web", Window: time.Minute}))
	return err
}

func historyData(req HistoryRequest) HistoryTemplateData {
	fn := "rate"
	if req.Instant {
		fn = "irate"
	}
	return HistoryTemplateData{
		Namespace: promQLStringEscape(req.Namespace),
		Service:   promQLStringEscape(req.Service),
		Window:    model.Duration(req.Window).String(),
		Function:  fn,
	}
}

func executeHistory(t *template.Template, data HistoryTemplateData) (string, error) {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("%w: %s template: %v (available: .Namespace .Service .Window .Function)", ErrTemplate, t.Name(), err)
	}
	return b.String(), nil
}

func validateHistoryRequest(req HistoryRequest) error {
	var errs []error
	if req.Namespace == "" || req.Service == "" {
		errs = append(errs, fmt.Errorf("history request for %q/%q: namespace and service are required", req.Namespace, req.Service))
	}
	if req.Start.IsZero() || !req.End.After(req.Start) {
		errs = append(errs, fmt.Errorf("history range %s to %s: start must be before end", req.Start.Format(time.RFC3339), req.End.Format(time.RFC3339)))
	}
	if req.Step < time.Second {
		errs = append(errs, fmt.Errorf("history step %s must be at least 1s", req.Step))
	}
	if req.Window < req.Step {
		errs = append(errs, fmt.Errorf("history window %s must be at least the step %s, or the rates would leave gaps", req.Window, req.Step))
	}
	return errors.Join(errs...)
}

// RateHistory implements HistorySource: the range is split into queries of at most
// maxPointsPerQuery steps, sent one after the other, each bounded by the source's timeout and
// response size and carrying its latency_offset. The first failure ends the read.
func (s *prometheusSource) RateHistory(ctx context.Context, req HistoryRequest) ([]RatePoint, error) {
	if err := validateHistoryRequest(req); err != nil {
		return nil, fmt.Errorf("invalid history request: %w", err)
	}
	t, err := s.historyTemplate()
	if err != nil {
		return nil, err
	}
	text, err := executeHistory(t, historyData(req))
	if err != nil {
		return nil, err
	}
	var out []RatePoint
	for _, c := range historyChunks(req.Start, req.End, req.Step) {
		start := time.Now()
		points, err := s.queryRange(ctx, text, c.start, c.end, req.Step)
		s.metrics.duration.WithLabelValues(historyQueryName).Observe(time.Since(start).Seconds())
		if err != nil {
			s.metrics.errors.WithLabelValues(historyQueryName, Reason(err)).Inc()
			return nil, &QueryError{Name: historyQueryName, Query: text, Err: err}
		}
		for _, p := range points {
			// Chunks do not overlap, but a TSDB may stamp a step at the chunk's edge twice.
			if n := len(out); n == 0 || p.Time.After(out[n-1].Time) {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func (s *prometheusSource) historyTemplate() (*template.Template, error) {
	text := s.historyQuery
	if text == "" {
		text = DefaultHistoryQuery
	}
	s.mu.Lock()
	t, ok := s.templates[text]
	s.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := parseTemplate(historyQueryName, text)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.templates[text] = t
	s.mu.Unlock()
	return t, nil
}

// timeRange is one range query's bounds, both included.
type timeRange struct{ start, end time.Time }

// historyChunks splits [start, end] at step into ranges of at most maxPointsPerQuery steps each.
func historyChunks(start, end time.Time, step time.Duration) []timeRange {
	var out []timeRange
	span := time.Duration(maxPointsPerQuery-1) * step
	for from := start; !from.After(end); from = from.Add(span + step) {
		out = append(out, timeRange{start: from, end: minTime(end, from.Add(span))})
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// queryRange runs one range query and turns every failure into a typed error, as query does for
// instant queries.
func (s *prometheusSource) queryRange(ctx context.Context, text string, start, end time.Time, step time.Duration) ([]RatePoint, error) {
	form := url.Values{}
	form.Set("query", text)
	form.Set("start", formatTime(start))
	form.Set("end", formatTime(end))
	form.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	var decoded matrixResponse
	err := s.exchange(ctx, rangeQueryPath, form, func(body io.Reader) (apiEnvelope, error) {
		var err error
		decoded, err = decodeMatrix(body)
		return decoded.apiEnvelope, err
	})
	switch {
	case err != nil:
		return nil, err
	case decoded.resultType == "":
		return nil, fmt.Errorf("%w: response has no data", ErrMalformedResponse)
	case decoded.resultType != resultTypeMatrix:
		return nil, &UnexpectedResultTypeError{Got: decoded.resultType, Want: resultTypeMatrix}
	case decoded.series > 1:
		return nil, &SeveralSeriesError{Series: decoded.series}
	}
	return decoded.points, nil
}
