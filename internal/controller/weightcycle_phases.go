package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// The phases of a weight cycle, the values of adaptivelb_weight_cycle_phase_seconds's phase
// label. Together they tell the operator's own work (gather, evaluate) from its waits on the
// TSDB (fetch) and on the API server (write, status).
const (
	// PhaseGather lists the AdaptiveLoadBalancers and reads each one's Service, EndpointSlices,
	// Pods and ServiceEntry slices from the cache (dueTargets).
	PhaseGather = "gather"
	// PhaseFetch is the batched TSDB queries.
	PhaseFetch = "fetch"
	// PhaseEvaluate is the weight engine on each due Service and the cycle's plan across them.
	PhaseEvaluate = "evaluate"
	// PhaseWrite is the burst of ServiceEntry weight writes.
	PhaseWrite = "write"
	// PhaseStatus is the AdaptiveLoadBalancer status writes: of the due Services, and of those
	// Frozen or whose inputs could not be read.
	PhaseStatus = "status"
)

// phaseTimer charges the time of one cycle, on the cycle's clock, to its phases in turn, and
// observes each phase the cycle went through once at the end (a phase run in two parts, as the
// status writes are, is observed as their sum).
type phaseTimer struct {
	clock clock.PassiveClock
	mark  time.Time
	spent map[string]time.Duration
}

func newPhaseTimer(c clock.PassiveClock, start time.Time) *phaseTimer {
	return &phaseTimer{clock: c, mark: start, spent: map[string]time.Duration{}}
}

// done charges the time since the previous phase ended (or the cycle started) to phase.
func (p *phaseTimer) done(phase string) {
	now := p.clock.Now()
	p.spent[phase] += now.Sub(p.mark)
	p.mark = now
}

// observe records each phase the cycle went through.
func (p *phaseTimer) observe(h *prometheus.HistogramVec) {
	for phase, d := range p.spent {
		h.WithLabelValues(phase).Observe(d.Seconds())
	}
}
