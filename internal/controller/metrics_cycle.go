package controller

import "github.com/prometheus/client_golang/prometheus"

// cycleBuckets are the buckets of the cycle's duration and of each of its phases, so that the
// phases' quantiles compare with the whole cycle's.
var cycleBuckets = prometheus.ExponentialBuckets(0.005, 2, 14)

// CycleMetrics are the weight cycle's own metrics.
type CycleMetrics struct {
	CycleDuration    prometheus.Histogram
	PhaseDuration    *prometheus.HistogramVec
	EstimatedPushes  prometheus.Counter
	LastSuccess      prometheus.Gauge
	DeferredServices prometheus.Gauge
	ModelOverrules   prometheus.Counter
	Reliefs          prometheus.Counter
	CheckDuration    prometheus.Histogram
}

// NewCycleMetrics registers the weight cycle's metrics with reg.
func NewCycleMetrics(reg prometheus.Registerer) *CycleMetrics {
	m := &CycleMetrics{
		CycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "adaptivelb_weight_cycle_duration_seconds",
			Help:    "Duration of one weight cycle: metrics fetch, engine and the burst of writes.",
			Buckets: cycleBuckets,
		}),
		PhaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "adaptivelb_weight_cycle_phase_seconds",
			Help: "Duration of one phase of a weight cycle, by phase: " +
				PhaseGather + " (list the AdaptiveLoadBalancers and read their Services, EndpointSlices, Pods and ServiceEntries from the cache), " +
				PhaseFetch + " (the TSDB queries), " +
				PhaseEvaluate + " (the weight engine and the cycle's plan), " +
				PhaseWrite + " (the burst of ServiceEntry weight writes), " +
				PhaseStatus + " (the AdaptiveLoadBalancer status changes: handed to the status queue, or written when no queue runs). " +
				"Each phase a cycle goes through is observed once per cycle; fetch, evaluate and write only in a cycle with a Service due.",
			Buckets: cycleBuckets,
		}, []string{"phase"}),
		EstimatedPushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "adaptivelb_estimated_istiod_pushes_total",
			Help: "istiod pushes the operator's weight writes cause, by istiod's debounce rule (PILOT_DEBOUNCE_AFTER/MAX).",
		}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "adaptivelb_weight_cycle_last_success_timestamp_seconds",
			Help: "Unix time of the last weight cycle that completed.",
		}),
		DeferredServices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "adaptivelb_weight_writes_deferred",
			Help: "Services whose weight write waits for the next cycle's budget.",
		}),
		ModelOverrules: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "adaptivelb_model_overrules_total",
			Help: "Weight writes that moved a Service toward the capacity split because measurements overruled the tail algorithm's latency model (a pod group the weights loaded to its CPU limit, or a tail the model cannot explain).",
		}),
		Reliefs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "adaptivelb_reliefs_total",
			Help: "Weight writes of the check between cycles: a pod's latency, CPU or CPU per request jumped since the last cycle, and its weight was cut at once (the others moved toward the capacity split when it queued).",
		}),
		CheckDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "adaptivelb_fast_check_duration_seconds",
			Help:    "Duration of one check between weight cycles: reading the checked Services from the cache, their pods' short-window metrics fetch, and the reliefs' writes.",
			Buckets: cycleBuckets,
		}),
	}
	m.CycleDuration = register(reg, m.CycleDuration)
	m.PhaseDuration = register(reg, m.PhaseDuration)
	m.EstimatedPushes = register(reg, m.EstimatedPushes)
	m.LastSuccess = register(reg, m.LastSuccess)
	m.DeferredServices = register(reg, m.DeferredServices)
	m.ModelOverrules = register(reg, m.ModelOverrules)
	m.Reliefs = register(reg, m.Reliefs)
	m.CheckDuration = register(reg, m.CheckDuration)
	return m
}

// StatusQueueMetrics are the status queue's own metrics.
type StatusQueueMetrics struct {
	Depth prometheus.Gauge
	Lag   prometheus.Histogram
}

// NewStatusQueueMetrics registers the status queue's metrics with reg.
func NewStatusQueueMetrics(reg prometheus.Registerer) *StatusQueueMetrics {
	return &StatusQueueMetrics{
		Depth: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "adaptivelb_status_queue_depth",
			Help: "AdaptiveLoadBalancers whose status change the mirror or the weight path has handed over and the status queue has not written yet.",
		})),
		Lag: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "adaptivelb_status_write_lag_seconds",
			Help:    "Time from the hand-over of an AdaptiveLoadBalancer's status change (the first, when several were written as one) to its write.",
			Buckets: cycleBuckets,
		})),
	}
}
