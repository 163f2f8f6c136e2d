// Package whatif answers "what would adaptive-lb do for my Service?" from the Service's own
// metrics: it reads what the mesh measured over a window (per-pod CPU, request rate and latency
// histogram, the client proxies, the load over time, the pods' CPU limits and nodes), fits a
// simulator scenario to it, proves the scenario by simulating the policy in force and comparing
// with the measurements, and only then predicts the other policies on the window's own load.
//
// The package reads the TSDB over HTTP and has no Kubernetes imports: facts read from the cluster
// come in as ClusterFacts, filled by the caller.
package whatif

import (
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Origin says where a fact came from; it is printed beside the fact and written as a comment in
// the scenario file.
type Origin string

const (
	// FromTSDB: measured, from the Service's own series.
	FromTSDB Origin = "measured"
	// FromCluster: read from the Kubernetes API.
	FromCluster Origin = "cluster"
	// FromKubeStateMetrics: read from kube-state-metrics series in the TSDB.
	FromKubeStateMetrics Origin = "kube-state-metrics"
	// Assumed: not measurable here; a stated default.
	Assumed Origin = "assumed"
)

// Measurements is what the mesh measured for one Service over a stretch of time.
type Measurements struct {
	Namespace, Service string
	// From and To bound the stretch the Service has data for, within the asked window.
	From, To time.Time
	// Step is the resolution of Load and of each pod's Rates.
	Step time.Duration
	// Load is the Service's request rate (server side) in each step: Load[k] covers
	// (From + k·Step, From + (k+1)·Step]. NaN where the TSDB has no value.
	Load []float64
	Pods []PodMeasurement
	// ServerLatency is the Service's pooled server-side latency (every pod's sidecar).
	ServerLatency sim.Histogram
	Clients       ClientMeasurement
	// CurrentWeights holds the endpoint weights in force at To (adaptivelb_endpoint_weight), by
	// pod; empty when the Service is not weighted.
	CurrentWeights map[string]int
	// Notes are facts worth telling the user that change nothing in the fit.
	Notes []string
	// Calm is the window's stretch of least load, whose latency histograms were read too (each
	// pod's CalmLatency): the cost distribution is fitted where pods are least loaded. Nil when
	// the load held too evenly for a calmer stretch to help.
	Calm *Stretch
}

// Stretch is a run of steps [From, To) of Measurements.Load.
type Stretch struct{ From, To int }

// PodMeasurement is one pod of the Service over the stretch.
type PodMeasurement struct {
	Name string
	// CPUCores and RequestRate are the pod's averages over the stretch (rate() over it).
	CPUCores, RequestRate float64
	// Coverage is the fraction of the stretch's steps in which the pod served.
	Coverage float64
	// Rates is the pod's request rate per step of Measurements.Load, NaN where it had none;
	// CPUs its CPU (cores) per step, NaN where it has no value.
	Rates, CPUs []float64
	// Latency is the pod's server-side latency histogram over the stretch; CalmLatency over the
	// calm stretch (Measurements.Calm).
	Latency, CalmLatency sim.Histogram

	// CPULimit is in cores; HasCPULimit false with a known origin means the pod has none.
	CPULimit         float64
	HasCPULimit      bool
	CPULimitOrigin   Origin // "" when unknown
	Node             string
	NodeCores        float64
	NodeCoresOrigin  Origin // "" when unknown
	InstanceType     string
	InstanceTypeFrom Origin
}

// ClientMeasurement describes the client proxies that call the Service.
type ClientMeasurement struct {
	// Proxies is the number of client pods whose sidecars reported requests to the Service.
	Proxies int
	// Latency is the client-side latency histogram, summed over the proxies.
	Latency sim.Histogram
	// LB is the client sidecars' balancer (sim.LB*), from the DestinationRule when the cluster was
	// read; LBOrigin says so.
	LB       string
	LBOrigin Origin
	LBSource string // e.g. "DestinationRule shop/web"
}

// ClusterFacts are what the Kubernetes API says about the Service, read by the caller.
type ClusterFacts struct {
	// Pods of the Service (its selector), by name.
	Pods map[string]ClusterPod
	// Nodes by name.
	Nodes map[string]ClusterNode
	// LB is the balancer of the DestinationRule for the Service's host (sim.LB*), "" when none
	// sets one; LBSource names the DestinationRule.
	LB, LBSource string
}

// ClusterPod is one pod as its spec says.
type ClusterPod struct {
	// CPULimit is the sum of the application containers' CPU limits; HasCPULimit is false when
	// a container has none (the pod is then unlimited).
	CPULimit    float64
	HasCPULimit bool
	Node        string
	// Sidecar is true when the pod runs an istio-proxy container.
	Sidecar bool
}

// ClusterNode is one node's CPU count and instance type.
type ClusterNode struct {
	Cores        float64
	InstanceType string
}

// ApplyCluster overrides the TSDB's and kube-state-metrics' facts with the cluster's, for the
// pods the cluster knows.
func (m *Measurements) ApplyCluster(c ClusterFacts) {
	for i := range m.Pods {
		p := &m.Pods[i]
		cp, ok := c.Pods[p.Name]
		if !ok {
			continue
		}
		p.CPULimit, p.HasCPULimit, p.CPULimitOrigin = cp.CPULimit, cp.HasCPULimit, FromCluster
		if cp.Node == "" {
			continue
		}
		p.Node = cp.Node
		if n, ok := c.Nodes[cp.Node]; ok {
			p.NodeCores, p.NodeCoresOrigin = n.Cores, FromCluster
			if n.InstanceType != "" {
				p.InstanceType, p.InstanceTypeFrom = n.InstanceType, FromCluster
			}
		}
	}
	if c.LB != "" {
		m.Clients.LB, m.Clients.LBOrigin, m.Clients.LBSource = c.LB, FromCluster, c.LBSource
	}
}
