package whatif

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Request costs come in more shapes than one: exponential (memoryless work), lognormal (a
// multiplicative spread), gamma (a shape parameter between and around the two), and a two-part
// mixture (a cache hit and a miss, or the calls that wait on a slow dependency). The fit tries
// each family against the server-side latency histograms and keeps the one that explains them
// best for its number of parameters.

// Cost families the fit tries, in the order it prints them.
var costFamilies = []string{sim.CostExponential, sim.CostGamma, sim.CostLognormal, sim.CostMixture}

// CostShape is a request-cost distribution without its mean: the mean is each group's measured
// CPU per request, and hardware only divides every request's cost by its speed, so the shape is
// the workload's and one shape serves the whole Service.
type CostShape struct {
	Family string
	// CV: a lognormal's or a gamma's coefficient of variation; in a mixture, each part's (gamma).
	CV float64
	// SlowShare is a mixture's share of requests in its slow part; SlowRatio the slow part's mean
	// over the fast part's.
	SlowShare, SlowRatio float64
}

// params is the number of parameters fitted beyond the mean.
func (s CostShape) params() int {
	switch s.Family {
	case sim.CostExponential:
		return 0
	case sim.CostMixture:
		return 3
	}
	return 1
}

// Cost is the shape at a mean.
func (s CostShape) Cost(mean time.Duration) sim.Cost {
	switch s.Family {
	case sim.CostExponential:
		return sim.Cost{Mean: sim.Duration{Duration: mean}, Dist: sim.CostExponential}
	case sim.CostMixture:
		// Shares as a scenario file holds them (four decimals), so the file and the fit agree.
		s.SlowShare = math.Round(s.SlowShare*10000) / 10000
		fast := mean.Seconds() / (1 - s.SlowShare + s.SlowShare*s.SlowRatio)
		return sim.Cost{Mean: sim.Duration{Duration: mean}, Dist: sim.CostMixture, Parts: []sim.CostPart{
			{Share: 1 - s.SlowShare, Mean: sim.Duration{Duration: secondsDuration(fast)}, Dist: sim.CostGamma, CV: s.CV},
			{Share: s.SlowShare, Mean: sim.Duration{Duration: secondsDuration(fast * s.SlowRatio)}, Dist: sim.CostGamma, CV: s.CV},
		}}
	}
	return sim.Cost{Mean: sim.Duration{Duration: mean}, Dist: s.Family, CV: s.CV}
}

// OverallCV is the coefficient of variation of the whole distribution.
func (s CostShape) OverallCV() float64 {
	switch s.Family {
	case sim.CostExponential:
		return 1
	case sim.CostMixture:
		fast := 1 / (1 - s.SlowShare + s.SlowShare*s.SlowRatio)
		slow := fast * s.SlowRatio
		second := (1-s.SlowShare)*fast*fast*(1+s.CV*s.CV) + s.SlowShare*slow*slow*(1+s.CV*s.CV)
		return math.Sqrt(second - 1)
	}
	return s.CV
}

func (s CostShape) String() string {
	switch s.Family {
	case sim.CostExponential:
		return "exponential (CV 1)"
	case sim.CostMixture:
		return fmt.Sprintf("a mixture: %.0f%% of requests %.1f× the cost of the rest, each part gamma with CV %.2f (CV %.2f in all)", 100*s.SlowShare, s.SlowRatio, s.CV, s.OverallCV())
	}
	return fmt.Sprintf("%s with CV %.2f", s.Family, s.CV)
}

// costYAML writes a cost as a scenario's flow mapping.
func costYAML(c sim.Cost) string {
	one := func(mean time.Duration, dist string, cv float64) string {
		s := fmt.Sprintf("mean: %s, dist: %s", seconds(mean.Seconds()), dist)
		if dist == sim.CostLognormal || dist == sim.CostGamma {
			s += ", cv: " + num(cv)
		}
		return s
	}
	if c.Dist != sim.CostMixture {
		return "{" + one(c.Mean.Duration, c.Dist, c.CV) + "}"
	}
	var parts []string
	for _, p := range c.Parts {
		parts = append(parts, fmt.Sprintf("{share: %s, %s}", strconv.FormatFloat(math.Round(p.Share*10000)/10000, 'f', -1, 64), one(p.Mean.Duration, p.Dist, p.CV)))
	}
	return fmt.Sprintf("{dist: mixture, parts: [%s]}", strings.Join(parts, ", "))
}

func secondsDuration(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}

// CostCandidate is one family as fitted, and how well it explains the histograms.
type CostCandidate struct {
	Shape CostShape
	// LogLikelihood of the measured bucket counts under the simulated histograms, the counts
	// weighted down to as many requests as the calibration simulated (its shares are no surer
	// than that, and its own noise must not pass for evidence); Score is it less the BIC penalty
	// for the shape's parameters (½·ln(requests) each). The highest Score wins.
	LogLikelihood, Score float64
}

// CostFit is the family chosen and every candidate's fit.
type CostFit struct {
	Shape      CostShape
	Candidates []CostCandidate
	// From says which histograms it was fitted to, or that it was assumed.
	From string
	// Assumed: no histogram had enough requests; the shape is the default.
	Assumed bool
	// Requests is the number of measured requests the fit scored.
	Requests float64
}

// assumedShape is used when no group has enough requests to fit one.
var assumedShape = CostShape{Family: sim.CostLognormal, CV: 1}

// fitCostShape chooses the cost family and its parameters from the calibration groups'
// histograms: first on each family's distribution itself (a request's latency at low utilisation
// is mostly its own service time, so the histogram is close to the cost's, scaled by the group's
// cost per request), which is fast; then every family's best is checked, and its one main
// parameter refined, by simulating the calibration pods through the simulator and Istio's
// buckets, which adds the queueing and CPU throttling the first step leaves out.
func fitCostShape(calib []*Group, step time.Duration, seed int64) CostFit {
	requests := 0.0
	for _, g := range calib {
		requests += math.Min(g.Latency.Count(), calibrationResolution(g, step))
	}
	fit := CostFit{Requests: requests}
	simulated := func(s CostShape) float64 {
		total := 0.0
		for _, g := range calib {
			total += calibrationScore(g, s, step, seed)
		}
		return total
	}
	fit.Candidates = make([]CostCandidate, len(costFamilies))
	parallel(len(costFamilies), func(i int) {
		family := costFamilies[i]
		s := analyticFit(calib, family)
		ll := simulated(s)
		if family != sim.CostExponential {
			s, ll = refineBySimulation(s, ll, simulated)
		}
		penalty := 0.5 * float64(s.params()) * math.Log(math.Max(requests, 2))
		fit.Candidates[i] = CostCandidate{Shape: s, LogLikelihood: ll, Score: ll - penalty}
	})
	best := -1
	for i, c := range fit.Candidates {
		if !math.IsInf(c.Score, -1) && (best < 0 || c.Score > fit.Candidates[best].Score) {
			best = i
		}
	}
	if best < 0 {
		// No calibration run could be simulated (a bug, or a pod shape the simulator refuses):
		// say so rather than pass exponential off as fitted.
		return CostFit{Shape: assumedShape, Assumed: true, From: "assumed (no calibration run of the histograms could be simulated)"}
	}
	fit.Shape = fit.Candidates[best].Shape
	return fit
}

// refineBySimulation refines the shape's parameters against the simulated score: its CV between
// two thirds and one and a half times the first fit's, and a mixture's cost ratio too (its tail,
// which the coarse buckets above the p99 leave least certain).
func refineBySimulation(s CostShape, ll float64, score func(CostShape) float64) (CostShape, float64) {
	s, ll = goldenSection(s, ll, paramCV, 1.5, 4, score)
	if s.Family == sim.CostMixture {
		s, ll = goldenSection(s, ll, paramRatio, 1.5, 4, score)
	}
	s.CV = math.Round(s.CV*100) / 100
	return s, ll
}

// A shape's parameter, searched on a scale where equal steps are equal changes: the logarithm of
// the CV and of the ratio, the logit of the share.
type shapeParam struct {
	get func(CostShape) float64
	set func(*CostShape, float64)
}

var (
	paramCV = shapeParam{
		get: func(s CostShape) float64 { return math.Log(s.CV) },
		set: func(s *CostShape, x float64) { s.CV = math.Min(math.Exp(x), maxFittedCV) },
	}
	paramRatio = shapeParam{
		get: func(s CostShape) float64 { return math.Log(s.SlowRatio) },
		set: func(s *CostShape, x float64) { s.SlowRatio = math.Min(math.Max(math.Exp(x), 1.2), 100) },
	}
	paramShare = shapeParam{
		get: func(s CostShape) float64 { return math.Log(s.SlowShare / (1 - s.SlowShare)) },
		set: func(s *CostShape, x float64) { s.SlowShare = math.Min(math.Max(1/(1+math.Exp(-x)), 0.005), 0.6) },
	}
	mixtureParams = []shapeParam{paramRatio, paramShare, paramCV}
)

// goldenSection maximises score over one parameter, between the current value divided and
// multiplied by span (on the parameter's scale: ± ln span), in rounds golden-section steps; it
// returns the best shape seen, the current one included.
func goldenSection(s CostShape, best float64, p shapeParam, span float64, rounds int, score func(CostShape) float64) (CostShape, float64) {
	at := func(x float64) CostShape {
		t := s
		p.set(&t, x)
		return t
	}
	x0 := p.get(s)
	lo, hi := x0-math.Log(span), x0+math.Log(span)
	const phi = 0.6180339887498949
	a, b := hi-phi*(hi-lo), lo+phi*(hi-lo)
	fa, fb := score(at(a)), score(at(b))
	for range rounds {
		if fa > fb {
			hi, b, fb = b, a, fa
			a = hi - phi*(hi-lo)
			fa = score(at(a))
		} else {
			lo, a, fa = a, b, fb
			b = lo + phi*(hi-lo)
			fb = score(at(b))
		}
	}
	out := s
	for _, c := range []struct{ x, f float64 }{{a, fa}, {b, fb}} {
		if c.f > best {
			out, best = at(c.x), c.f
		}
	}
	return out, best
}

// maxFittedCV bounds a fitted CV within what the scenario format accepts.
const maxFittedCV = 4.0

// analyticFit fits a family's parameters to the calibration groups' histograms taken as the
// cost distribution itself, scaled by each group's cost per request.
func analyticFit(calib []*Group, family string) CostShape {
	ll := func(s CostShape) float64 {
		total := 0.0
		for _, g := range calib {
			total += shapeLogLikelihood(g, s)
		}
		return total
	}
	switch family {
	case sim.CostExponential:
		return CostShape{Family: family}
	case sim.CostMixture:
		best, bestLL := CostShape{}, math.Inf(-1)
		for _, share := range []float64{0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4} {
			for _, ratio := range []float64{2, 3, 4, 6, 8, 12, 16, 24, 32} {
				for _, cv := range []float64{0.15, 0.25, 0.35, 0.5, 0.7, 1.0} {
					s := CostShape{Family: family, CV: cv, SlowShare: share, SlowRatio: ratio}
					if l := ll(s); l > bestLL {
						best, bestLL = s, l
					}
				}
			}
		}
		// Between the grid's points, one parameter at a time, a few rounds.
		for range 3 {
			for _, p := range mixtureParams {
				best, bestLL = goldenSection(best, bestLL, p, 1.5, 8, ll)
			}
		}
		return best
	}
	best, bestLL := CostShape{}, math.Inf(-1)
	for cv := 0.1; cv <= maxFittedCV; cv *= 1.04 {
		s := CostShape{Family: family, CV: cv}
		if l := ll(s); l > bestLL {
			best, bestLL = s, l
		}
	}
	return best
}

// shapeLogLikelihood is the multinomial log-likelihood of g's measured buckets if each request's
// latency were its cost: the shape at g's cost per request.
func shapeLogLikelihood(g *Group, s CostShape) float64 {
	c := s.Cost(secondsDuration(g.CostSeconds))
	counts := bucketCounts(g.Latency)
	ll, prev := 0.0, 0.0
	for b, ub := range g.Latency.BoundsMS {
		cdf := 1.0
		if !math.IsInf(ub, 1) {
			cdf = c.CDF(ub / 1000)
		}
		p := math.Max(cdf-prev, 1e-9)
		prev = cdf
		if counts[b] > 0 {
			ll += counts[b] * math.Log(p)
		}
	}
	return ll
}

// candidatesText lists every candidate's fit, marking the chosen one (for test logs).
func (f CostFit) candidatesText() string {
	if f.Assumed {
		return ""
	}
	var parts []string
	for _, c := range f.Candidates {
		mark := ""
		if c.Shape == f.Shape {
			mark = " (chosen)"
		}
		parts = append(parts, fmt.Sprintf("%s: log-likelihood %.0f, score %.0f%s", c.Shape, c.LogLikelihood, c.Score, mark))
	}
	return strings.Join(parts, "; ")
}
