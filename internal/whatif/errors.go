package whatif

import "errors"

// Sentinel errors for input the what-if cannot work from. Each comes wrapped with what was wrong
// and what to do; callers test them with errors.Is.
var (
	// ErrNoMetrics: the TSDB has no series for the Service in the window.
	ErrNoMetrics = errors.New("no metrics for the Service")
	// ErrNoMesh: the Service's pods run without Istio sidecars, so nothing reports its requests.
	ErrNoMesh = errors.New("the Service is not in the mesh")
	// ErrTooLittleData: the window holds less than MinData of the Service's requests.
	ErrTooLittleData = errors.New("too little data in the window")
	// ErrNoCPULimits: some pods' CPU limits could be read neither from the cluster nor from
	// kube-state-metrics.
	ErrNoCPULimits = errors.New("CPU limits unknown")
	// ErrIstioMetricNames: pods report the latency histogram under another name than the one
	// the operator reads (sidecars of different Istio versions).
	ErrIstioMetricNames = errors.New("latency histograms under different Istio metric names")
	// ErrNoClientSidecars: no client proxy reports requests to the Service.
	ErrNoClientSidecars = errors.New("no client sidecar calls the Service")
	// ErrModelDisagrees: the scenario, run under the policy in force, does not reproduce the
	// measurements; no gain is predicted.
	ErrModelDisagrees = errors.New("the model does not reproduce the measurements")
)
