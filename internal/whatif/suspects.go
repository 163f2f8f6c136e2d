package whatif

import (
	"fmt"
	"math"
	"sort"
)

// When the model check fails, the disagreements point at the assumption most likely wrong: which
// figures disagree, in which direction and at what load tells a cost distribution from a
// concurrency, a client balancer or a speed that changed. Each suspect says what the user can
// measure or set to fix it.

// suspects names the assumptions the check's disagreements point at, most likely first.
func (md *Model) suspects(c *Check) []string {
	var out []string
	groupDisagrees := false
	for i, row := range c.Groups {
		g := &md.Groups[i]
		switch {
		case (row.cpuDisagrees() || row.p99Disagrees()) && math.Abs(row.rateError()) > splitTolerance:
			groupDisagrees = true
			out = append(out, md.suspectSplit(g, row))
		case row.cpuDisagrees():
			groupDisagrees = true
			out = append(out, md.suspectCPU(g, row))
		case row.p99Disagrees() && g.Utilisation >= saturated && row.SimulatedP99 < row.MeasuredP99:
			// A saturated group serves what its CPU allows whatever it is sent, so its rate
			// cannot show the split: a queue longer than simulated says more was sent to it.
			groupDisagrees = true
			out = append(out, md.suspectSplit(g, row), md.suspectP99(g, row))
		case row.p99Disagrees():
			groupDisagrees = true
			out = append(out, md.suspectP99(g, row))
		}
	}
	if c.Service.p99Disagrees() && !groupDisagrees {
		out = append(out, md.suspectClients(c.Service))
	}
	if jumps := md.loadJumps(); jumps >= minLoadJumps && simulatedLow(c) {
		// Bursts shorter than a step are spread over it: the simulated queues are shorter than
		// the real ones, whatever else is right. Jumps between steps are in the model, so they
		// are only a hint of jumps within steps: after the suspects the figures point at.
		out = append(out, fmt.Sprintf("the load's resolution: the Service's rate jumps by more than %.0f%% of its mean between %d pairs of %v steps, so it probably changes within steps too (bursts), and the model spreads each burst over its step, which queues less. Scrape the sidecars more often and fit with a shorter step, or add the bursts to the written scenario's load phases",
			100*loadJump, jumps, md.Step))
	}
	return dedupe(out)
}

// loadJump is the change between two steps' rates, over the window's mean rate, that counts as
// a jump; minLoadJumps jumps make a load bursty.
const (
	loadJump     = 0.3
	minLoadJumps = 2
)

// loadJumps counts the steps whose rate differs from the step before by more than loadJump of
// the mean and by more than four standard deviations of the difference of two Poisson counts
// (a quiet Service's rates jump by chance).
func (md *Model) loadJumps() int {
	rates := md.loadSeries()
	mean := meanOf(rates)
	step := md.Step.Seconds()
	n := 0
	for k := 1; k < len(rates); k++ {
		noise := 4 * math.Sqrt((rates[k]+rates[k-1])/math.Max(step, 1))
		if d := math.Abs(rates[k] - rates[k-1]); d > loadJump*mean && d > noise {
			n++
		}
	}
	return n
}

// simulatedLow says whether some disagreeing p99 was simulated below the measured one.
func simulatedLow(c *Check) bool {
	for _, r := range append(c.Groups, c.Service) {
		if r.p99Disagrees() && r.SimulatedP99 < r.MeasuredP99 {
			return true
		}
	}
	return false
}

// splitTolerance is how far a group's simulated request rate may be from the measured one before
// the split of requests between the groups is suspected.
const splitTolerance = 0.10

// saturated is the utilisation at which a group serves what its CPU allows, whatever it is sent.
const saturated = 0.9

// suspectSplit: the simulated clients send the group another share of the requests than the
// real ones did, so the balancer or the weights in force are not what the model assumes.
func (md *Model) suspectSplit(g *Group, row CheckRow) string {
	balancer := fmt.Sprintf("the clients' balancer, %s,", md.Scenario.Clients.LB)
	fix := "pass --kubeconfig so the DestinationRule's balancer is read (LEAST_REQUEST is assumed)"
	if md.balancerFrom == FromCluster {
		fix = "check the DestinationRule read from the cluster and any per-client override (a sidecar's own DestinationRule, a subset)"
	}
	if md.Current.Name == PolicyCurrentWeights {
		balancer = "the weights in force (each group's median weight at the window's end, held fixed)"
		fix = "fit a window in which the weights held still (adaptivelb_endpoint_weight), or set the clients' weights in the written scenario"
	}
	sent := fmt.Sprintf("the model sends group %s %.1f rps where it served %.1f (%+.0f%%)", g.Name, row.SimulatedRate, row.MeasuredRate, 100*row.rateError())
	if math.Abs(row.rateError()) <= splitTolerance {
		sent = fmt.Sprintf("group %s ran at %.0f%% of its CPU and queued far longer than simulated (p99 %s against %s), as when it is sent more than it can serve", g.Name, 100*g.Utilisation, ms(row.MeasuredP99), ms(row.SimulatedP99))
	}
	return fmt.Sprintf("the split of requests between groups: %s, so %s is not what the real clients did: %s. Also check the clients' worker threads (clients.workers, %d assumed)",
		sent, balancer, fix, md.Scenario.Clients.Workers)
}

// suspectCPU: the simulated CPU differs, so the work per request or the pods serving it do.
func (md *Model) suspectCPU(g *Group, row CheckRow) string {
	if len(g.SpeedSteps) > 0 {
		return fmt.Sprintf("group %s's speed changed during the window (%s) faster than the fit's stretches of %d requests resolve: measure its CPU per request (rate(container_cpu_usage_seconds_total) over rate(istio_requests_total), per pod) at a finer step, or fit a window in which its speed holds, and correct the events of the written scenario",
			g.Name, SpeedStepsText(g.SpeedSteps), minBlockRequests)
	}
	if len(g.ReplicaSteps) > 0 {
		return fmt.Sprintf("group %s's pods came and went during the window (%s): a pod that joins mid-step counts from its step on, and a new pod starts cold. Fit a window without the scaling, or correct the replicas events of the written scenario",
			g.Name, ReplicaStepsText(g.ReplicaSteps))
	}
	if g.MeanPods < float64(len(g.Pods))-0.5 {
		return fmt.Sprintf("group %s's pods did not all serve the whole window (%.1f on average of %d): the scenario holds %d throughout. Fit a window without the rollout or scaling, or set the group's replicas events in the written scenario",
			g.Name, g.MeanPods, len(g.Pods), g.Replicas)
	}
	return fmt.Sprintf("group %s's CPU per request (%s) does not hold over the window (simulated CPU %+.0f%%): its CPU series may count other containers than the application's, or its speed changed within the steps. Check the CPU query (--tsdb-query-cpu; the default excludes istio-proxy and the pause container) and the pods' CPU per request over time",
		g.Name, seconds(g.CostSeconds), 100*row.CPUError())
}

// suspectP99: the CPU agrees but the latency does not.
func (md *Model) suspectP99(g *Group, row CheckRow) string {
	runnerUp := ""
	if len(md.Cost.Candidates) > 1 {
		cands := append([]CostCandidate(nil), md.Cost.Candidates...)
		sort.Slice(cands, func(i, j int) bool { return cands[i].Score > cands[j].Score })
		runnerUp = fmt.Sprintf(" (the next best family, %s, scored %.0f below it)", cands[1].Shape, cands[0].Score-cands[1].Score)
	}
	low := g.Utilisation < lowUtilisation
	switch {
	case md.Cost.Assumed:
		return fmt.Sprintf("the request-cost distribution, assumed (%s) for want of a histogram with %d requests: measure over a longer window, or set the pods' cost in the written scenario", md.Cost.Shape, minCalibrationRequests)
	case low:
		return fmt.Sprintf("the request-cost distribution: %s%s does not reproduce group %s's latency at %.0f%% of its CPU, where latency is mostly service time. Istio's buckets may be too coarse around its p99 to tell families apart: add buckets there (the sidecar.istio.io/statsHistogramBuckets annotation), or measure the application's own latency histogram and set the cost (dist, cv, or a mixture's parts) in the written scenario",
			md.Cost.Shape, runnerUp, g.Name, 100*g.Utilisation)
	case row.SimulatedP99 < row.MeasuredP99:
		return fmt.Sprintf("the pods' concurrency: group %s, at %.0f%% of its CPU, queues more than the model's %d requests in service at once (one per node CPU) allow. Set workers in the written scenario to what the application really serves at once (its thread or connection pool), or check its latency for a slow dependency, which the CPU does not show",
			g.Name, 100*g.Utilisation, workersFor(g.Cores))
	default:
		return fmt.Sprintf("the client balancer or the pods' concurrency: group %s, at %.0f%% of its CPU, queues less than simulated. Pass --kubeconfig so the DestinationRule's balancer is read (LEAST_REQUEST is assumed), and set workers in the written scenario if the application serves fewer requests at once than its node has CPUs",
			g.Name, 100*g.Utilisation)
	}
}

// suspectClients: every group agrees, but the Service's client-side p99 does not.
func (md *Model) suspectClients(row CheckRow) string {
	direction := "higher"
	if row.SimulatedP99 < row.MeasuredP99 {
		direction = "lower"
	}
	return fmt.Sprintf("the clients: every group's latency agrees but the client side is simulated %s (%+.0f%%). Suspects: the network latency (measured as a difference of means, %s), the sidecars' worker threads (%d assumed: set clients.workers to the mesh's proxy concurrency) and the balancer (pass --kubeconfig to read the DestinationRule). Compare istio_request_duration_milliseconds at reporter=\"source\" and \"destination\" for the same requests",
		direction, 100*row.P99Error(), seconds(md.Scenario.Clients.NetworkLatency.Seconds()), md.Scenario.Clients.Workers)
}

func dedupe(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
