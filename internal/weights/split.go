package weights

import (
	"math"
	"slices"
)

// splitSearch finds the split of one Service's planning load over its groups that minimises
// the predicted fleet latency quantile. The quantile of a split is the threshold t at which the
// split's mass of requests slower than t (Σ share × the group's tail at t) equals the budget,
// 1 − quantile; the lowest quantile reachable is the smallest t at which some split keeps its
// mass within the budget. The search bisects on t and, at each t, allocates the load to
// minimise the mass above it.
//
// The shares live on a lattice: group g's share is lo[g] + k[g]·δ with Σk = splitSteps and
// δ = (1 − Σlo)/splitSteps, so that every split sums to one.
type splitSearch struct {
	groups []*podGroup
	lo     []float64
	budget float64
	delta  float64
	// hi is each group's ceiling, as a share of the load.
	hi []float64
	// maxSteps[g] is the most lattice steps group g may take without passing its ceiling.
	maxSteps []int
	// loadPerShare[g] converts group g's share into the load each member sees on the model's
	// calibrated axis.
	loadPerShare []float64
	// Each group's tail at the threshold last set, for every tabulated load: the search reads
	// one threshold at many loads. noTail marks the groups whose model has no request slower
	// than that threshold at any load.
	columns   [][]float64
	noTail    []bool
	columnsAt float64
	// The allocation in progress: each group's steps, its mass, and its mass a stride above
	// and below.
	k                  []int
	mass, above, below []float64
}

// splitSteps is the lattice's resolution: a group's share moves by 1/splitSteps of the load
// above the floors.
const splitSteps = 400

// coarseStride is the number of lattice steps a coarse step of the allocation takes; the climb
// in single steps and the exchanges that follow refine its result.
const coarseStride = 8

// thresholdTolerance ends a bisection on the latency threshold: its bracket is then narrower
// than this fraction of the threshold.
const thresholdTolerance = 1e-3

func newSplitSearch(groups []*podGroup, lo, hi []float64, load, budget float64) *splitSearch {
	n := len(groups)
	s := &splitSearch{
		groups:       groups,
		lo:           lo,
		hi:           hi,
		budget:       budget,
		maxSteps:     make([]int, n),
		loadPerShare: make([]float64, n),
		columns:      make([][]float64, n),
		noTail:       make([]bool, n),
		columnsAt:    math.NaN(),
		mass:         make([]float64, n),
		above:        make([]float64, n),
		below:        make([]float64, n),
		k:            make([]int, n),
	}
	var floors float64
	for _, l := range lo {
		floors += l
	}
	s.delta = (1 - floors) / splitSteps
	cells := make([]float64, n*len(modelUtilizations))
	for g, grp := range groups {
		s.columns[g] = cells[g*len(modelUtilizations) : (g+1)*len(modelUtilizations)]
		s.loadPerShare[g] = grp.loadScale * load / float64(len(grp.members)) / grp.capacity
		// The same margin as a step's test against the ceiling always had. No group takes more
		// than all the steps, which also keeps the count an int when δ is tiny.
		s.maxSteps[g] = int(math.Max(0, math.Min(splitSteps, math.Floor((hi[g]-lo[g]+1e-12)/s.delta))))
		for s.maxSteps[g] > 0 && lo[g]+float64(s.maxSteps[g])*s.delta > hi[g]+1e-12 {
			s.maxSteps[g]--
		}
		for s.maxSteps[g] < splitSteps && lo[g]+float64(s.maxSteps[g]+1)*s.delta <= hi[g]+1e-12 {
			s.maxSteps[g]++
		}
	}
	return s
}

// ceilingSplit is the split when the ceilings leave the lattice too few steps to place the whole
// load: they add up to about 1 (every group at its ceiling; the surge bound puts every group at
// its capacity share from a planning load of 1/SurgeFactor of the fleet's capacity), and the
// lattice's rounding below each ceiling loses the last steps. The ceilings, scaled to add up to
// 1, are then the one split the bounds allow. Ceilings that fall short of the load by more than
// that rounding allow none.
func (s *splitSearch) ceilingSplit(gridEnd float64) ([]float64, float64, bool) {
	var ceilings float64
	for _, h := range s.hi {
		ceilings += h
	}
	if ceilings < 1-1e-9 || ceilings > 1+float64(len(s.hi)+1)*s.delta {
		return nil, 0, false
	}
	x := make([]float64, len(s.hi))
	for g, h := range s.hi {
		x[g] = h / ceilings
	}
	t := s.quantileOf(x, gridEnd)
	if !(t < gridEnd) {
		return nil, 0, false
	}
	return x, t, true
}

// share is group g's share after k lattice steps.
func (s *splitSearch) share(g, k int) float64 { return s.lo[g] + float64(k)*s.delta }

func (s *splitSearch) setThreshold(t float64) {
	if t == s.columnsAt {
		return
	}
	for g, grp := range s.groups {
		grp.model.column(timePosition(t/grp.cost), s.columns[g])
		s.noTail[g] = !slices.ContainsFunc(s.columns[g], func(v float64) bool { return v != 0 })
	}
	s.columnsAt = t
}

// massAt is group g's mass above the threshold last set (which is positive) after k steps.
func (s *splitSearch) massAt(g, k int) float64 {
	x := s.share(g, k)
	if x <= 0 {
		return 0
	}
	u := x * s.loadPerShare[g]
	switch {
	case !s.noTail[g]:
		return x * tailFromColumn(s.columns[g], u)
	case u > maxModelUtilization:
		return x // the whole share is past the last tabulated load
	default:
		return 0 // an interpolation between zeros
	}
}

// directMass is group g's mass above t at share x, read from the model without the columns:
// for reading each group once per threshold, as a quantile's bisection does, a column would
// cost twenty reads for one.
func (s *splitSearch) directMass(g int, x, t float64) float64 {
	if x <= 0 {
		return 0
	}
	if t <= 0 {
		return x
	}
	grp := s.groups[g]
	return x * grp.model.tailAt(timePosition(t/grp.cost), x*s.loadPerShare[g])
}

// quantileOf is split x's predicted quantile, bisected in [0, upper] to thresholdTolerance;
// a split whose quantile is beyond upper gets upper.
func (s *splitSearch) quantileOf(x []float64, upper float64) float64 {
	return s.quantileWithin(x, upper, thresholdTolerance)
}

// quantileWithin is quantileOf to a relative tolerance of tol.
func (s *splitSearch) quantileWithin(x []float64, upper, tol float64) float64 {
	return lowestThreshold(upper, tol, s.budget, func(t float64) float64 {
		var m float64
		for g := range s.groups {
			m += s.directMass(g, x[g], t)
		}
		return m
	})
}

// lowestThreshold bisects [0, upper] to a relative tolerance of tol for the lowest latency
// threshold whose predicted mass above it (massAbove, decreasing in the threshold) stays within
// budget: the predicted quantile. A quantile beyond upper gives upper.
func lowestThreshold(upper, tol, budget float64, massAbove func(t float64) float64) float64 {
	lo, hi := 0.0, upper
	for i := 0; i < 80 && hi-lo > tol*hi; i++ {
		mid := (lo + hi) / 2
		if massAbove(mid) <= budget {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// allocate splits the load for a positive threshold t to minimise the mass above t, and returns
// each group's steps and the split's mass; the mass is +Inf when the ceilings cannot take the
// load. It climbs greedily, each step to the group where it adds the least mass: first in coarse
// steps, then, after taking one coarse step back from every group, in single steps. The masses
// are not convex in the share everywhere (the model's tables are simulated), so a greedy climb
// can stop in a local minimum; exchanges of 64, 16, 4 and single steps between two groups, while
// one lowers the mass, then leave such a minimum where a larger move pays. That costs about a
// fifth of the reads of a climb by single steps alone, and finds a split at least as good in
// nearly every case (TestSplitSearch_MatchesTheExhaustiveSearch).
func (s *splitSearch) allocate(t float64) ([]int, float64) {
	s.setThreshold(t)
	for g := range s.groups {
		s.k[g] = 0
		s.mass[g] = s.massAt(g, 0)
	}
	if !s.climb(splitSteps, coarseStride) {
		return s.k, math.Inf(1)
	}
	back := 0
	for g := range s.groups {
		d := min(s.k[g], coarseStride)
		s.k[g] -= d
		back += d
		s.mass[g] = s.massAt(g, s.k[g])
	}
	if !s.climb(back, 1) {
		return s.k, math.Inf(1)
	}
	for _, stride := range exchangeStrides {
		s.exchange(stride)
	}
	var total float64
	for g := range s.groups {
		total += s.mass[g]
	}
	return s.k, total
}

// exchangeStrides are the sizes of the exchanges that end an allocation, largest first.
var exchangeStrides = []int{64, 16, 4, 1}

// climb adds steps lattice steps, stride at a time while some group can take a whole stride and
// single steps after, each where it adds the least mass. It returns false when the ceilings
// leave no room for a step.
func (s *splitSearch) climb(steps, stride int) bool {
	k, mass, next := s.k, s.mass, s.above
	readNext := func(g int) {
		if k[g]+stride <= s.maxSteps[g] {
			next[g] = s.massAt(g, k[g]+stride)
		} else {
			next[g] = math.Inf(1)
		}
	}
	stride = min(stride, steps)
	for g := range s.groups {
		readNext(g)
	}
	for steps > 0 {
		best, bestCost := -1, math.Inf(1)
		for g := range s.groups {
			// Ties go to the first group, as they always have.
			if c := next[g] - mass[g]; c < bestCost {
				best, bestCost = g, c
			}
		}
		if best < 0 || stride > steps {
			if stride == 1 {
				return false
			}
			// No group can take a whole stride (or fewer steps are left): go on in single steps.
			stride = 1
			for g := range s.groups {
				readNext(g)
			}
			continue
		}
		k[best] += stride
		mass[best] = next[best]
		steps -= stride
		readNext(best)
	}
	return true
}

// exchange moves stride steps at a time from one group to another while that lowers the mass,
// the pair that lowers it most first.
func (s *splitSearch) exchange(stride int) {
	k, mass, above, below := s.k, s.mass, s.above, s.below
	readAbove := func(g int) {
		if k[g]+stride <= s.maxSteps[g] {
			above[g] = s.massAt(g, k[g]+stride)
		} else {
			above[g] = math.Inf(1)
		}
	}
	readBelow := func(g int) {
		if k[g] >= stride {
			below[g] = s.massAt(g, k[g]-stride)
		} else {
			below[g] = math.Inf(1)
		}
	}
	for g := range s.groups {
		readAbove(g)
		readBelow(g)
	}
	// Every move lowers the mass, so the loop ends; the bound only guards against rounding.
	for range 4 * splitSteps / stride {
		from, to, gain := -1, -1, 0.0
		for a := range s.groups {
			if math.IsInf(below[a], 1) {
				continue
			}
			saved := mass[a] - below[a]
			for b := range s.groups {
				if b == a || math.IsInf(above[b], 1) {
					continue
				}
				// A relative margin keeps rounding from trading steps back and forth.
				if d := saved - (above[b] - mass[b]); d > gain && d > 1e-12*(mass[a]+mass[b]) {
					from, to, gain = a, b, d
				}
			}
		}
		if from < 0 {
			return
		}
		k[from] -= stride
		above[from], mass[from] = mass[from], below[from]
		readBelow(from)
		k[to] += stride
		below[to], mass[to] = mass[to], above[to]
		readAbove(to)
	}
}

// split returns the shares for lattice steps k.
func (s *splitSearch) split(k []int) []float64 {
	x := make([]float64, len(k))
	for g := range k {
		x[g] = s.share(g, k[g])
	}
	return x
}

// floorQuantile is a threshold below which no split keeps its mass within the budget: the
// smallest over groups and tabulated loads of the grid point just below where the tail falls
// to the budget. The mass of any split is at least its least tail (the shares sum to one, and a
// tail between two loads is an interpolation of theirs), and the tails fall with the threshold.
func (s *splitSearch) floorQuantile() float64 {
	lowest := math.Inf(1)
	for _, grp := range s.groups {
		for _, row := range grp.model.ccdf {
			// The first grid point at which the row is within the budget.
			j, _ := slices.BinarySearchFunc(row, s.budget, func(v, b float64) int {
				if v > b {
					return -1
				}
				return 1
			})
			if j == 0 {
				return 0
			}
			if j < len(row) {
				lowest = math.Min(lowest, grp.cost*modelTime(j-1))
			}
		}
	}
	if math.IsInf(lowest, 1) {
		return 0
	}
	return lowest
}

// search returns the split with the lowest predicted quantile and that quantile, or false when
// no split within the ceilings keeps the quantile on the model's latency grid. reference is a
// split within the bounds whose quantile brackets the search from above (the capacity split).
func (s *splitSearch) search(reference []float64) ([]float64, float64, bool) {
	total := 0
	for _, m := range s.maxSteps {
		total += m
	}
	var maxCost float64
	for _, g := range s.groups {
		maxCost = math.Max(maxCost, g.cost)
	}
	gridEnd := maxCost * modelTime(modelTimePoints-1)
	if total < splitSteps {
		return s.ceilingSplit(gridEnd)
	}
	// The optimum's quantile is at most the reference's (give or take the lattice), and at
	// least the floor. Starting from that bracket instead of [0, the grid's end] saves the
	// rounds that would probe thresholds thousands of mean costs long.
	tLo, tHi := s.floorQuantile(), s.quantileOf(reference, gridEnd)
	k, m := s.allocate(tHi)
	if m > s.budget {
		// The allocation missed the reference's quantile (the lattice, or a local minimum):
		// search above it, up to the grid's end.
		tLo, tHi = math.Max(tLo, tHi), gridEnd
		if k, m = s.allocate(tHi); m > s.budget {
			return nil, 0, false
		}
	}
	best := slices.Clone(k)
	for i := 0; i < 40 && tHi-tLo > thresholdTolerance*tHi; i++ {
		mid := (tLo + tHi) / 2
		if k, m := s.allocate(mid); m <= s.budget {
			tHi = mid
			copy(best, k)
		} else {
			tLo = mid
		}
	}
	return s.split(best), tHi, true
}
