package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/whatif"
)

// whatIfOptions are simulate's --from-tsdb flags: a scenario fitted to a Service's own metrics.
type whatIfOptions struct {
	tsdb          *metricsSourceFlags
	service       string
	window        time.Duration
	at            string
	kubeconfig    string
	writeScenario string

	namespace, name string
	end             time.Time
	cfg             metrics.Config
}

func (w *whatIfOptions) addFlags(f *pflag.FlagSet) {
	// The TSDB flags are run's (--tsdb-*); --from-tsdb is --tsdb-url under the name that says
	// what simulate does with it.
	w.tsdb = addMetricsSourceFlags(f, "tsdb-", "(the same as --from-tsdb)")
	_ = f.MarkHidden("tsdb-url")
	f.StringVar(&w.tsdb.url, "from-tsdb", "", "fit the scenario to a Service's own metrics in this Prometheus-compatible TSDB (needs --service; the --tsdb-* flags set auth, TLS, tenant and queries)")
	f.StringVar(&w.service, "service", "", "with --from-tsdb: the Service, as NAMESPACE/NAME")
	f.DurationVar(&w.window, "window", time.Hour, "with --from-tsdb: how much of the Service's recent history to fit and predict on")
	f.StringVar(&w.at, "at", "", "with --from-tsdb: RFC 3339 end of the window (default: now)")
	f.StringVar(&w.kubeconfig, "kubeconfig", "", "with --from-tsdb: read the pods' CPU limits, their nodes and the DestinationRule from this cluster (default: kube-state-metrics series in the TSDB)")
	f.StringVar(&w.writeScenario, "write-scenario", "", "with --from-tsdb: write the fitted scenario, with a comment per field saying where it came from, to this file")
}

// enabled reports whether the command fits a scenario to a TSDB.
func (w *whatIfOptions) enabled() bool { return w.tsdb.url != "" }

// complete checks the what-if flags against the others; now is the wall clock.
func (w *whatIfOptions) complete(cmd *cobra.Command, now time.Time) error {
	fl := cmd.Flags()
	if !w.enabled() {
		for _, name := range []string{"service", "window", "at", "kubeconfig", "write-scenario"} {
			if fl.Changed(name) {
				return newUsageError("--%s needs --from-tsdb URL", name)
			}
		}
		return nil
	}
	for _, name := range []string{"scenario", "duration", "warmup", "export-metrics"} {
		if fl.Changed(name) {
			return newUsageError("--%s cannot be combined with --from-tsdb: the scenario, its duration and its warm-up come from the Service's metrics (write them with --write-scenario, edit, and run with --scenario)", name)
		}
	}
	ns, name, ok := strings.Cut(w.service, "/")
	if w.service == "" || !ok {
		return newUsageError("--service %q: want NAMESPACE/NAME, e.g. shop/web", w.service)
	}
	for what, v := range map[string]string{"namespace": ns, "name": name} {
		if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
			return newUsageError("--service %q: the %s %q is not a Kubernetes name: %s", w.service, what, v, errs[0])
		}
	}
	w.namespace, w.name = ns, name
	if w.window < 2*whatif.MinData {
		return newUsageError("--window %v must be at least %v", w.window, 2*whatif.MinData)
	}
	w.end = now
	if w.at != "" {
		at, err := time.Parse(time.RFC3339, w.at)
		if err != nil {
			return newUsageError("--at %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", w.at)
		}
		w.end = at
	}
	w.tsdb.latencyHistogram = true
	cfg, err := w.tsdb.config()
	w.cfg = cfg
	return err
}

// whatIfReport is the what_if part of the --json document. Field names are a public format.
type whatIfReport struct {
	Namespace   string           `json:"namespace"`
	Service     string           `json:"service"`
	From        time.Time        `json:"from"`
	To          time.Time        `json:"to"`
	Current     string           `json:"current_policy"`
	Check       []checkReportRow `json:"check"`
	Cost        costReport       `json:"request_cost"`
	Assumptions []string         `json:"assumptions"`
	Advice      string           `json:"advice"`
}

// costReport is the request-cost family chosen and every candidate's fit.
type costReport struct {
	Chosen     string             `json:"chosen"`
	From       string             `json:"from"`
	Candidates []costCandidateRow `json:"candidates,omitempty"`
}

type costCandidateRow struct {
	Family string `json:"family"`
	Fitted string `json:"fitted"`
	// LogLikelihood and Score are absent for a family whose calibration could not be simulated.
	LogLikelihood *float64 `json:"log_likelihood,omitempty"`
	Score         *float64 `json:"score,omitempty"`
}

// finite is v, or nil when JSON cannot hold it.
func finite(v float64) *float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return nil
	}
	return &v
}

func newCostReport(f whatif.CostFit) costReport {
	r := costReport{Chosen: f.Shape.String(), From: f.From}
	for _, c := range f.Candidates {
		r.Candidates = append(r.Candidates, costCandidateRow{Family: c.Shape.Family, Fitted: c.Shape.String(), LogLikelihood: finite(c.LogLikelihood), Score: finite(c.Score)})
	}
	return r
}

// checkReportRow is one row of the model check in the --json document; CPU is absent for the
// Service's client-side row.
type checkReportRow struct {
	Name           string   `json:"name"`
	MeasuredP99MS  float64  `json:"measured_p99_ms"`
	SimulatedP99MS float64  `json:"simulated_p99_ms"`
	MeasuredCPU    *float64 `json:"measured_cpu,omitempty"`
	SimulatedCPU   *float64 `json:"simulated_cpu,omitempty"`
}

func checkReport(c *whatif.Check) []checkReportRow {
	var out []checkReportRow
	for _, r := range append(c.Groups, c.Service) {
		row := checkReportRow{Name: r.Name, MeasuredP99MS: r.MeasuredP99, SimulatedP99MS: r.SimulatedP99}
		if !math.IsNaN(r.MeasuredCPU) {
			row.MeasuredCPU, row.SimulatedCPU = &r.MeasuredCPU, &r.SimulatedCPU
		}
		out = append(out, row)
	}
	return out
}

// runWhatIf reads the Service, fits, checks and predicts, printing each step as it goes.
func (o *simulateOptions) runWhatIf(ctx context.Context, stdout, stderr io.Writer) error {
	w := &o.whatIf
	if ctx == nil {
		ctx = context.Background()
	}
	api, err := metrics.NewAPI(w.cfg)
	if err != nil {
		return usageError{err: err}
	}
	src, err := metrics.New(w.cfg, nil)
	if err != nil {
		return usageError{err: err}
	}
	address := w.cfg.URL + w.cfg.PathPrefix
	var facts *whatif.ClusterFacts
	if w.kubeconfig != "" {
		facts, err = readClusterFacts(ctx, w.kubeconfig, w.namespace, w.name)
		if errors.Is(err, errServiceNotFound) || errors.Is(err, errUnsupportedBalancer) {
			return err
		}
		if err != nil {
			fmt.Fprintf(stderr, "Cannot read the cluster (%v): CPU limits, nodes and the balancer come from kube-state-metrics series or are assumed, as listed below.\n", err)
			facts = nil
		}
	}
	reader := &whatif.Reader{API: api, Source: src, Labels: w.cfg.Labels, Timeout: w.cfg.QueryTimeout(), Address: address, CPUQuery: w.cfg.Queries.CPU}
	m, err := reader.Read(ctx, whatif.Window{Namespace: w.namespace, Service: w.name, End: w.end, Length: w.window, Cluster: facts})
	if err != nil {
		return err
	}
	if facts != nil {
		m.ApplyCluster(*facts)
	}
	opts := whatif.Options{}
	if o.SeedSet {
		opts.Seed = o.Seed
	}
	md, err := whatif.Fit(m, opts)
	if err != nil {
		return err
	}
	// The scenario is written before the check, so that a model that fails it can be corrected.
	if w.writeScenario != "" {
		if err := os.WriteFile(w.writeScenario, md.YAML, 0o644); err != nil {
			return fmt.Errorf("write --write-scenario file: %w", err)
		}
	}
	printMeasured(stdout, address, m, md)
	if w.writeScenario != "" {
		fmt.Fprintf(stdout, "Scenario written to %s: edit it and run it with --scenario %s.\n\n", w.writeScenario, w.writeScenario)
	}
	check, err := md.Check()
	if err != nil {
		return err
	}
	printCheck(stdout, check)
	if err := check.Err(); err != nil {
		return err
	}
	policies := o.Policies
	if !o.PoliciesSet {
		policies = whatif.PredictedPolicies
	}
	pred, err := md.Predict(check, policies)
	if err != nil {
		return err
	}
	report := &whatIfReport{Namespace: md.Namespace, Service: md.Service, From: md.From, To: md.To, Current: md.Current.Name,
		Check: checkReport(check), Cost: newCostReport(md.Cost), Assumptions: md.Assumptions, Advice: pred.Advice.Text}
	if err := o.writeFiles(md.Scenario, pred.Results, report); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Prediction on the window's load (simulated time %v is %s; the first %v are warm-up):\n\n", md.Warmup, md.From.UTC().Format(time.RFC3339), md.Warmup)
	if err := printResults(stdout, md.Scenario, pred.Results); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nAdvice. %s\n", pred.Advice.Text)
	if a := pred.Advice.Algorithm; a != "" {
		fmt.Fprintf(stdout, `
apiVersion: adaptivelb.io/v1alpha1
kind: AdaptiveLoadBalancer
metadata: {name: %s, namespace: %s}
spec:
  targetRef: {name: %s}
  mode: DryRun        # compare the weights it publishes with this prediction, then set Active
  algorithm: %s
  interval: %v
`, md.Service, md.Namespace, md.Service, a, md.Scenario.Controller.Interval.Duration)
	}
	return nil
}

func printMeasured(w io.Writer, address string, m *whatif.Measurements, md *whatif.Model) {
	pods := 0
	for _, g := range md.Groups {
		pods += len(g.Pods)
	}
	fmt.Fprintf(w, "What-if for Service %s/%s, from %s to %s (%v, in %v steps), read from %s\n\n",
		md.Namespace, md.Service, md.From.UTC().Format(time.RFC3339), md.To.UTC().Format(time.RFC3339), md.To.Sub(md.From), md.Step, address)
	avg, peak := loadStats(m.Load)
	fmt.Fprintf(w, "Measured: %d pods in %d groups, called by %d client proxies; %.1f rps on average (%.1f in the busiest step); client-side p99 %.1f ms\n",
		pods, len(md.Groups), m.Clients.Proxies, avg, peak, md.ServiceP99)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tpods\tCPU limit\tnode CPUs\tinstance types\tcost/request\tspeed\trps\tCPU cores\tCPU used\tserver p99 ms\t")
	for _, g := range md.Groups {
		limit := "none"
		if g.HasCPULimit {
			limit = fmt.Sprintf("%g", g.CPULimit)
		}
		types := strings.Join(g.InstanceTypes, ",")
		if types == "" {
			types = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%g\t%s\t%v\t%.3f\t%.1f\t%.2f\t%.0f%%\t%.1f\t\n", g.Name, len(g.Pods), limit, g.Cores, types,
			time.Duration(g.CostSeconds*float64(time.Second)).Round(time.Microsecond), g.Speed, g.RequestRate, g.CPUCores, 100*g.Utilisation, g.P99)
	}
	_ = tw.Flush()
	for _, g := range md.Groups {
		if len(g.ReplicaSteps) > 0 {
			fmt.Fprintf(w, "Group %s's pods serving changed in number during the window: %s.\n", g.Name, whatif.ReplicaStepsText(g.ReplicaSteps))
		}
		if len(g.SpeedSteps) > 0 {
			fmt.Fprintf(w, "Group %s's speed changed during the window (its CPU per request, stretch by stretch): %s.\n", g.Name, whatif.SpeedStepsText(g.SpeedSteps))
		}
	}
	fmt.Fprintf(w, "Request costs: %s, %s.\n", md.Cost.Shape, md.Cost.From)
	if len(md.Cost.Candidates) > 0 {
		fmt.Fprintln(w, "How each family fitted (log-likelihood of the measured buckets under the simulated pods; the score takes ½·ln(requests) off per parameter, and the highest wins):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range md.Cost.Candidates {
			chosen := ""
			if c.Shape == md.Cost.Shape {
				chosen = "  chosen"
			}
			fmt.Fprintf(tw, "  %s\tlog-likelihood %.0f\tscore %.0f%s\n", c.Shape, c.LogLikelihood, c.Score, chosen)
		}
		_ = tw.Flush()
	}
	if len(md.Assumptions) > 0 {
		fmt.Fprintln(w, "Assumed (not measured, not read from the cluster):")
		for _, a := range md.Assumptions {
			fmt.Fprintf(w, "  - %s\n", a)
		}
	}
	if len(md.Notes) > 0 {
		fmt.Fprintln(w, "Notes:")
		for _, n := range md.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	fmt.Fprintln(w)
}

func printCheck(w io.Writer, c *whatif.Check) {
	fmt.Fprintf(w, "Model check: the policy in force (%s), simulated on the window's load, against what was measured\n", c.Policy.Name)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tp99 ms measured\tsimulated\terror\tCPU cores measured\tsimulated\terror\t")
	for _, r := range append(c.Groups, c.Service) {
		cpu := "-\t-\t-"
		if !math.IsNaN(r.MeasuredCPU) {
			cpu = fmt.Sprintf("%.2f\t%.2f\t%+.1f%%", r.MeasuredCPU, r.SimulatedCPU, 100*r.CPUError())
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%+.1f%%\t%s\t\n", r.Name, r.MeasuredP99, r.SimulatedP99, 100*r.P99Error(), cpu)
	}
	_ = tw.Flush()
	if len(c.Disagreements) == 0 {
		fmt.Fprintln(w, "The model reproduces the measurements: every p99 within its sampling range widened by 25%, every group's CPU within 10%.")
	} else {
		fmt.Fprintf(w, "The model does NOT reproduce the measurements, so no gain is predicted:\n")
		for _, d := range c.Disagreements {
			fmt.Fprintf(w, "  - %s\n", d)
		}
		fmt.Fprintln(w, "Suspected, most likely first:")
		for _, s := range c.Suspects {
			fmt.Fprintf(w, "  - %s\n", s)
		}
	}
	fmt.Fprintln(w)
}

func loadStats(load []float64) (avg, peak float64) {
	n := 0
	for _, v := range load {
		if math.IsNaN(v) {
			continue
		}
		avg += v
		peak = math.Max(peak, v)
		n++
	}
	if n > 0 {
		avg /= float64(n)
	}
	return avg, peak
}
