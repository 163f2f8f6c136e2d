package whatif

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
)

// Grouping: the measured pods sorted into groups of one shape and cost, each group's figures
// over the window, its speed and replicas steps, and its name.

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
		if !(p.RequestRate > 0 && p.CPUCores > 0) {
			unmeasured = append(unmeasured, p)
			continue
		}
		if blocks := costBlocks([]*PodMeasurement{p}, steps, m.Step); speedChanges(blocks) {
			profiles[p] = blocks
			changing = append(changing, costed{p, p.CPUCores / p.RequestRate})
			continue
		}
		measured = append(measured, costed{p, p.CPUCores / p.RequestRate})
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
		g.windowAverages(g.members(m), steps)
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
		pods := g.members(m)
		if changed[g] {
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
		for _, p := range pods {
			coverage += p.Coverage
		}
		g.MeanPods = coverage
		// The group's CPU is over the window (windowAverages), so it is shared by the pods
		// serving on average, not by every pod that ever served: after a rolling restart the
		// group has named twice its pods.
		g.Utilisation = g.CPUCores / math.Max(coverage, 1) / capacity
		if m.Calm != nil {
			g.CalmUtilisation = stretchUtilisation(pods, *m.Calm, capacity)
		}
		g.Replicas = max(1, int(math.Round(coverage)))
		if st := replicaSteps(pods, steps, m.Step); st != nil {
			g.ReplicaSteps, g.Replicas = st, st[0].Replicas
		}
		g.Rates = meanRates(pods, steps)
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
func (g *Group) windowAverages(pods []*PodMeasurement, steps int) {
	if steps == 0 {
		return
	}
	cpu, rate := 0.0, 0.0
	for _, p := range pods {
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
func stretchUtilisation(members []*PodMeasurement, st Stretch, capacity float64) float64 {
	sum, n := 0.0, 0
	for k := st.From; k < st.To; k++ {
		cpu, pods := 0.0, 0
		for _, p := range members {
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

// members are the group's pods' measurements.
func (g *Group) members(m *Measurements) []*PodMeasurement {
	out := make([]*PodMeasurement, len(g.Pods))
	for i, name := range g.Pods {
		out[i] = podByName(m, name)
	}
	return out
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
func meanRates(pods []*PodMeasurement, steps int) []float64 {
	out := make([]float64, steps)
	for k := range out {
		sum, n := 0.0, 0
		for _, p := range pods {
			if k < len(p.Rates) && !math.IsNaN(p.Rates[k]) {
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
