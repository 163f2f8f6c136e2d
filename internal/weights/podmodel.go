package weights

import (
	"math"
	"math/rand"
	"slices"
	"sort"
	"sync"
)

// This file is the tail algorithm's model of one pod: how its in-pod latency is distributed at a
// given load. It is a small discrete-event simulation run once per pod shape and cached:
//   - requests arrive as a Poisson stream;
//   - up to `cores` of them run at once, each on its own CPU (processor sharing over the node's
//     cores; the pod's worker pool is assumed to match them), later ones wait in a FIFO queue;
//   - the CFS bandwidth controller grants limit × 100 ms of CPU time per 100 ms period, after
//     which every running request stalls until the period ends;
//   - request sizes are lognormal with mean 1 and a given coefficient of variation.
//
// Time is measured in units of the pod's mean CPU cost per request, so one table serves every
// pod with the same cores, limit, CFS period in those units, and size variability.

// cfsPeriodSeconds is the CFS bandwidth period Kubernetes configures (cpu.cfs_period_us).
const cfsPeriodSeconds = 0.1

// modelUtilizations are the loads, as fractions of the CPU limit, at which the model is tabulated.
var modelUtilizations = []float64{0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95}

// maxModelUtilization is the highest tabulated load; beyond it the model predicts no finite tail.
const maxModelUtilization = 0.95

// modelCVs are the size variabilities tabulated; calibration picks the one that fits a group's
// histogram best.
var modelCVs = []float64{0.3, 0.6, 1, 1.5}

// defaultModelCV is used when a group has no histogram to calibrate against.
const defaultModelCV = 1

// The latency grid, in units of the mean cost: log-spaced from modelTimeMin by modelTimeStep.
const (
	modelTimeMin    = 0.02
	modelTimeStep   = 1.06
	modelTimePoints = 220
)

// modelSamples is the number of completions recorded per load; the warm-up before them is a
// tenth. A variable only so that tests of properties that do not depend on the model's accuracy
// can build tables faster.
var modelSamples = 30000

// modelKey identifies a pod shape. Fields are quantised so that measurement noise maps to the
// same table.
type modelKey struct {
	cores  int     // CPUs a pod can run on at once (at least 1)
	limit  float64 // CPU limit in cores, to 0.05
	period float64 // CFS period in units of the mean cost, to about 5% (log grid)
	cv     float64
}

// podModel holds the complementary CDF of in-pod latency, per tabulated load, on the time grid.
type podModel struct {
	ccdf [][]float64 // [utilization][time point]: fraction of requests slower than that time
}

var (
	modelCacheMu sync.Mutex
	modelCache   = map[modelKey]*podModel{}
)

// maxCachedModels bounds the cache; when full it is cleared (tables rebuild in tens of milliseconds).
const maxCachedModels = 512

func newModelKey(cores, limit, meanCost, cv float64) modelKey {
	c := max(1, int(math.Round(cores)))
	l := math.Max(0.05, math.Round(limit*20)/20)
	if l > float64(c) {
		l = float64(c)
	}
	// A period below a twentieth of a request's cost, or above a thousand costs, behaves like
	// its bound: the quota is then a plain rate limit, or never reached between two arrivals.
	period := math.Min(1000, math.Max(0.05, cfsPeriodSeconds/meanCost))
	// Quantise the period on a 5% log grid.
	q := math.Exp(math.Round(math.Log(period)/math.Log(1.05)) * math.Log(1.05))
	return modelKey{cores: c, limit: l, period: q, cv: cv}
}

// modelFor returns the cached table for a pod shape, building it on first use.
func modelFor(k modelKey) *podModel {
	modelCacheMu.Lock()
	m, ok := modelCache[k]
	modelCacheMu.Unlock()
	if ok {
		return m
	}
	m = buildModel(k)
	modelCacheMu.Lock()
	if len(modelCache) >= maxCachedModels {
		clear(modelCache)
	}
	modelCache[k] = m
	modelCacheMu.Unlock()
	return m
}

func buildModel(k modelKey) *podModel {
	m := &podModel{ccdf: make([][]float64, len(modelUtilizations))}
	for i, u := range modelUtilizations {
		lat := simulatePod(k, u, int64(i+1))
		m.ccdf[i] = ccdfOnGrid(lat)
	}
	return m
}

// modelTime returns the j-th point of the latency grid.
func modelTime(j int) float64 { return modelTimeMin * math.Pow(modelTimeStep, float64(j)) }

func ccdfOnGrid(lat []float64) []float64 {
	sort.Float64s(lat)
	out := make([]float64, modelTimePoints)
	n := float64(len(lat))
	for j := range out {
		t := modelTime(j)
		at, _ := slices.BinarySearch(lat, t)
		// lat[at:] are ≥ t; count those strictly above.
		for at < len(lat) && lat[at] <= t {
			at++
		}
		out[j] = float64(len(lat)-at) / n
	}
	return out
}

// tail returns the fraction of requests slower than t (in units of the mean cost) at load u (a
// fraction of the CPU limit). Beyond the tabulated loads every request counts as slow.
func (m *podModel) tail(t, u float64) float64 {
	if t <= 0 {
		return 1
	}
	return m.tailAt(timePosition(t), u)
}

// timePosition is t's fractional index on the latency grid; tailAt takes it so that callers
// reading many loads at one latency compute the logarithm once.
func timePosition(t float64) float64 { return math.Log(t/modelTimeMin) / logModelTimeStep }

var logModelTimeStep = math.Log(modelTimeStep)

func (m *podModel) tailAt(pos, u float64) float64 {
	if u > maxModelUtilization {
		return 1
	}
	if u <= modelUtilizations[0] {
		return rowAt(m.ccdf[0], pos)
	}
	i := utilizationIndex(u)
	f := (u - modelUtilizations[i-1]) / (modelUtilizations[i] - modelUtilizations[i-1])
	return rowAt(m.ccdf[i-1], pos)*(1-f) + rowAt(m.ccdf[i], pos)*f
}

// column fills col with every tabulated load's tail at grid position pos: the split's search
// reads one latency at many loads, and tailFromColumn then costs one interpolation on the load
// axis instead of two on the latency axis. tailFromColumn(col, u) equals tailAt(pos, u) exactly.
func (m *podModel) column(pos float64, col []float64) {
	for i, row := range m.ccdf {
		col[i] = rowAt(row, pos)
	}
}

func tailFromColumn(col []float64, u float64) float64 {
	if u > maxModelUtilization {
		return 1
	}
	if u <= modelUtilizations[0] {
		return col[0]
	}
	i := utilizationIndex(u)
	f := (u - modelUtilizations[i-1]) / (modelUtilizations[i] - modelUtilizations[i-1])
	return col[i-1]*(1-f) + col[i]*f
}

// rowAt interpolates one load's ccdf at a fractional grid position.
func rowAt(row []float64, pos float64) float64 {
	switch {
	case pos <= 0:
		return row[0]
	case pos >= modelTimePoints-1:
		return row[modelTimePoints-1]
	default:
		j := int(pos)
		f := pos - float64(j)
		return row[j]*(1-f) + row[j+1]*f
	}
}

// utilizationIndex returns the i with modelUtilizations[i-1] < u <= modelUtilizations[i], for
// modelUtilizations[0] < u <= maxModelUtilization: the index a binary search finds, reached from
// a guess on the table's 0.05 spacing (the table is strictly increasing, so the walk ends there).
func utilizationIndex(u float64) int {
	us := modelUtilizations
	i := min(max(int(u*20)+1, 1), len(us)-1)
	for i > 1 && us[i-1] >= u {
		i--
	}
	for i < len(us)-1 && us[i] < u {
		i++
	}
	return i
}

// simulatePod runs one pod shape at load u and returns modelSamples in-pod latencies.
func simulatePod(k modelKey, u float64, seed int64) []float64 {
	rng := rand.New(rand.NewSource(seed))
	sigma2 := math.Log(1 + k.cv*k.cv)
	mu, sigma := -sigma2/2, math.Sqrt(sigma2)
	size := func() float64 { return math.Exp(mu + sigma*rng.NormFloat64()) }
	arrivalRate := u * k.limit
	quota := k.limit * k.period
	type job struct{ arrived, remaining float64 }
	var running []job
	var queue []job
	qhead := 0
	warmup := modelSamples / 10
	out := make([]float64, 0, modelSamples)
	done := 0
	t, used := 0.0, 0.0
	periodEnd := k.period
	throttled := false
	nextArrival := rng.ExpFloat64() / arrivalRate
	const eps = 1e-9
	for len(out) < modelSamples {
		n := len(running)
		if n == 0 && nextArrival > periodEnd {
			// Idle until the next arrival: skip the periods in between, which change nothing.
			periodEnd += math.Floor((nextArrival-periodEnd)/k.period) * k.period
			used, throttled = 0, false
		}
		next := math.Min(nextArrival, periodEnd)
		if n > 0 && !throttled {
			minRem := math.Inf(1)
			for _, j := range running {
				minRem = math.Min(minRem, j.remaining)
			}
			next = math.Min(next, t+minRem)
			next = math.Min(next, t+math.Max(0, quota-used)/float64(n))
		}
		if dt := next - t; dt > 0 && n > 0 && !throttled {
			for i := range running {
				running[i].remaining -= dt
			}
			used += float64(n) * dt
		}
		t = next
		if t >= periodEnd-eps {
			periodEnd += k.period
			used = 0
			throttled = false
		}
		kept := running[:0]
		for _, j := range running {
			if j.remaining <= eps {
				done++
				if done > warmup {
					out = append(out, t-j.arrived)
				}
				continue
			}
			kept = append(kept, j)
		}
		running = kept
		if t >= nextArrival-eps {
			queue = append(queue, job{arrived: t, remaining: size()})
			nextArrival = t + rng.ExpFloat64()/arrivalRate
		}
		for len(running) < k.cores && qhead < len(queue) {
			running = append(running, queue[qhead])
			qhead++
		}
		if qhead == len(queue) {
			queue, qhead = queue[:0], 0
		}
		if len(running) > 0 && used >= quota-eps {
			throttled = true
		}
	}
	return out
}
