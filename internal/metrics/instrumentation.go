package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// instrumentation holds the operator-facing metrics about the TSDB queries.
type instrumentation struct {
	errors   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	stale    *prometheus.CounterVec
}

func newInstrumentation(reg prometheus.Registerer) (*instrumentation, error) {
	in := &instrumentation{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "adaptivelb_metrics_query_errors_total",
			Help: "TSDB query failures by signal and reason (reason is the error kind, e.g. timeout, http_status, no_data, duplicate_series).",
		}, []string{"signal", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "adaptivelb_metrics_query_duration_seconds",
			Help:    "Duration of TSDB queries by signal, including decoding.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"signal"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "adaptivelb_metrics_stale_samples_total",
			Help: "Per-pod samples present but older than twice the interval, by signal. A steady rise for every pod means the TSDB answers in the past (VictoriaMetrics -search.latencyOffset, when no latency_offset is sent) or scrapes too rarely for the interval.",
		}, []string{"signal"}),
	}
	if reg == nil {
		return in, nil
	}
	var err error
	in.errors, err = register(reg, in.errors)
	if err != nil {
		return nil, err
	}
	in.duration, err = register(reg, in.duration)
	if err != nil {
		return nil, err
	}
	in.stale, err = register(reg, in.stale)
	if err != nil {
		return nil, err
	}
	return in, nil
}

// register registers c, or returns the already registered collector of the same description so
// that several sources (e.g. one rebuilt after a config change) share the series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
