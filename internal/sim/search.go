package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// StaticSearch is the best static split found for a scenario: fixed weights per pod group, on
// the scenario's client balancer, chosen with knowledge of every pod's true capacity. It is the
// yardstick for a weight engine on a steady scenario.
type StaticSearch struct {
	// The sweep over weights ∝ capacity^α.
	AlphaFrom, AlphaTo float64
	Alpha              float64 // the best exponent of the sweep
	AlphaP99           float64 // its p99, ms
	// AlphaAtEdge is true when the best exponent is the largest tried and a larger one would
	// still have changed the weights: the sweep may have stopped short.
	AlphaAtEdge bool
	// Weights per pod group after coordinate descent over the groups' weights from the best
	// exponent, and their p99 (ms): the best static split found.
	Weights map[string]int
	P99     float64
	// AtFloor lists the capacity classes left at the smallest weight (1): the search would have
	// given them less still.
	AtFloor []string
	Runs    int
}

// SearchOptions bound a static search.
type SearchOptions struct {
	// MaxRuns caps the simulations, sweep included; 0 means 60.
	MaxRuns int
	// Parallel is how many simulations run at once; 0 means 2.
	Parallel int
}

// alphaSweep is the first stage of the search. 0 gives equal weights; beyond 12 the sweep goes
// on (×1.5) while the best is at its top and the weights still change.
var alphaSweep = []float64{0, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 8, 12}

// maxAlpha is where the sweep stops extending.
const maxAlpha = 60

// searchTopWeight is the weight of the highest class; the smallest is 1, so a class can be
// given as little as 1/10000 of the top one's traffic per pod.
const searchTopWeight = 10000

// capacityClass is pod groups whose pods have the same true capacity; they share one weight.
type capacityClass struct {
	groups   []string
	capacity float64 // requests per second one pod serves at full CPU
}

func (c capacityClass) name() string { return strings.Join(c.groups, "+") }

// capacityClasses groups the scenario's pod groups by their pods' true capacity, highest first.
func capacityClasses(sc *Scenario) []capacityClass {
	var classes []capacityClass
	for _, pg := range sc.Pods {
		c := podCapacity(pg)
		i := slices.IndexFunc(classes, func(k capacityClass) bool { return math.Abs(k.capacity-c) <= 1e-9*c })
		if i < 0 {
			classes = append(classes, capacityClass{capacity: c})
			i = len(classes) - 1
		}
		classes[i].groups = append(classes[i].groups, pg.Name)
	}
	slices.SortStableFunc(classes, func(a, b capacityClass) int { return cmp.Compare(b.capacity, a.capacity) })
	return classes
}

// podCapacity is the rate one pod of the group serves at full CPU: its CPU (the limit, or its
// cores when unlimited) × speed / mean cost.
func podCapacity(pg PodGroup) float64 {
	cpu := pg.CPULimit
	if cpu == 0 || cpu > pg.Cores {
		cpu = pg.Cores
	}
	return cpu * pg.Speed / pg.Cost.Mean.Seconds()
}

// searcher runs the oracle policy with static weights and remembers every result by weights.
type searcher struct {
	sc       *Scenario
	classes  []capacityClass
	maxRuns  int
	parallel int
	mu       sync.Mutex
	seen     map[string]float64
	runs     int
}

// weightsOf turns relative class weights into integer group weights: the highest is
// searchTopWeight, none below 1.
func (s *searcher) weightsOf(rel []float64) map[string]int {
	top := slices.Max(rel)
	out := map[string]int{}
	for i, c := range s.classes {
		w := max(1, int(math.Round(searchTopWeight*rel[i]/top)))
		for _, g := range c.groups {
			out[g] = w
		}
	}
	return out
}

// weightsKey identifies a weighting for the cache of results.
func weightsKey(ws map[string]int) string {
	names := make([]string, 0, len(ws))
	for n := range ws {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s=%d,", n, ws[n])
	}
	return b.String()
}

// evaluate returns the p99 (ms) of each weighting, running those not seen yet in parallel;
// weightings beyond the run budget get +Inf.
func (s *searcher) evaluate(sets []map[string]int) ([]float64, error) {
	out := make([]float64, len(sets))
	errs := make([]error, len(sets))
	sem := make(chan struct{}, s.parallel)
	var wg sync.WaitGroup
	for i, ws := range sets {
		k := weightsKey(ws)
		s.mu.Lock()
		p99, ok := s.seen[k]
		if !ok && s.runs >= s.maxRuns {
			p99, ok = math.Inf(1), true
		}
		if !ok {
			s.runs++
			s.seen[k] = math.NaN() // claimed; filled in below
		}
		s.mu.Unlock()
		if ok {
			out[i] = p99
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := Run(s.sc, PolicyOracle, Options{StaticWeights: ws})
			if err != nil {
				errs[i] = fmt.Errorf("static weights %s: %w", k, err)
				return
			}
			out[i] = r.Latency.P99
			s.mu.Lock()
			s.seen[k] = out[i]
			s.mu.Unlock()
		}()
	}
	wg.Wait()
	for i, ws := range sets { // a weighting listed twice in one call was run once
		if math.IsNaN(out[i]) {
			s.mu.Lock()
			out[i] = s.seen[weightsKey(ws)]
			s.mu.Unlock()
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SearchStatic finds the best static split of a scenario in two stages: a sweep of weights ∝
// capacity^α (α from 0, equal weights, to 12 and beyond while the best is at the top), then
// coordinate descent over the weight of each capacity class from the best α, multiplying one
// class's weight by a step while that lowers the p99 and shrinking the step when no class
// improves. Every candidate is one full run of the scenario under its seed, so the best is the
// best for that seed: a search over noisy p99s is slightly optimistic.
func SearchStatic(sc *Scenario, o SearchOptions) (*StaticSearch, error) {
	s := &searcher{sc: sc, classes: capacityClasses(sc), maxRuns: cmp.Or(o.MaxRuns, 60), parallel: cmp.Or(o.Parallel, 2), seen: map[string]float64{}}
	relAt := func(alpha float64) []float64 {
		rel := make([]float64, len(s.classes))
		for i, c := range s.classes {
			rel[i] = math.Pow(c.capacity/s.classes[0].capacity, alpha)
		}
		return rel
	}
	alphas := slices.Clone(alphaSweep)
	sets := make([]map[string]int, len(alphas))
	for i, a := range alphas {
		sets[i] = s.weightsOf(relAt(a))
	}
	p99s, err := s.evaluate(sets)
	if err != nil {
		return nil, err
	}
	best := 0
	for i := range p99s {
		if p99s[i] < p99s[best] {
			best = i
		}
	}
	// Extend the sweep while its best is at the top and a larger α still changes the weights.
	for best == len(alphas)-1 {
		next := alphas[best] * 1.5
		ws := s.weightsOf(relAt(next))
		if weightsKey(ws) == weightsKey(sets[best]) || next > maxAlpha || s.runs >= s.maxRuns {
			break
		}
		p, err := s.evaluate([]map[string]int{ws})
		if err != nil {
			return nil, err
		}
		alphas, sets, p99s = append(alphas, next), append(sets, ws), append(p99s, p[0])
		if p[0] < p99s[best] {
			best = len(alphas) - 1
		}
	}
	out := &StaticSearch{AlphaFrom: alphas[0], AlphaTo: alphas[len(alphas)-1], Alpha: alphas[best], AlphaP99: p99s[best]}
	if best == len(alphas)-1 {
		larger := s.weightsOf(relAt(alphas[best] * 1.5))
		out.AlphaAtEdge = weightsKey(larger) != weightsKey(sets[best])
	}

	// Coordinate descent over the classes' weights, in log space.
	rel := relAt(alphas[best])
	bestP99 := p99s[best]
	if len(s.classes) > 1 {
		for step := 1.5; step > 1.04 && s.runs < s.maxRuns; step = math.Sqrt(step) {
			improved := true
			for improved && s.runs < s.maxRuns {
				improved = false
				for c := range s.classes {
					try := func(f float64) []float64 {
						r := slices.Clone(rel)
						r[c] *= f
						return r
					}
					up, down := try(step), try(1/step)
					p, err := s.evaluate([]map[string]int{s.weightsOf(up), s.weightsOf(down)})
					if err != nil {
						return nil, err
					}
					f, cand, p99 := step, up, p[0]
					if p[1] < p99 {
						f, cand, p99 = 1/step, down, p[1]
					}
					for p99 < bestP99 { // keep going while it pays
						rel, bestP99, improved = cand, p99, true
						cand = slices.Clone(rel)
						cand[c] *= f
						p, err := s.evaluate([]map[string]int{s.weightsOf(cand)})
						if err != nil {
							return nil, err
						}
						p99 = p[0]
					}
				}
			}
		}
	}
	out.Weights, out.P99, out.Runs = s.weightsOf(rel), bestP99, s.runs
	for _, c := range s.classes {
		if out.Weights[c.groups[0]] == 1 {
			out.AtFloor = append(out.AtFloor, c.name())
		}
	}
	return out, nil
}
