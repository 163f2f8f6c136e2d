package sim

import (
	"fmt"
	"math"
	"time"
)

// The generator's request costs: one family for the fleet, drawn on the cost stream of its
// (seed, index) (see GenerateScenarioWith). Documented in docs/benchmarks.md ("Random scenarios",
// row "request cost"); change both together.

// costFamilies are the families drawn, equally likely.
var costFamilies = []string{CostExponential, CostLognormal, CostGamma, CostMixture}

// Ranges of a mixture's draws: a fast part and a slow one (a cache hit and a miss; the calls that
// wait on a slow dependency).
const (
	minSlowShare, maxSlowShare = 0.05, 0.30 // the slow part's share of the requests
	minSlowRatio, maxSlowRatio = 4, 20      // the slow part's mean over the fast part's (log-uniform)
	minPartCV, maxPartCV       = 0.3, 1.0   // a lognormal or gamma part's CV: the mixture adds the rest of the spread
)

// partFamilies are a mixture part's families, equally likely. A constant part is left out: no
// real request costs the same every time.
var partFamilies = []string{CostExponential, CostLognormal, CostGamma}

// costFamily draws the fleet's cost of the given mean. cv, drawn on the main stream, is the CV of
// a lognormal or gamma cost. It returns the cost, a description and the family.
func (g generator) costFamily(mean time.Duration, cv float64) (Cost, string, string) {
	family := g.pick(costFamilies)
	switch family {
	case CostExponential:
		return Cost{Mean: Duration{mean}, Dist: family}, fmt.Sprintf("%v exponential", mean), family
	case CostLognormal, CostGamma:
		return Cost{Mean: Duration{mean}, Dist: family, CV: cv}, fmt.Sprintf("%v %s CV %.2f", mean, family, cv), family
	}
	// A mixture keeps its mean on the grid: the fast part's mean is set by the drawn share and
	// ratio, the slow part's then so that the shares times the means come back to the mean.
	slowShare := roundTo(g.uniform(minSlowShare, maxSlowShare), 100)
	ratio := g.logUniform(minSlowRatio, maxSlowRatio)
	fast := (time.Duration(float64(mean) / (1 - slowShare + slowShare*ratio))).Round(time.Microsecond)
	slow := (time.Duration((float64(mean) - (1-slowShare)*float64(fast)) / slowShare)).Round(time.Microsecond)
	parts := []CostPart{g.part(1-slowShare, fast), g.part(slowShare, slow)}
	c := Cost{Mean: Duration{mean}, Dist: CostMixture, Parts: parts}
	text := fmt.Sprintf("%v mixture (CV %.2f): %s + %s, %.1f× slower", mean, mixtureCV(c), partText(parts[0]), partText(parts[1]), slow.Seconds()/fast.Seconds())
	return c, text, family
}

// part draws a mixture part's family and CV.
func (g generator) part(share float64, mean time.Duration) CostPart {
	p := CostPart{Share: roundTo(share, 100), Mean: Duration{mean}, Dist: g.pick(partFamilies)}
	if p.Dist != CostExponential {
		p.CV = roundTo(g.uniform(minPartCV, maxPartCV), 100)
	}
	return p
}

func partText(p CostPart) string {
	text := fmt.Sprintf("%.0f%% %v %s", 100*p.Share, p.Mean.Duration, p.Dist)
	if p.CV > 0 {
		text += fmt.Sprintf(" CV %.2f", p.CV)
	}
	return text
}

// mixtureCV is the coefficient of variation of a mixture's cost: from each part's second moment,
// mean² × (1 + CV²), an exponential part's CV being 1.
func mixtureCV(c Cost) float64 {
	mean, second := 0.0, 0.0
	for _, p := range c.Parts {
		cv := p.CV
		if p.Dist == CostExponential {
			cv = 1
		}
		m := p.Mean.Seconds()
		mean += p.Share * m
		second += p.Share * m * m * (1 + cv*cv)
	}
	return math.Sqrt(second/(mean*mean) - 1)
}
