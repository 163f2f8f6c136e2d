// Package metrics reads per-pod signals (CPU, request rate, error rate, p99 latency) from any
// Prometheus-compatible TSDB (Prometheus, VictoriaMetrics, Thanos, Mimir, Cortex).
//
// A Fetch sends a constant number of queries per cycle: one per signal (plus one freshness probe
// per distinct scrape source), each covering every namespace of the request, and splits the
// results by pod in memory. The package has no Kubernetes imports; the operator passes pods in.
package metrics

import (
	"context"
	"time"
)

// Source fetches observations for a set of pods.
type Source interface {
	// Fetch returns one Observation per requested pod. Query failures are returned as a joined error
	// of *QueryError values (one per failed query); the affected samples are then not Present and
	// carry the same error, while the other signals are still filled in.
	Fetch(ctx context.Context, req Request) (Batch, error)
}

// Signal names one per-pod measurement. The values double as the names of the CRD query fields
// and of the `signal` label on the operator's own metrics.
type Signal string

const (
	SignalCPU         Signal = "cpu"
	SignalRequestRate Signal = "requestRate"
	SignalErrorRate   Signal = "errorRate"
	SignalLatencyP99  Signal = "latencyP99"
)

// Signals lists every signal in a stable order.
var Signals = []Signal{SignalCPU, SignalRequestRate, SignalErrorRate, SignalLatencyP99}

// Pod identifies an endpoint to observe.
type Pod struct {
	Namespace string
	Name      string
	IP        string
	// CPULimitCores comes from the pod spec and is passed through untouched (0 = no limit).
	CPULimitCores float64
	// Queries overrides the value queries for this pod (from its AdaptiveLoadBalancer's
	// spec.metrics.queries); empty fields fall back to the source's templates. Pods whose
	// effective template for a signal is identical share one query.
	Queries QueryTemplates
}

// Request is one cycle's fetch.
type Request struct {
	Pods []Pod
	// Now is the evaluation time of every query and the reference for freshness.
	Now time.Time
	// Window is the rate/histogram window, rendered as {{.Window}}.
	Window time.Duration
	// Interval is the operator's cycle interval: a sample older than 2×Interval at Now is stale.
	Interval time.Duration

	// Discover, with Pods empty, asks the source to report every pod found in the value queries'
	// results for DiscoverNamespaces (all namespaces if empty) instead of a given pod list.
	// It serves `adaptive-lb metrics check`, which has no cluster to list pods from.
	Discover           bool
	DiscoverNamespaces []string
	// PodRegex narrows the queries to matching pod names ({{.Pods}}); empty means ".+".
	PodRegex string
}

// Sample is one signal's value for one pod.
type Sample struct {
	Value float64
	// Timestamp is the time the freshness probe gives for the pod: its newest raw sample (CPU),
	// or the time up to which all its request series have samples (the sidecar signals); the
	// evaluation time when the signal has no freshness probe.
	Timestamp time.Time
	// Present is false when the pod has no usable value (no data, NaN/Inf, duplicate series,
	// failed query).
	Present bool
	// Fresh is true when Present and Timestamp is within 2×Interval of Now.
	Fresh bool
	// Err says why the sample is not usable (not Present, or Present but not Fresh).
	Err error
}

// Usable reports whether the engine may act on this sample.
func (s Sample) Usable() bool { return s.Present && s.Fresh }

// Observation is what the operator sees for one pod in one cycle.
type Observation struct {
	Pod
	CPUCores          Sample
	RequestRate       Sample
	ErrorRate         Sample
	LatencyP99Seconds Sample
	// LatencyBuckets is the pod's cumulative server-side latency histogram over the window,
	// sorted by bound, bounds in seconds; the +Inf bucket is included when the TSDB has it.
	// Empty when the histogram query is disabled, failed, or has no usable series for the pod;
	// LatencyBucketsErr then says why (nil when disabled).
	LatencyBuckets    []LatencyBucket
	LatencyBucketsErr error
}

// LatencyBucket is one cumulative histogram bucket: Count requests completed within
// UpperBoundSeconds.
type LatencyBucket struct {
	UpperBoundSeconds float64
	Count             float64
}

// Sample returns the observation's sample for a signal.
func (o *Observation) Sample(s Signal) *Sample {
	switch s {
	case SignalCPU:
		return &o.CPUCores
	case SignalRequestRate:
		return &o.RequestRate
	case SignalErrorRate:
		return &o.ErrorRate
	case SignalLatencyP99:
		return &o.LatencyP99Seconds
	}
	return nil
}

// Query is one PromQL request sent in a cycle.
type Query struct {
	// Name is "cpu", "requestRate", ... for value queries, "freshness" for probes and
	// "latencyHistogram" for the per-pod latency histogram.
	Name string
	// Signals are the signals this query served.
	Signals []Signal
	Text    string
	// Series is the number of series returned.
	Series   int
	Warnings []string
	Err      error
}

// Batch is the result of one Fetch.
type Batch struct {
	// Observations holds one entry per distinct requested pod, in request order (sorted by
	// namespace/name when discovering).
	Observations []Observation
	// Queries lists every query sent, in sending order.
	Queries []Query
}
