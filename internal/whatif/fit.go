package whatif

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Model is a simulator scenario fitted to a Service's measurements, with where each of its values
// came from and the measured figures it must reproduce.
type Model struct {
	Namespace, Service string
	From, To           time.Time
	Step               time.Duration
	// Scenario is the fitted scenario; YAML is the same scenario as written out, with a comment
	// per field saying where it came from. Scenario is parsed back from YAML, so the two agree.
	Scenario *sim.Scenario
	YAML     []byte
	// Warmup is simulated before the window, at its first rate, and excluded from statistics.
	Warmup time.Duration
	Groups []Group
	// ServiceP99 is the Service's measured client-side p99 (ms); ClientLatency its histogram.
	ServiceP99    float64
	ClientLatency sim.Histogram
	// Current is the policy in force over the window.
	Current Policy
	// Cost is the request-cost shape (family and parameters) and how each candidate fitted.
	Cost CostFit
	// Assumptions lists, in words, every fact that was assumed rather than measured or read.
	Assumptions []string
	// Notes are facts worth telling that change nothing.
	Notes []string

	// balancerFrom says where the clients' balancer came from.
	balancerFrom Origin
}

// Group is a set of pods with the same CPU limit, node CPU count and cost per request (within
// groupSpread of the group's cheapest).
type Group struct {
	Name string
	Pods []string
	// Replicas is the number of pods the scenario gives the group: the pods' average number in
	// service over the window, rounded.
	Replicas      int
	MeanPods      float64
	CPULimit      float64
	HasCPULimit   bool
	Cores         float64
	InstanceTypes []string
	// CostSeconds is the CPU-seconds one request takes (the group's CPU over its requests);
	// Speed is the cheapest group's cost over this one's.
	CostSeconds float64
	Speed       float64
	// Measured over the window: the group's CPU (cores, summed over its pods), request rate
	// (summed), pooled server-side latency and its p99 (ms).
	CPUCores    float64
	RequestRate float64
	Latency     sim.Histogram
	P99         float64
	// Utilisation is a pod's average CPU over its capacity (limit, or node CPUs).
	Utilisation float64
	// CalmLatency and CalmUtilisation are the pooled histogram and the utilisation over the
	// window's calmest stretch (Measurements.Calm); empty when there is none.
	CalmLatency     sim.Histogram
	CalmUtilisation float64
	// Rates is the group's mean rate per pod in each step, NaN where none served.
	Rates []float64
	// ReplicaSteps, for a group whose number of pods changed during the window, is that number
	// from each change on (the first at the window's start); empty when it held.
	ReplicaSteps []ReplicaStep
	// SpeedSteps, for a group whose speed changed during the window, is its speed from each
	// change on (the first at the window's start); empty for a group of steady speed.
	SpeedSteps []SpeedStep

	limitOrigin, coresOrigin Origin
}

// SpeedStep is a group's speed from a time on.
type SpeedStep struct {
	// At is the offset from the window's start.
	At    time.Duration
	Speed float64
}

// Policy is a balancing policy the way the simulator runs it.
type Policy struct {
	// Name is a sim policy (least_request, round_robin, random, tail, ...) or "current weights".
	Name string
	// StaticWeights, for "current weights", is each group's weight.
	StaticWeights map[string]int
}

// PolicyCurrentWeights names the weights in force, as read from adaptivelb_endpoint_weight.
const PolicyCurrentWeights = "current weights"

// Options tune the fit.
type Options struct {
	// Warmup is simulated before the window; DefaultWarmup when zero.
	Warmup time.Duration
	// Seed of every simulation; 1 when zero.
	Seed int64
}

// DefaultWarmup lets the controller policies settle before the window starts, as the bench does.
const DefaultWarmup = 2 * time.Minute

// groupSpread is how far above its cheapest member a pod's cost per request may be and still join
// its group, as the tail algorithm groups pods (internal/weights).
const groupSpread = 1.2

// assumedNodeCoresPerLimit is the node CPU count assumed per core of limit when the node is
// unknown, as the tail algorithm's model assumes.
const assumedNodeCoresPerLimit = 4

// Istio's sidecars run two worker threads unless told otherwise (proxy concurrency).
const assumedClientWorkers = 2

// Fit builds the scenario the measurements describe.
func Fit(m *Measurements, opts Options) (*Model, error) {
	if opts.Warmup == 0 {
		opts.Warmup = DefaultWarmup
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	md := &Model{Namespace: m.Namespace, Service: m.Service, From: m.From, To: m.To, Step: m.Step, Warmup: opts.Warmup,
		ClientLatency: m.Clients.Latency, ServiceP99: quantile(m.Clients.Latency, 0.99), Notes: slices.Clone(m.Notes)}
	if err := checkLimits(m, md); err != nil {
		return nil, err
	}
	if err := md.group(m); err != nil {
		return nil, err
	}
	md.current(m)
	md.balancerFrom = m.Clients.LBOrigin
	md.Cost = fitCost(md, m.Calm, opts.Seed)
	data, err := md.renderYAML(m, opts.Seed)
	if err != nil {
		return nil, err
	}
	sc, err := sim.ParseScenario(data, "fitted scenario")
	if err != nil {
		return nil, fmt.Errorf("the fitted scenario does not validate (a bug; please report it with the measurements): %w", err)
	}
	md.Scenario, md.YAML = sc, data
	return md, nil
}

// checkLimits refuses pods whose CPU limit is unknown, and assumes the node CPU count where it
// is unknown.
func checkLimits(m *Measurements, md *Model) error {
	var noLimit, noCores, unlimitedUnknown []string
	for i := range m.Pods {
		p := &m.Pods[i]
		switch {
		case p.CPULimitOrigin == "":
			noLimit = append(noLimit, p.Name)
		case p.NodeCoresOrigin == "" && !p.HasCPULimit:
			unlimitedUnknown = append(unlimitedUnknown, p.Name)
		case p.NodeCoresOrigin == "":
			noCores = append(noCores, p.Name)
			p.NodeCores, p.NodeCoresOrigin = math.Ceil(assumedNodeCoresPerLimit*p.CPULimit), Assumed
		}
	}
	if len(noLimit) > 0 {
		return fmt.Errorf("%w: the CPU limits of %s (%d of %d pods of Service %s/%s) could be read neither from the cluster nor from kube-state-metrics (kube_pod_container_resource_limits). A pod's capacity in the model is its CPU limit, so it is not guessed: pass --kubeconfig so the pod specs are read, or run kube-state-metrics and scrape it",
			ErrNoCPULimits, listNames(noLimit), len(noLimit), len(m.Pods), m.Namespace, m.Service)
	}
	if len(unlimitedUnknown) > 0 {
		return fmt.Errorf("%w: %s run without a CPU limit and the CPU counts of their nodes are unknown, so their capacity is: pass --kubeconfig so the nodes are read, or scrape kube-state-metrics (kube_pod_info, kube_node_status_capacity)",
			ErrNoCPULimits, listNames(unlimitedUnknown))
	}
	if len(noCores) > 0 {
		md.Assumptions = append(md.Assumptions, fmt.Sprintf("the nodes of %s have %d× their CPU limit in CPUs (their nodes are unknown; the operator's tail model assumes the same)", listNames(noCores), assumedNodeCoresPerLimit))
	}
	return nil
}

// current sets the policy in force: the weights the operator publishes, or the clients'
// balancer.
func (md *Model) current(m *Measurements) {
	if len(m.CurrentWeights) == 0 {
		md.Current = Policy{Name: m.Clients.LB}
		return
	}
	var all []int
	for _, w := range m.CurrentWeights {
		all = append(all, w)
	}
	weights := map[string]int{}
	for _, g := range md.Groups {
		var ws []int
		for _, p := range g.Pods {
			if w, ok := m.CurrentWeights[p]; ok {
				ws = append(ws, w)
			}
		}
		if len(ws) == 0 {
			ws = all
		}
		slices.Sort(ws)
		weights[g.Name] = ws[len(ws)/2]
	}
	md.Current = Policy{Name: PolicyCurrentWeights, StaticWeights: weights}
	md.Notes = append(md.Notes, "the Service's endpoints are weighted (adaptivelb_endpoint_weight): the policy in force is simulated as each group's median weight at the window's end, held fixed")
}

// listNames shortens a long list of pod names for a message.
func listNames(names []string) string {
	const show = 5
	if len(names) <= show {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:show], ", "), len(names)-show)
}
