package controller

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Write reasons for adaptivelb_serviceentry_writes_total.
const (
	WriteReasonEndpoints = "endpoints"
	WriteReasonWeights   = "weights"
)

// Metrics are the operator's own golden signals, beside controller-runtime's workqueue metrics.
type Metrics struct {
	// EndpointPropagation is the delay from an EndpointSlice event reaching the operator to the
	// ServiceEntry reflecting it.
	EndpointPropagation prometheus.Histogram
	// ServiceEntryWrites counts ServiceEntry creates and updates by reason.
	ServiceEntryWrites *prometheus.CounterVec
	// ServiceEntryWriteDuration times the endpoint mirror's ServiceEntry writes, from the call
	// to the answer (the client's rate limit and the API server): the part of the propagation
	// delay that is the API server's, apart from the operator's own queue and work.
	ServiceEntryWriteDuration prometheus.Histogram
	// ReconcileErrors counts failed reconciles by reason.
	ReconcileErrors *prometheus.CounterVec
	// StaleServiceEntryDeletions counts ServiceEntries deleted because their mirror kept failing
	// for longer than the stale timeout, and the deletions that failed.
	StaleServiceEntryDeletions *prometheus.CounterVec
	// EndpointWeights is every endpoint's weight, or nil when turned off (one series per pod:
	// too many on the largest clusters).
	EndpointWeights *prometheus.GaugeVec

	mu     sync.Mutex
	series map[string]map[string]prometheus.Labels // namespace/name → pod+ip → labels
}

// EnableEndpointWeights adds the per-endpoint weight gauge, registered with reg.
func (m *Metrics) EnableEndpointWeights(reg prometheus.Registerer) {
	m.EndpointWeights = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "adaptivelb_endpoint_weight",
		Help: "Weight of each endpoint in its ServiceEntry (in DryRun, the weight that would be written).",
	}, []string{"namespace", "adaptiveloadbalancer", "pod", "ip"}))
}

// SetEndpointWeights publishes one AdaptiveLoadBalancer's weights and drops the series of
// endpoints that left it.
func (m *Metrics) SetEndpointWeights(namespace, alb string, weights map[string]int, pods map[string]string) {
	if m.EndpointWeights == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.series == nil {
		m.series = map[string]map[string]prometheus.Labels{}
	}
	key := namespace + "/" + alb
	next := map[string]prometheus.Labels{}
	for ip, w := range weights {
		l := prometheus.Labels{"namespace": namespace, "adaptiveloadbalancer": alb, "pod": pods[ip], "ip": ip}
		m.EndpointWeights.With(l).Set(float64(w))
		next[pods[ip]+"|"+ip] = l
	}
	for id, l := range m.series[key] {
		if _, ok := next[id]; !ok {
			m.EndpointWeights.Delete(l)
		}
	}
	if len(next) == 0 {
		delete(m.series, key)
	} else {
		m.series[key] = next
	}
}

// NewMetrics creates the metrics and registers them with reg (controller-runtime's registry in
// the operator, a private one in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		EndpointPropagation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "adaptivelb_endpoint_propagation_seconds",
			Help: "Delay from an EndpointSlice change reaching the operator to the ServiceEntry reflecting it.",
			// From 1 ms to about 16 s: istiod's own guidance alerts at 1 s and 2 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		ServiceEntryWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "adaptivelb_serviceentry_writes_total",
			Help: "ServiceEntry creates and updates, by reason (endpoints: membership; weights: a weight cycle).",
		}, []string{"reason"}),
		ServiceEntryWriteDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "adaptivelb_serviceentry_write_duration_seconds",
			Help:    "Duration of the endpoint mirror's ServiceEntry creates and updates, from the call to the API server's answer (the client-side rate limit included): the API server's part of adaptivelb_endpoint_propagation_seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		ReconcileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "adaptivelb_reconcile_errors_total",
			Help: "Failed reconciles of AdaptiveLoadBalancers, by reason.",
		}, []string{"reason"}),
		StaleServiceEntryDeletions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "adaptivelb_stale_serviceentry_deletions_total",
			Help: "ServiceEntries deleted because mirroring their Service kept failing for longer than --stale-serviceentry-timeout (result=deleted), and such deletions that failed (result=failed).",
		}, []string{"result"}),
	}
	m.EndpointPropagation = register(reg, m.EndpointPropagation)
	m.StaleServiceEntryDeletions = register(reg, m.StaleServiceEntryDeletions)
	m.ServiceEntryWrites = register(reg, m.ServiceEntryWrites)
	m.ServiceEntryWriteDuration = register(reg, m.ServiceEntryWriteDuration)
	m.ReconcileErrors = register(reg, m.ReconcileErrors)
	return m
}

// register adds c to reg, or returns the collector already registered under the same name, so
// that two managers in one process (tests, or a restart of the manager) share the series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("register metric: %v", err))
	}
	return c
}

// DefaultMetrics registers the metrics with controller-runtime's registry, which the manager serves.
func DefaultMetrics() *Metrics { return NewMetrics(ctrlmetrics.Registry) }
