// Package weights turns per-endpoint observations into Envoy endpoint weights.
//
// It is pure: no clock, no I/O, no Kubernetes. The operator and the simulator call the same
// Compute with the same Settings, so what the simulator shows is what the operator does.
package weights

// Algorithm names a weight algorithm. The names are part of the CRD and the CLI.
type Algorithm string

const (
	// AlgorithmCPUDistance ports the published operator's distance rule: nudge each weight
	// against its CPU's distance from the fleet mean, clamp, then rescale around mid-range.
	AlgorithmCPUDistance Algorithm = "cpu-distance"
	// AlgorithmCapacity sets weights proportional to each endpoint's estimated capacity
	// (CPU limit / CPU cost per request), corrected by the traffic share Envoy really delivered.
	AlgorithmCapacity Algorithm = "capacity"
	// AlgorithmTail splits traffic to minimise the predicted p99 latency of the whole fleet: pods
	// are grouped by CPU cost per request and CPU limit, each group gets a queueing model of one
	// pod calibrated against its latency histogram, and the group shares that minimise the
	// mix's p99 become the target shares of the capacity algorithm's feedback.
	AlgorithmTail Algorithm = "tail"
	// AlgorithmCPUShare ports the published operator's later rule: each weight moves toward a
	// share of the weight sum proportional to weight / CPU. It is a baseline for the simulator
	// and the bench, not offered by the CRD, so it is not in Algorithms.
	AlgorithmCPUShare Algorithm = "cpu-share"
)

// Algorithms lists every known algorithm, in the order the CLI documents them.
var Algorithms = []Algorithm{AlgorithmTail, AlgorithmCapacity, AlgorithmCPUDistance}

// Endpoint is what the engine knows about one endpoint for one cycle.
type Endpoint struct {
	// ID identifies the endpoint (pod name or IP); it must be unique within one Compute call.
	ID string
	// CPUCores is the CPU used, in cores, averaged over the observation window.
	CPUCores float64
	// CPULimitCores is the pod's CPU limit in cores; 0 means no limit is set.
	CPULimitCores float64
	// RequestRate is the served request rate, in requests per second, over the window.
	RequestRate float64
	// ErrorRate is the rate of failed requests per second; 0 when unknown.
	ErrorRate float64
	// LatencyP99Seconds is the endpoint's p99 latency; 0 when unknown.
	LatencyP99Seconds float64
	// HasMetrics is false when the endpoint's metrics are missing or stale; its numbers are then ignored.
	HasMetrics bool
	// CurrentWeight is the weight now applied; 0 for an endpoint that has none yet.
	CurrentWeight int
	// NodeCPUCores is the CPU count of the endpoint's node (its allocatable CPUs): how many of the
	// pod's requests can run at once before the CPU limit throttles them. 0 when unknown; the
	// tail algorithm then assumes four times the CPU limit.
	NodeCPUCores float64
	// LatencyBuckets is the endpoint's server-side latency histogram over the window (Istio's
	// istio_request_duration_milliseconds_bucket, reporter="destination", increase over the
	// window), cumulative as Prometheus stores it: Count requests completed within
	// UpperBoundSeconds. The +Inf bucket may be included. Empty when unknown; the tail algorithm
	// then uses its default request-size variability.
	LatencyBuckets []LatencyBucket
	// Relieved marks an endpoint whose weight a relief between cycles (Relieve) cut recently, as
	// the caller counts it (the operator and the simulator: within restoreAfterRelief of the cut).
	// The cycle raises its weight by at most reliefRestoreStep per cycle.
	Relieved bool
	// OverloadAnswered marks an endpoint whose weight a relief cut after the window began: the
	// window still shows the queue the relief answered, so the cycle does not halve the weight
	// again for it.
	OverloadAnswered bool
}

// LatencyBucket is one cumulative histogram bucket.
type LatencyBucket struct {
	UpperBoundSeconds float64
	Count             float64
}

// Input is one Service's endpoints for one cycle.
type Input struct {
	Endpoints []Endpoint
	// WindowCoverage is the fraction of the observation window during which the current weights
	// were already in force (0..1). Traffic shares observed over a window that straddles a weight
	// change mix the old weights with the new, so feedback on them would over-correct. 0 means
	// unknown and is treated as 1.
	WindowCoverage float64
	// WindowSeconds is the length of the observation window the rates were averaged over. With
	// it the engine knows how many requests stand behind an endpoint's observed share and does
	// not chase the share's sampling noise. 0 means unknown: no such allowance.
	WindowSeconds float64
	// RecentPeakRequestRate is the highest request rate of the whole Service (all endpoints
	// together) over the recent past, each rate averaged over one window: for example
	// max_over_time over the last 10 minutes of the summed windowed rate. The tail algorithm
	// plans for it so that a burst does not land on pods loaded for a quiet spell. 0 means
	// unknown: the current rate is used.
	RecentPeakRequestRate float64
	// Replan marks a re-plan after endpoints left the Service: the rates are the last cycle's,
	// observed while the departed endpoints still served, and RecentPeakRequestRate still holds
	// their traffic, so the engine plans the whole load over the survivors. The window-settle
	// rules (a window straddling a weight change, a load below the recent peak) do not hold the
	// weights back then, nor does the tail split's tolerance around the observed split (that
	// split is the old membership's): the change is one of membership, not noise, and it is known
	// now, so the feedback also takes its whole correction (gain 1) instead of Gain's share. Every
	// bound (min and max weight, step and ratio limits, the overload cut) still applies, and so
	// does the dead band: a re-plan that moves no traffic is not worth a write.
	Replan bool
	// ModelDistrust is the tail algorithm's distrust of its model, in [0, 1], as the previous
	// Decision returned it (Decision.ModelDistrust): 0 follows the model's optimum, 1 the
	// capacity split. The caller carries it from one cycle to the next; 0 (the zero value) is a
	// fresh start.
	ModelDistrust float64
	// ProjectedRequestRate is the Service's request rate expected by the time the next cycle's
	// weights take over (the recent trend extrapolated; see ProjectRequestRate). The tail
	// algorithm plans for the largest of it, the current and the recent peak rate, so that a
	// rising load does not leave the fast pods planned for a load already passed. 0 means
	// unknown.
	ProjectedRequestRate float64
	// SurgeFactor is the tail algorithm's surge bound for this Service: SurgeBound of its load
	// history, or the user's setting. 0 means Settings.Tail.SurgeFactor.
	SurgeFactor float64
	// LoadHistory is what the Service's past load says about how fast it rises (LearnLoadHistory);
	// the zero value is unknown. The tail algorithm plans its first split, while the recent peak
	// is unknown, with a margin from it.
	LoadHistory LoadHistory
}

// Result is the engine's decision for one endpoint.
type Result struct {
	ID     string
	Weight int
	// Reason is a short, human-readable explanation, e.g. "no metrics: median weight".
	Reason string
}

// Decision is the outcome of one Compute call.
type Decision struct {
	// Endpoints holds one result per input endpoint, in input order.
	Endpoints []Result
	// Changed is false when every weight stayed inside the dead band: the caller must not write.
	// Endpoints then carry the current weights unchanged.
	Changed bool
	// Reason summarises the decision for a condition or an Event.
	Reason string
	// ModelDistrust is the distrust of the tail algorithm's model to pass to the next cycle
	// (Input.ModelDistrust). 0 for the other algorithms.
	ModelDistrust float64
	// ModelOverruled is set when this window's measurements overruled the tail algorithm's
	// model: it says which group disagreed and how. The weights then move toward the capacity
	// split at once, past the dead band and the write gate; the caller should say so in status
	// and not hold the write back for its budget.
	ModelOverruled string
}

// Weights returns the decided weights keyed by endpoint ID.
func (d Decision) Weights() map[string]int {
	m := make(map[string]int, len(d.Endpoints))
	for _, r := range d.Endpoints {
		m[r.ID] = r.Weight
	}
	return m
}
