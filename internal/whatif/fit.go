package whatif

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
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

// group sorts the measured pods into groups and sets each group's figures.
func (md *Model) group(m *Measurements) error {
	type costed struct {
		p    *PodMeasurement
		cost float64
	}
	steps := len(m.Load)
	var measured, changing []costed
	var unmeasured []*PodMeasurement
	profiles := map[*PodMeasurement][]costBlock{}
	for i := range m.Pods {
		p := &m.Pods[i]
		switch {
		case !(p.RequestRate > 0 && p.CPUCores > 0):
			unmeasured = append(unmeasured, p)
		case speedChanges(costBlocks([]*PodMeasurement{p}, steps, m.Step)):
			profiles[p] = costBlocks([]*PodMeasurement{p}, steps, m.Step)
			changing = append(changing, costed{p, p.CPUCores / p.RequestRate})
		default:
			measured = append(measured, costed{p, p.CPUCores / p.RequestRate})
		}
	}
	if len(measured) == 0 && len(changing) > 0 {
		measured, changing = changing, nil // every pod changed alike: nothing steady to set apart
	}
	if len(measured) == 0 {
		return fmt.Errorf("%w: no pod of Service %s/%s has both CPU and requests between %s and %s, so no cost per request can be measured",
			ErrNoMetrics, m.Namespace, m.Service, stamp(m.From), stamp(m.To))
	}
	limitOf := func(p *PodMeasurement) float64 {
		if p.HasCPULimit {
			return p.CPULimit
		}
		return 0
	}
	sort.Slice(measured, func(i, j int) bool {
		a, b := measured[i], measured[j]
		if la, lb := limitOf(a.p), limitOf(b.p); la != lb {
			return la < lb
		}
		if a.p.NodeCores != b.p.NodeCores {
			return a.p.NodeCores < b.p.NodeCores
		}
		return a.cost < b.cost
	})
	var groups []*Group
	var cheapest float64
	for _, c := range measured {
		var g *Group
		if n := len(groups); n > 0 {
			last := groups[n-1]
			if last.CPULimit == limitOf(c.p) && last.Cores == c.p.NodeCores && c.cost <= cheapest*groupSpread {
				g = last
			}
		}
		if g == nil {
			g = &Group{CPULimit: limitOf(c.p), HasCPULimit: c.p.HasCPULimit, Cores: c.p.NodeCores, limitOrigin: c.p.CPULimitOrigin, coresOrigin: c.p.NodeCoresOrigin}
			groups = append(groups, g)
			cheapest = c.cost
		}
		md.addPod(g, c.p)
	}
	// A pod whose speed changed joins a group of pods of its shape that changed alike, step by
	// step, never a steady one.
	changed := map[*Group]bool{}
	for _, c := range changing {
		var g *Group
		for _, cand := range groups {
			if changed[cand] && cand.CPULimit == limitOf(c.p) && cand.Cores == c.p.NodeCores && sameProfile(profiles[podByName(m, cand.Pods[0])], profiles[c.p], steps) {
				g = cand
				break
			}
		}
		if g == nil {
			g = &Group{CPULimit: limitOf(c.p), HasCPULimit: c.p.HasCPULimit, Cores: c.p.NodeCores, limitOrigin: c.p.CPULimitOrigin, coresOrigin: c.p.NodeCoresOrigin}
			groups = append(groups, g)
			changed[g] = true
		}
		md.addPod(g, c.p)
	}
	// A pod without CPU or requests joins the largest group of its shape, or the largest.
	joined := map[*PodMeasurement]*Group{}
	for _, p := range unmeasured {
		best := groups[0]
		for _, g := range groups {
			same := g.CPULimit == limitOf(p) && g.Cores == p.NodeCores
			bestSame := best.CPULimit == limitOf(p) && best.Cores == p.NodeCores
			if (same && !bestSame) || (same == bestSame && len(g.Pods) > len(best.Pods)) {
				best = g
			}
		}
		md.addPod(best, p)
		joined[p] = best
	}
	for _, g := range groups {
		g.windowAverages(m, steps)
		g.CostSeconds = g.CPUCores / g.RequestRate
		if g.CPUCores <= 0 || g.RequestRate <= 0 {
			g.CostSeconds = math.NaN()
		}
	}
	minCost := math.Inf(1)
	for _, g := range groups {
		if g.CostSeconds < minCost {
			minCost = g.CostSeconds
		}
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].CostSeconds < groups[j].CostSeconds })
	for _, g := range groups {
		if changed[g] {
			var pods []*PodMeasurement
			for _, name := range g.Pods {
				pods = append(pods, podByName(m, name))
			}
			if st := speedSteps(costBlocks(pods, steps, m.Step), minCost, m.Step); len(st) > 1 {
				g.SpeedSteps = st
			}
		}
		g.Speed = minCost / g.CostSeconds
		g.P99 = quantile(g.Latency, 0.99)
		capacity := g.Cores
		if g.HasCPULimit {
			capacity = math.Min(g.CPULimit, g.Cores)
		}
		coverage := 0.0
		for _, name := range g.Pods {
			coverage += podByName(m, name).Coverage
		}
		g.MeanPods = coverage
		// The group's CPU is over the window (windowAverages), so it is shared by the pods
		// serving on average, not by every pod that ever served: after a rolling restart the
		// group has named twice its pods.
		g.Utilisation = g.CPUCores / math.Max(coverage, 1) / capacity
		if m.Calm != nil {
			g.CalmUtilisation = g.stretchUtilisation(m, *m.Calm, capacity)
		}
		g.Replicas = max(1, int(math.Round(coverage)))
		var pods []*PodMeasurement
		for _, name := range g.Pods {
			pods = append(pods, podByName(m, name))
		}
		if st := replicaSteps(pods, steps, m.Step); st != nil {
			g.ReplicaSteps, g.Replicas = st, st[0].Replicas
		}
		g.Rates = meanRates(m, g.Pods)
		slices.Sort(g.InstanceTypes)
		g.InstanceTypes = slices.Compact(g.InstanceTypes)
	}
	nameGroups(groups)
	for _, p := range unmeasured {
		md.Notes = append(md.Notes, fmt.Sprintf("%s served no measurable requests or has no CPU series; it counts in group %s", p.Name, joined[p].Name))
	}
	for _, g := range groups {
		md.Groups = append(md.Groups, *g)
	}
	return nil
}

// windowAverages sets the group's CPU and request rate to the mean over the window's steps of
// its pods' per-step values, where every pod has them. A pod that served part of the window then
// counts for that part: over the whole window, VictoriaMetrics' rate() of a series that starts
// or ends inside it is its rate while it existed, which would count a pod added half-way as if
// it had served throughout.
func (g *Group) windowAverages(m *Measurements, steps int) {
	if steps == 0 {
		return
	}
	cpu, rate := 0.0, 0.0
	for _, name := range g.Pods {
		p := podByName(m, name)
		if len(p.CPUs) != steps || len(p.Rates) != steps || !(p.CPUCores > 0) {
			return
		}
		measuredCPU := false
		for k := range steps {
			if !math.IsNaN(p.CPUs[k]) {
				cpu += p.CPUs[k]
				measuredCPU = true
			}
			if !math.IsNaN(p.Rates[k]) {
				rate += p.Rates[k]
			}
		}
		if !measuredCPU {
			return
		}
	}
	g.CPUCores, g.RequestRate = cpu/float64(steps), rate/float64(steps)
}

// stretchUtilisation is a pod's mean CPU over its capacity in the steps of a stretch, from the
// per-step CPU of the pods serving in each; NaN when no step has it.
func (g *Group) stretchUtilisation(m *Measurements, st Stretch, capacity float64) float64 {
	sum, n := 0.0, 0
	for k := st.From; k < st.To; k++ {
		cpu, pods := 0.0, 0
		for _, name := range g.Pods {
			p := podByName(m, name)
			if k < len(p.CPUs) && !math.IsNaN(p.CPUs[k]) && k < len(p.Rates) && !math.IsNaN(p.Rates[k]) {
				cpu += p.CPUs[k]
				pods++
			}
		}
		if pods > 0 {
			sum += cpu / float64(pods) / capacity
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

func (md *Model) addPod(g *Group, p *PodMeasurement) {
	g.Pods = append(g.Pods, p.Name)
	if p.CPUCores > 0 {
		g.CPUCores += p.CPUCores
	}
	if p.RequestRate > 0 {
		g.RequestRate += p.RequestRate
	}
	g.Latency = g.Latency.Add(p.Latency)
	g.CalmLatency = g.CalmLatency.Add(p.CalmLatency)
	if p.InstanceType != "" {
		g.InstanceTypes = append(g.InstanceTypes, p.InstanceType)
	}
}

func podByName(m *Measurements, name string) *PodMeasurement {
	for i := range m.Pods {
		if m.Pods[i].Name == name {
			return &m.Pods[i]
		}
	}
	return nil
}

// meanRates is the mean rate per serving pod in each step.
func meanRates(m *Measurements, pods []string) []float64 {
	out := make([]float64, len(m.Load))
	for k := range out {
		sum, n := 0.0, 0
		for _, name := range pods {
			if p := podByName(m, name); p != nil && k < len(p.Rates) && !math.IsNaN(p.Rates[k]) {
				sum += p.Rates[k]
				n++
			}
		}
		out[k] = math.NaN()
		if n > 0 {
			out[k] = sum / float64(n)
		}
	}
	return out
}

// podStem is a pod name without its last dash-separated part: "fib25-0" → "fib25".
var podStem = regexp.MustCompile(`^(.+)-[^-]+$`)

// nameGroups names each group after what its pods share and the other groups' do not: their
// name stem, else their instance type, else its rank by cost.
func nameGroups(groups []*Group) {
	stems := make([]string, len(groups))
	for i, g := range groups {
		for _, p := range g.Pods {
			stem := p
			if s := podStem.FindStringSubmatch(p); s != nil {
				stem = s[1]
			}
			if stems[i] == "" {
				stems[i] = stem
			} else if stems[i] != stem {
				stems[i] = "-"
			}
		}
	}
	types := make([]string, len(groups))
	for i, g := range groups {
		if len(g.InstanceTypes) == 1 {
			types[i] = g.InstanceTypes[0]
		}
	}
	for _, names := range [][]string{stems, types} {
		if distinctNames(names) {
			for i, g := range groups {
				g.Name = names[i]
			}
			return
		}
	}
	for i, g := range groups {
		g.Name = fmt.Sprintf("group-%d", i+1)
	}
}

func distinctNames(names []string) bool {
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || n == "-" || seen[n] {
			return false
		}
		seen[n] = true
	}
	return true
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
