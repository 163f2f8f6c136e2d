package whatif

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Operator defaults the scenario's controller takes (api/v1alpha1 and the simulator's).
const (
	controllerInterval   = 30 * time.Second
	controllerApplyDelay = time.Second
)

// renderYAML writes the model as a scenario file, in the ordinary format, with a comment per field
// saying where its value came from. It also completes md.Assumptions.
func (md *Model) renderYAML(m *Measurements, seed int64) ([]byte, error) {
	y := &yamlWriter{}
	window := md.To.Sub(md.From)
	y.comment("Scenario fitted by `adaptive-lb simulate --from-tsdb` to Service %s/%s,", md.Namespace, md.Service)
	y.comment("measured from %s to %s (%v, in steps of %v).", stamp(md.From), stamp(md.To), window, md.Step)
	y.comment("Each value says where it came from: measured (the Service's own series in the TSDB),")
	y.comment("cluster (the Kubernetes API), kube-state-metrics (its series in the TSDB), or assumed.")
	y.comment("Simulated time %v is %s.", md.Warmup, stamp(md.From))
	y.field(0, "name", sanitizeName(md.Namespace+"-"+md.Service), "")
	y.field(0, "duration", seconds(md.Warmup.Seconds()+window.Seconds()), "the warm-up plus the window")
	y.field(0, "warmup", seconds(md.Warmup.Seconds()), "simulated before the window at its first rate, so controllers start settled; not counted")
	y.field(0, "seed", fmt.Sprint(seed), "")

	load := fillGaps(m.Load, 0)
	y.key(0, "load")
	y.field(1, "rps", rps(load[0]), fmt.Sprintf("measured: the Service's request rate in the window's first %v (istio_requests_total, reporter=\"destination\")", md.Step))
	y.field(1, "arrival", "poisson", "assumed: arrivals are not in the metrics; independent arrivals")
	md.assume("requests arrive independently (Poisson); the metrics hold rates, not arrival times")
	if len(load) > 1 {
		y.keyComment(1, "phases", fmt.Sprintf("measured: the Service's request rate in each %v of the window", md.Step))
		for k := 1; k < len(load); k++ {
			y.line(2, fmt.Sprintf("- {at: %s, rps: %s}", seconds(md.Warmup.Seconds()+float64(k)*md.Step.Seconds()), rps(load[k])), "")
		}
	}
	if gaps := countNaN(m.Load); gaps > 0 {
		md.Notes = append(md.Notes, fmt.Sprintf("%d step(s) of the window had no request rate; each keeps the rate of the step before", gaps))
	}

	y.key(0, "clients")
	y.field(1, "proxies", fmt.Sprint(m.Clients.Proxies), "measured: client pods whose sidecars reported requests to the Service (reporter=\"source\")")
	y.field(1, "workers", fmt.Sprint(assumedClientWorkers), "assumed: Istio's default sidecar concurrency")
	md.assume(fmt.Sprintf("each client sidecar runs %d worker threads (Istio's default concurrency)", assumedClientWorkers))
	lbNote := "assumed: Istio's default balancer (no DestinationRule was read)"
	if m.Clients.LBOrigin == FromCluster {
		lbNote = "cluster: " + m.Clients.LBSource
	} else {
		md.assume("the client sidecars balance with LEAST_REQUEST, Istio's default (pass --kubeconfig to read the DestinationRule)")
	}
	y.field(1, "lb", m.Clients.LB, lbNote)
	clientMean, serverMean := mean(m.Clients.Latency), mean(m.ServerLatency)
	network := 0.0
	networkNote := "assumed: no latency sums to measure it from"
	if !math.IsNaN(clientMean) && !math.IsNaN(serverMean) {
		network = math.Max(0, math.Round((clientMean-serverMean)*10)/10)
		networkNote = fmt.Sprintf("measured: client-side mean latency (%.1f ms) minus server-side mean (%.1f ms)", clientMean, serverMean)
	} else {
		md.assume("no network latency (the latency histograms lack their _sum series)")
	}
	y.field(1, "network_latency", seconds(network/1000), networkNote)

	y.key(0, "controller")
	y.field(1, "interval", seconds(controllerInterval.Seconds()), "the operator's default (spec.interval)")
	y.field(1, "window", seconds(2*controllerInterval.Seconds()), "the operator's default: twice the interval")
	y.field(1, "apply_delay", seconds(controllerApplyDelay.Seconds()), "assumed: a weight write reaches the clients 1 s later (istiod's push)")
	md.assume("a weight write reaches the client sidecars 1 s after it is made")

	y.key(0, "pods")
	workersAssumed := false
	for _, g := range md.Groups {
		types := ""
		if len(g.InstanceTypes) > 0 {
			types = ", instance type " + strings.Join(g.InstanceTypes, "/")
		}
		y.comment("  %s: %s%s; measured %.1f rps and %.2f cores in all, %.0f%% of its CPU, server-side p99 %s",
			g.Name, listNames(slices.Sorted(slices.Values(g.Pods))), types, g.RequestRate, g.CPUCores, 100*g.Utilisation, ms(g.P99))
		y.line(1, "- name: "+g.Name, "")
		in := 2
		if len(g.ReplicaSteps) > 0 {
			y.field(in, "replicas", fmt.Sprint(g.Replicas), fmt.Sprintf("measured: pods serving in the window's first step (%.2f on average over the window)", g.MeanPods))
		} else {
			y.field(in, "replicas", fmt.Sprint(g.Replicas), fmt.Sprintf("measured: pods in service over the window (%.2f on average)", g.MeanPods))
		}
		y.field(in, "workers", fmt.Sprint(workersFor(g.Cores)), "assumed: one request in service per node CPU")
		workersAssumed = true
		y.field(in, "cores", num(g.Cores), originNote(g.coresOrigin, "the node's CPU count", "kube_node_status_capacity"))
		limitNote := originNote(g.limitOrigin, "the pods' CPU limit", "kube_pod_container_resource_limits")
		if !g.HasCPULimit {
			limitNote = "cluster: the pods have no CPU limit"
		}
		y.field(in, "cpu_limit", num(g.CPULimit), limitNote)
		if len(g.SpeedSteps) > 0 {
			y.field(in, "speed", num(g.SpeedSteps[0].Speed), fmt.Sprintf("measured: the cheapest group's cost per request (%s) over this group's in the window's first steps; it changed during the window (%s on average)", seconds(md.Groups[0].CostSeconds), num(g.Speed)))
		} else {
			y.field(in, "speed", num(g.Speed), fmt.Sprintf("measured: the cheapest group's cost per request (%s) over this group's (%s)", seconds(md.Groups[0].CostSeconds), seconds(g.CostSeconds)))
		}
		shapeNote := "measured: " + md.Cost.From
		if md.Cost.Assumed {
			shapeNote = "assumed: no histogram to fit the family to"
		}
		y.comment("    cost: the cheapest group's CPU-seconds per request (cAdvisor CPU over Istio requests), measured;")
		y.comment("    its distribution %s, %s", md.Cost.Shape, shapeNote)
		y.field(in, "cost", costYAML(md.Cost.Shape.Cost(secondsDuration(md.Groups[0].CostSeconds))), "")
		if len(g.SpeedSteps) > 1 || len(g.ReplicaSteps) > 1 {
			y.keyComment(in, "events", "measured: the pods serving in each step, and the group's CPU per request in each stretch")
			type event struct {
				at   time.Duration
				text string
			}
			var events []event
			for _, st := range g.ReplicaSteps[min(1, len(g.ReplicaSteps)):] {
				events = append(events, event{st.At, fmt.Sprintf("replicas: %d", st.Replicas)})
			}
			for _, st := range g.SpeedSteps[min(1, len(g.SpeedSteps)):] {
				events = append(events, event{st.At, "speed: " + num(st.Speed)})
			}
			slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
			for _, ev := range events {
				y.line(in+1, fmt.Sprintf("- {at: %s, %s}", seconds(md.Warmup.Seconds()+ev.at.Seconds()), ev.text), "")
			}
		}
	}
	if workersAssumed {
		md.assume("a pod serves as many requests at once as its node has CPUs, and queues the rest")
	}
	md.assume("one request-cost distribution for the whole Service (hardware divides every request's cost by its speed)")
	for _, g := range md.Groups {
		if len(g.ReplicaSteps) == 0 && g.MeanPods < float64(len(g.Pods))-0.1 {
			md.Notes = append(md.Notes, "pods joined or left during the window without changing how many served at once (a rolling restart): each group holds its average number of pods throughout")
			break
		}
	}
	return []byte(y.b.String()), nil
}

func (md *Model) assume(s string) { md.Assumptions = append(md.Assumptions, s) }

// originNote says where a fact came from, naming the kube-state-metrics series it was read from.
func originNote(o Origin, what, series string) string {
	switch o {
	case FromCluster:
		return "cluster: " + what
	case FromKubeStateMetrics:
		return "kube-state-metrics: " + what + " (" + series + ")"
	case Assumed:
		return fmt.Sprintf("assumed: %d× the CPU limit (the node is unknown)", assumedNodeCoresPerLimit)
	}
	return string(o)
}

func countNaN(xs []float64) int {
	n := 0
	for _, x := range xs {
		if math.IsNaN(x) {
			n++
		}
	}
	return n
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", v)
}

// sanitizeName makes a scenario name of a namespace and Service name.
func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}

// yamlWriter writes YAML lines with their comments aligned.
type yamlWriter struct{ b strings.Builder }

const commentColumn = 28

func (y *yamlWriter) comment(format string, args ...any) {
	fmt.Fprintf(&y.b, "# %s\n", fmt.Sprintf(format, args...))
}

func (y *yamlWriter) line(indent int, text, comment string) {
	s := strings.Repeat("  ", indent) + text
	if comment != "" {
		if pad := commentColumn - len(s); pad > 0 {
			s += strings.Repeat(" ", pad)
		}
		s += "  # " + comment
	}
	y.b.WriteString(s + "\n")
}

func (y *yamlWriter) field(indent int, key, value, comment string) {
	y.line(indent, key+": "+value, comment)
}

func (y *yamlWriter) key(indent int, key string) { y.line(indent, key+":", "") }

func (y *yamlWriter) keyComment(indent int, key, comment string) { y.line(indent, key+":", comment) }
