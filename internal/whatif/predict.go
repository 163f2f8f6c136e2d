package whatif

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// PredictedPolicies are the policies a prediction compares with the one in force: Envoy's
// least_request alone, adaptive-lb's capacity and tail (the default) algorithms, and cpu-share,
// the published operator's rule.
var PredictedPolicies = []string{sim.PolicyLeastRequest, sim.PolicyCapacity, sim.PolicyTail, sim.PolicyCPUShare}

// Prediction is every policy simulated on the window's load, and the advice drawn from it.
type Prediction struct {
	// Results holds the policy in force first, then the others, in the order asked.
	Results []*sim.Result
	Advice  Advice
}

// Advice is what the prediction means for the Service.
type Advice struct {
	// Algorithm is the one to use ("" when adaptive-lb would not help).
	Algorithm string
	// P99Before and After are the Service's client-side p99 (ms) under the policy in force and
	// under Algorithm; CPUBefore and After the pods' CPU (cores).
	P99Before, P99After float64
	CPUBefore, CPUAfter float64
	// Peaks: over the window's busiest 10-second spans, the worst p99 under each.
	PeakRPS                     float64
	PeakP99Before, PeakP99After float64
	// WorseSpans counts the 10-second spans of the window where Algorithm's p99 was more than
	// 10% above the policy in force's; WorstAt is the worst of them (zero when none).
	WorseSpans              int
	WorstAt                 time.Time
	WorstBefore, WorstAfter float64
	// CheckP99Error and CheckCPUError are the model check's largest relative errors, on a p99
	// and on a group's CPU: how far the prediction's model was from today's measurements.
	CheckP99Error, CheckCPUError float64
	// Text is the advice as a paragraph.
	Text string
}

// Predict simulates the policies on the fitted scenario. The check's run of the policy in force
// is reused (the same scenario and seed give the same run). It refuses when the check disagrees.
func (md *Model) Predict(check *Check, policies []string) (*Prediction, error) {
	if err := check.Err(); err != nil {
		return nil, err
	}
	var todo []string
	for _, p := range policies {
		if p != md.Current.Name {
			todo = append(todo, p)
		}
	}
	results := make([]*sim.Result, len(todo))
	errs := make([]error, len(todo))
	parallel(len(todo), func(i int) { results[i], _, errs[i] = md.runPolicy(Policy{Name: todo[i]}) })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	pr := &Prediction{Results: append([]*sim.Result{check.Result}, results...)}
	pr.Advice = md.advise(pr.Results)
	pr.Advice.CheckP99Error, pr.Advice.CheckCPUError = check.largestErrors()
	pr.Advice.Text += fmt.Sprintf(" The model, run under today's policy, reproduced the measured p99s within %.1f%% and the groups' CPU within %.1f%% (the check above).",
		100*pr.Advice.CheckP99Error, 100*pr.Advice.CheckCPUError)
	return pr, nil
}

// worseBy is how much higher a 10-second p99 must be to count as worse in the risk statement.
const worseBy = 1.10

// peakShare is the share of the window's 10-second spans, by load, that count as its peaks.
const peakShare = 0.10

// gainWorthIt is the least p99 improvement the advice recommends an algorithm for.
const gainWorthIt = 0.05

func (md *Model) advise(results []*sim.Result) Advice {
	before := results[0]
	byName := map[string]*sim.Result{}
	for _, r := range results {
		byName[r.Policy] = r
	}
	// tail is the default; capacity is offered when it does clearly better on this Service.
	pick := byName[sim.PolicyTail]
	if c := byName[sim.PolicyCapacity]; c != nil && (pick == nil || c.Latency.P99 < pick.Latency.P99*(1-gainWorthIt)) {
		pick = c
	}
	a := Advice{P99Before: before.Latency.P99, CPUBefore: before.TotalCPU}
	window := md.To.Sub(md.From)
	load := fmt.Sprintf("On the window's own load (%s to %s, %.0f rps on average, %.0f at its busiest step)",
		stamp(md.From), stamp(md.To), meanOf(md.loadSeries()), maxOf(md.loadSeries()))
	if pick == nil {
		a.Text = load + ", no adaptive-lb algorithm was simulated; add tail or capacity to the policies."
		return a
	}
	a.P99After, a.CPUAfter = pick.Latency.P99, pick.TotalCPU
	md.risk(&a, before, pick)
	gain := 1 - a.P99After/a.P99Before
	var b strings.Builder
	if gain < gainWorthIt {
		fmt.Fprintf(&b, "%s, adaptive-lb would not help this Service: with its %s algorithm the p99 would be %.1f ms against %.1f ms under %s (%+.0f%%), CPU %.2f against %.2f cores. Leave it uninstalled for this Service, or measure again over a window with more load.",
			load, pick.Policy, a.P99After, a.P99Before, before.Policy, -100*gain, a.CPUAfter, a.CPUBefore)
		a.Text = b.String()
		return a
	}
	a.Algorithm = pick.Policy
	fmt.Fprintf(&b, "%s, adaptive-lb with the %s algorithm would take the Service's p99 from %.1f ms under %s to %.1f ms (%+.0f%%) and its pods' CPU from %.2f to %.2f cores (%+.0f%%). ",
		load, pick.Policy, a.P99Before, before.Policy, a.P99After, -100*gain, a.CPUBefore, a.CPUAfter, 100*(a.CPUAfter/a.CPUBefore-1))
	fmt.Fprintf(&b, "The risk: over the window's busiest 10-second spans (the top %.0f%% by load, up to %.0f rps), its worst p99 was %.1f ms against %.1f ms; ",
		100*peakShare, a.PeakRPS, a.PeakP99After, a.PeakP99Before)
	if a.WorseSpans == 0 {
		b.WriteString("in no 10-second span of the window was it more than 10% worse than today. ")
	} else {
		fmt.Fprintf(&b, "in %d of the window's %d 10-second spans it was more than 10%% worse than today, at worst %.1f ms against %.1f ms at %s. ",
			a.WorseSpans, int(window.Seconds())/10, a.WorstAfter, a.WorstBefore, stamp(a.WorstAt))
	}
	fmt.Fprintf(&b, "The settings it would use: spec.algorithm %s, spec.interval %v, weights written at most once a cycle through the Service's ServiceEntry; start with spec.mode DryRun to see the weights it would write, then Active.",
		pick.Policy, controllerInterval)
	if pick.Policy == sim.PolicyCapacity {
		b.WriteString(" (capacity is not the default: it did clearly better than tail on this Service.)")
	}
	a.Text = b.String()
	return a
}

// risk compares the two runs span by span over the window.
func (md *Model) risk(a *Advice, before, after *sim.Result) {
	warm := md.Warmup.Seconds()
	afterAt := map[float64]sim.TimelinePoint{}
	for _, p := range after.Timeline {
		afterAt[p.TimeS] = p
	}
	var spans []sim.TimelinePoint
	for _, p := range before.Timeline {
		if p.TimeS > warm {
			spans = append(spans, p)
		}
	}
	worst := 0.0
	for _, p := range spans {
		q, ok := afterAt[p.TimeS]
		if !ok || p.P99 <= 0 {
			continue
		}
		if q.P99 > p.P99*worseBy {
			a.WorseSpans++
			if q.P99/p.P99 > worst {
				worst = q.P99 / p.P99
				a.WorstAt = md.From.Add(time.Duration((p.TimeS - timelineSpan - warm) * float64(time.Second)))
				a.WorstBefore, a.WorstAfter = p.P99, q.P99
			}
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].RPS > spans[j].RPS })
	n := max(1, int(math.Ceil(peakShare*float64(len(spans)))))
	for _, p := range spans[:min(n, len(spans))] {
		a.PeakRPS = math.Max(a.PeakRPS, p.RPS)
		a.PeakP99Before = math.Max(a.PeakP99Before, p.P99)
		a.PeakP99After = math.Max(a.PeakP99After, afterAt[p.TimeS].P99)
	}
}

// timelineSpan is the width of a simulator timeline point, in seconds.
const timelineSpan = 10

// loadSeries is the measured load with its gaps filled.
func (md *Model) loadSeries() []float64 {
	rates := []float64{md.Scenario.Load.RPS}
	for _, ph := range md.Scenario.Load.Phases {
		rates = append(rates, ph.RPS)
	}
	return rates
}

func meanOf(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func maxOf(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}
