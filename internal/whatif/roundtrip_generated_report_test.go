package whatif

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// The report of BenchmarkWhatIfRoundTripGenerated: a markdown table per round trip, the pass
// rate, the distribution of the prediction's errors, and the worst round trips as scenario files.

// generatedReport is a series of round trips.
type generatedReport struct {
	series    int64
	scenarios int
	trips     []*generatedRoundTrip
	elapsed   time.Duration
}

// keptWorst is how many round trips -whatif.keep-worst writes (the worst of each scenario only).
const keptWorst = 5

// command is the command that ran the series.
func (r *generatedReport) command() string {
	return fmt.Sprintf("go test ./internal/whatif -run '^$' -bench BenchmarkWhatIfRoundTripGenerated -benchtime 1x -timeout 4h -args -whatif.scenarios %d -whatif.seed %d", r.scenarios, r.series)
}

func (r *generatedReport) passRate() float64 {
	passed := 0
	for _, rt := range r.trips {
		if rt.passed {
			passed++
		}
	}
	return float64(passed) / float64(len(r.trips))
}

func (r *generatedReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n`%s`: %d scenarios × 2 seeds, %d round trips in %v of wall time on %d workers.\n\n",
		r.command(), r.scenarios, len(r.trips), r.elapsed.Round(time.Second), roundTripWorkers)
	b.WriteString("| scenario | seed | cost drawn | fitted cost | slowed class | groups / classes | cost/request error | load-step error | check | tail / least_request: original, fitted (error) | capacity / least_request: original, fitted (error) | wall | what was drawn |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, rt := range r.trips {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %v | %s |\n",
			rt.drawn.Scenario.Name, rt.seed, costText(rt.drawn.Scenario.Pods[0].Cost), rt.fittedText(), orDash(rt.drawn.SlowedClass),
			rt.groupsText(), percentOrDash(rt.costErr, 1), percentOrDash(rt.loadErr, 1), rt.checkText(),
			rt.ratioText(sim.PolicyTail), rt.ratioText(sim.PolicyCapacity), rt.wall.Round(time.Second), rt.drawn.Summary)
	}
	b.WriteString("\n" + r.passTable() + "\n" + r.errorTable() + "\n" + r.worstList())
	return b.String()
}

// passTable counts the round trips whose check passed, by cost family and by slowdown.
func (r *generatedReport) passTable() string {
	type count struct{ passed, all int }
	by := map[string]*count{}
	var keys []string
	add := func(key string, passed bool) {
		if by[key] == nil {
			by[key] = &count{}
			keys = append(keys, key)
		}
		by[key].all++
		if passed {
			by[key].passed++
		}
	}
	for _, rt := range r.trips {
		add("all", rt.passed)
		add("cost "+rt.drawn.CostFamily, rt.passed)
		if rt.drawn.SlowedClass != "" {
			add("a class slows down", rt.passed)
		} else {
			add("no class slows down", rt.passed)
		}
		// Pods that come and go are a fit of their own (before replica steps, the fit averaged
		// them into constant groups), so the pass rate is told apart for them.
		if scales(rt.drawn.Scenario) {
			add("a class scales", rt.passed)
		} else {
			add("no class scales", rt.passed)
		}
	}
	sort.SliceStable(keys, func(i, j int) bool { return keys[i] == "all" || (keys[j] != "all" && keys[i] < keys[j]) })
	var b strings.Builder
	b.WriteString("| round trips | check passed |\n| --- | --- |\n")
	for _, k := range keys {
		c := by[k]
		fmt.Fprintf(&b, "| %s | %d of %d (%.0f%%) |\n", k, c.passed, c.all, 100*float64(c.passed)/float64(c.all))
	}
	return b.String()
}

// errorTable is the distribution of the predicted ratios' absolute relative errors, over the
// round trips whose check passed.
func (r *generatedReport) errorTable() string {
	var b strings.Builder
	b.WriteString("| predicted p99 ratio, absolute error | round trips | median | p90 | max | within 10% |\n| --- | --- | --- | --- | --- | --- |\n")
	var all []float64
	row := func(name string, errs []float64) {
		if len(errs) == 0 {
			fmt.Fprintf(&b, "| %s | 0 | – | – | – | – |\n", name)
			return
		}
		within := 0
		for _, e := range errs {
			if e <= 0.10 {
				within++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f%% | %.1f%% | %.1f%% | %d (%.0f%%) |\n", name, len(errs),
			100*quantileOfSorted(errs, 0.5), 100*quantileOfSorted(errs, 0.9), 100*errs[len(errs)-1], within, 100*float64(within)/float64(len(errs)))
	}
	for _, p := range comparedPolicies {
		var errs []float64
		for _, rt := range r.trips {
			if rt.passed {
				errs = append(errs, math.Abs(rt.ratioError(p)))
			}
		}
		slices.Sort(errs)
		all = append(all, errs...)
		row(p+" / least_request", errs)
	}
	slices.Sort(all)
	row("both", all)
	return b.String()
}

// scales says whether a class of sc changes its replicas during the run.
func scales(sc *sim.Scenario) bool {
	for _, p := range sc.Pods {
		for _, ev := range p.Events {
			if ev.Replicas != nil {
				return true
			}
		}
	}
	return false
}

// quantileOfSorted is the q-quantile of sorted xs, linear between order statistics.
func quantileOfSorted(xs []float64, q float64) float64 {
	pos := q * float64(len(xs)-1)
	i := int(pos)
	if i+1 >= len(xs) {
		return xs[len(xs)-1]
	}
	return xs[i] + (xs[i+1]-xs[i])*(pos-float64(i))
}

// worst orders the round trips worst first: those that failed before the check, then those whose
// check failed (by its largest p99 error), then the rest by their largest ratio error.
func (r *generatedReport) worst() []*generatedRoundTrip {
	rank := func(rt *generatedRoundTrip) (int, float64) {
		switch {
		case rt.err != nil:
			return 0, 0
		case !rt.passed:
			return 1, -rt.checkP99
		}
		return 2, -rt.worstRatioError()
	}
	out := slices.Clone(r.trips)
	sort.SliceStable(out, func(i, j int) bool {
		ci, ei := rank(out[i])
		cj, ej := rank(out[j])
		return ci < cj || (ci == cj && ei < ej)
	})
	return out
}

// worstList is the worst round trips, the worst of each scenario, with what went wrong.
func (r *generatedReport) worstList() string {
	var b strings.Builder
	fmt.Fprintf(&b, "The %d worst round trips (the worst of each scenario):\n\n", keptWorst)
	for i, rt := range r.worstPerScenario() {
		fmt.Fprintf(&b, "%d. %s, seed %d: %s\n", i+1, rt.drawn.Scenario.Name, rt.seed, rt.wentWrong())
	}
	return b.String()
}

func (r *generatedReport) worstPerScenario() []*generatedRoundTrip {
	var out []*generatedRoundTrip
	seen := map[int]bool{}
	for _, rt := range r.worst() {
		if !seen[rt.index] && len(out) < keptWorst {
			seen[rt.index] = true
			out = append(out, rt)
		}
	}
	return out
}

// keepWorst writes the worst round trips to dir as scenario files, each under the seed it went
// wrong at, with a header saying what was drawn and what went wrong.
func (r *generatedReport) keepWorst(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, rt := range r.worstPerScenario() {
		data, err := sim.MarshalScenario(rt.scenario)
		if err != nil {
			return err
		}
		what := rt.drawn.CostFamily
		if rt.drawn.SlowedClass != "" {
			what += "-slowdown"
		}
		var head strings.Builder
		fmt.Fprintf(&head, "Scenario %d of `%s` (sim.GenerateScenarioWith with speed changes), run under seed %d. Drawn: %s. Went wrong: %s.",
			rt.index, r.command(), rt.seed, rt.drawn.Summary, rt.wentWrong())
		name := filepath.Join(dir, fmt.Sprintf("whatif-%s-s%d-%03d.yaml", what, r.series, rt.index))
		if err := os.WriteFile(name, append([]byte(comment(head.String(), 100)), data...), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// wentWrong says in words what went wrong in rt (or that nothing did).
func (rt *generatedRoundTrip) wentWrong() string {
	switch {
	case rt.err != nil:
		return rt.err.Error()
	case !rt.passed:
		return fmt.Sprintf("the model check failed (fitted cost %s): %s", rt.fittedText(), strings.Join(rt.disagreements, "; "))
	}
	var parts []string
	for _, p := range comparedPolicies {
		parts = append(parts, fmt.Sprintf("%s / least_request predicted %.3f, the original's %.3f (%+.1f%%)", p, rt.predicted[p], rt.original[p], 100*rt.ratioError(p)))
	}
	return fmt.Sprintf("the check passed (largest errors: p99 %.1f%%, CPU %.1f%%; fitted cost %s); %s", 100*rt.checkP99, 100*rt.checkCPU, rt.fittedText(), strings.Join(parts, "; "))
}

// comment wraps text into YAML comment lines of at most width characters.
func comment(text string, width int) string {
	var b strings.Builder
	line := "#"
	for _, w := range strings.Fields(text) {
		if len(line)+1+len(w) > width && line != "#" {
			b.WriteString(line + "\n")
			line = "#"
		}
		line += " " + w
	}
	return b.String() + line + "\n"
}

// costText is a cost in a few words: its family, and its CV (a mixture's overall).
func costText(c sim.Cost) string {
	switch c.Dist {
	case sim.CostLognormal, sim.CostGamma:
		return fmt.Sprintf("%s CV %.2f", c.Dist, c.CV)
	case sim.CostMixture:
		return fmt.Sprintf("mixture of %d, CV %.2f", len(c.Parts), mixtureCostCV(c))
	}
	return c.Dist
}

// mixtureCostCV is a mixture's coefficient of variation, from each part's second moment.
func mixtureCostCV(c sim.Cost) float64 {
	mean, second := 0.0, 0.0
	for _, p := range c.Parts {
		cv := p.CV
		if p.Dist == sim.CostExponential {
			cv = 1
		}
		m := p.Mean.Seconds()
		mean += p.Share * m
		second += p.Share * m * m * (1 + cv*cv)
	}
	return math.Sqrt(second/(mean*mean) - 1)
}

// fittedText is the fitted cost; before the fit knew families it was always lognormal, with
// Model.CV.
func (rt *generatedRoundTrip) fittedText() string {
	if rt.fittedCost.Dist == "" {
		return "–"
	}
	return costText(rt.fittedCost)
}

func (rt *generatedRoundTrip) groupsText() string {
	if rt.classes == 0 {
		return "–"
	}
	return fmt.Sprintf("%d / %d", rt.groups, rt.classes)
}

func (rt *generatedRoundTrip) checkText() string {
	switch {
	case rt.err != nil:
		return "error: " + strings.ReplaceAll(rt.err.Error(), "|", "/")
	case rt.passed:
		return fmt.Sprintf("passed (p99 %.0f%%, CPU %.0f%%)", 100*rt.checkP99, 100*rt.checkCPU)
	}
	return fmt.Sprintf("failed: %d disagreements (p99 up to %.0f%%, CPU %.0f%%)", len(rt.disagreements), 100*rt.checkP99, 100*rt.checkCPU)
}

func (rt *generatedRoundTrip) ratioText(policy string) string {
	if !rt.passed {
		return "–"
	}
	return fmt.Sprintf("%.3f, %.3f (%+.1f%%)", rt.original[policy], rt.predicted[policy], 100*rt.ratioError(policy))
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func percentOrDash(x float64, decimals int) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.*f%%", decimals, 100*x)
}
