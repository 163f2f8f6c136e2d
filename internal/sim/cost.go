package sim

import (
	"math"
	"sync"
)

// Cost families. A Service's request costs come in more shapes than one: exponential (memoryless
// work), lognormal (a multiplicative spread), gamma (a shape between the two, or narrower), and a
// mixture of parts (a cache hit and a miss, a slow dependency's long tail). Each turns the
// request's one uniform draw into a cost, so every policy faces the same work for a seed.

// Cost family names, as written in scenario files.
const (
	CostConstant    = "constant"
	CostExponential = "exponential"
	CostLognormal   = "lognormal"
	CostGamma       = "gamma"
	CostMixture     = "mixture"
)

// costSampler turns a uniform draw into a request's cost. The draw is shared by every policy for
// the same request, so that policies face identical work (common random numbers); each pod group
// turns it into its own cost distribution. The distribution's constants are worked out once.
type costSampler struct {
	dist      costDist
	mean      float64 // seconds
	mu, sigma float64 // lognormal: of the cost's logarithm
	// gamma: the standard gamma quantile table of the shape, and the scale (seconds).
	gamma *gammaQuantiles
	scale float64
	// mixture: the parts, and the cumulative share up to and including each.
	parts   []costSampler
	cumFrac []float64
}

// costDist is a cost distribution, switched on for every request: an integer, not its name.
type costDist uint8

const (
	costLognormal costDist = iota
	costConstant
	costExponential
	costGamma
	costMixture
)

func newCostSampler(c Cost) costSampler {
	cs := costSampler{mean: c.Mean.Seconds()}
	switch c.Dist {
	case CostConstant:
		cs.dist = costConstant
	case CostExponential:
		cs.dist = costExponential
	case CostGamma:
		cs.dist = costGamma
		shape := gammaShape(c.CV)
		cs.gamma = gammaTable(shape)
		cs.scale = cs.mean / shape
	case CostMixture:
		cs.dist = costMixture
		total := 0.0
		for _, p := range c.Parts {
			total += p.Share
		}
		acc := 0.0
		for _, p := range c.Parts {
			cs.parts = append(cs.parts, newCostSampler(Cost{Mean: p.Mean, Dist: p.Dist, CV: p.CV}))
			acc += p.Share / total // shares add up to 1 within rounding
			cs.cumFrac = append(cs.cumFrac, acc)
		}
		cs.cumFrac[len(cs.cumFrac)-1] = 1
	default: // lognormal with the given mean and CV
		cs.mu, cs.sigma = lognormalParams(cs.mean, c.CV)
	}
	return cs
}

// lognormalParams are the mean and standard deviation of the logarithm of a lognormal cost of
// the given mean and CV.
func lognormalParams(mean, cv float64) (mu, sigma float64) {
	sigma2 := math.Log(1 + cv*cv)
	return math.Log(mean) - sigma2/2, math.Sqrt(sigma2)
}

// gammaShape is the shape of a gamma cost of the given CV.
func gammaShape(cv float64) float64 { return 1 / (cv * cv) }

// usesNormalQuantile says whether cost needs z, the normal quantile of the draw, worked out ahead
// for the whole batch of arrivals. A mixture works out its part's own quantile itself.
func (c *costSampler) usesNormalQuantile() bool { return c.dist == costLognormal }

// cost is the cost for uniform draw u; z is normalQuantile(u), worked out ahead when
// usesNormalQuantile.
func (c *costSampler) cost(u, z float64) float64 {
	switch c.dist {
	case costConstant:
		return c.mean
	case costExponential:
		return -math.Log(1-u) * c.mean
	case costGamma:
		return c.scale * c.gamma.at(-math.Log(1-u))
	case costMixture:
		// The draw picks the part, and its position within the part's share is the part's own
		// uniform draw: one draw still gives one cost.
		lo := 0.0
		for i, hi := range c.cumFrac {
			if u < hi || i == len(c.cumFrac)-1 {
				v := min((u-lo)/(hi-lo), math.Nextafter(1, 0))
				p := &c.parts[i]
				if p.dist == costLognormal {
					return math.Exp(p.mu + p.sigma*normalQuantile(v))
				}
				return p.cost(v, 0)
			}
			lo = hi
		}
		return c.mean
	default:
		return math.Exp(c.mu + c.sigma*z)
	}
}

// gammaQuantiles is the quantile function of the standard gamma distribution (scale 1) of one
// shape, tabulated against e = −ln(1 − u), the draw's exponential quantile: the gamma quantile is
// smooth and nearly straight in e (exactly e when the shape is 1), so linear interpolation between
// close points is accurate, and beyond the table's end it continues the last slope, as the
// gamma's exponential tail does.
type gammaQuantiles struct {
	x []float64 // x[i] is the quantile at e = i·gammaStep
}

const (
	gammaStep = 0.005
	gammaEMax = 40.0 // u within 4e-18 of 1: beyond any Float64 draw but the last few
)

func (g *gammaQuantiles) at(e float64) float64 {
	f := e / gammaStep
	i := int(f)
	if i >= len(g.x)-1 {
		n := len(g.x) - 1
		return g.x[n] + (g.x[n]-g.x[n-1])*(f-float64(n))
	}
	return g.x[i] + (g.x[i+1]-g.x[i])*(f-float64(i))
}

var gammaTables sync.Map // shape → *gammaQuantiles

// gammaTable returns the table of a shape, building it on first use.
func gammaTable(shape float64) *gammaQuantiles {
	if t, ok := gammaTables.Load(shape); ok {
		return t.(*gammaQuantiles)
	}
	n := int(gammaEMax/gammaStep) + 1
	t := &gammaQuantiles{x: make([]float64, n)}
	x := 0.0
	for i := 1; i < n; i++ {
		u := -math.Expm1(-float64(i) * gammaStep) // 1 − e^(−e)
		x = gammaQuantile(shape, u, x)
		t.x[i] = x
	}
	actual, _ := gammaTables.LoadOrStore(shape, t)
	return actual.(*gammaQuantiles)
}

// gammaQuantile solves P(shape, x) = u for x, from a guess at or below it (the previous table
// point), by bisection to bracket and Newton's method to finish.
func gammaQuantile(shape, u, below float64) float64 {
	lo, hi := below, math.Max(2*below, shape+1)
	for gammaP(shape, hi) < u {
		lo, hi = hi, 2*hi
	}
	x := (lo + hi) / 2
	for range 100 {
		p := gammaP(shape, x)
		if p < u {
			lo = x
		} else {
			hi = x
		}
		// Newton's step from x, kept inside the bracket; bisection where it leaves it.
		lg, _ := math.Lgamma(shape)
		density := math.Exp((shape-1)*math.Log(x) - x - lg)
		next := x - (p-u)/density
		if !(next > lo && next < hi) || density == 0 {
			next = (lo + hi) / 2
		}
		if math.Abs(next-x) <= 1e-12*math.Max(1, x) {
			return next
		}
		x = next
	}
	return x
}

// gammaP is the regularized lower incomplete gamma function P(a, x): its series below a + 1, its
// continued fraction (modified Lentz) above.
func gammaP(a, x float64) float64 {
	if x <= 0 {
		return 0
	}
	lg, _ := math.Lgamma(a)
	front := math.Exp(a*math.Log(x) - x - lg)
	if x < a+1 {
		sum, term := 1/a, 1/a
		for n := 1; n < 1000; n++ {
			term *= x / (a + float64(n))
			sum += term
			if term < sum*1e-15 {
				break
			}
		}
		return front * sum
	}
	const tiny = 1e-300
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		delta := d * c
		h *= delta
		if math.Abs(delta-1) < 1e-15 {
			break
		}
	}
	return 1 - front*h
}

// CDF is the probability that a request's cost is at most x seconds on hardware of speed 1: the
// distribution the scenario's draws follow, for fitting a family to measured latencies.
func (c Cost) CDF(x float64) float64 {
	if x <= 0 {
		return 0
	}
	m := c.Mean.Seconds()
	switch c.Dist {
	case CostConstant:
		if x >= m {
			return 1
		}
		return 0
	case CostExponential:
		return -math.Expm1(-x / m)
	case CostGamma:
		shape := gammaShape(c.CV)
		return gammaP(shape, x*shape/m)
	case CostMixture:
		p, total := 0.0, 0.0
		for _, part := range c.Parts {
			p += part.Share * Cost{Mean: part.Mean, Dist: part.Dist, CV: part.CV}.CDF(x)
			total += part.Share
		}
		return p / total // as the sampler, shares divided by their sum
	default: // lognormal
		mu, sigma := lognormalParams(m, c.CV)
		return 0.5 * math.Erfc(-(math.Log(x)-mu)/(math.Sqrt2*sigma))
	}
}
