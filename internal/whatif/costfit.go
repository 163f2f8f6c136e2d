package whatif

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// The request cost is lognormal; its coefficient of variation is fitted to the server-side latency
// histograms. The variability is the workload's, shared by every group (faster hardware divides
// every request's cost by the same factor), so one CV is fitted for the Service, from the groups
// that run at low utilisation: there a request's latency is mostly its own service time, where
// near the limit queueing and CPU throttling dominate the histogram. Each candidate CV is judged
// by simulating one pod of each such group at its own measured load, through the same simulator
// and the same Istio buckets, and scoring the measured bucket counts against the simulated shares
// (multinomial likelihood).

// cvGrid are the candidate CVs; the best is then refined between its neighbours.
var cvGrid = []float64{0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0}

// lowUtilisation is the utilisation under which a group calibrates the CV.
const lowUtilisation = 0.5

// minCalibrationRequests is the fewest requests a group's histogram needs to calibrate the CV.
const minCalibrationRequests = 200

// assumedCV is the CV used when no group has enough requests to fit it.
const assumedCV = 1.0

// maxCalibrationRequests caps one calibration run; longer windows are compressed in time, each
// step keeping its rate.
const maxCalibrationRequests = 150_000

// fitCV returns the fitted CV and a sentence saying how it was found.
func fitCV(md *Model, seed int64) (float64, string) {
	var calib []*Group
	for i := range md.Groups {
		g := &md.Groups[i]
		if g.Utilisation < lowUtilisation && g.Latency.Count() >= minCalibrationRequests && g.CostSeconds > 0 {
			calib = append(calib, g)
		}
	}
	if len(calib) == 0 {
		var best *Group
		for i := range md.Groups {
			g := &md.Groups[i]
			if g.Latency.Count() >= minCalibrationRequests && g.CostSeconds > 0 && (best == nil || g.Utilisation < best.Utilisation) {
				best = g
			}
		}
		if best == nil {
			md.Assumptions = append(md.Assumptions, fmt.Sprintf("request costs vary with a coefficient of variation of %.1f (no group served %d requests with a latency histogram to fit it)", assumedCV, minCalibrationRequests))
			return assumedCV, "assumed"
		}
		calib = []*Group{best}
	}
	score := func(cv float64) float64 {
		total := 0.0
		for _, g := range calib {
			total += calibrationScore(g, cv, md.Step, seed)
		}
		return total
	}
	scores := make([]float64, len(cvGrid))
	parallel(len(cvGrid), func(i int) { scores[i] = score(cvGrid[i]) })
	best := 0
	for i := range scores {
		if scores[i] > scores[best] {
			best = i
		}
	}
	// Golden-section search on log CV between the best grid point's neighbours.
	lo, hi := math.Log(cvGrid[max(best-1, 0)]), math.Log(cvGrid[min(best+1, len(cvGrid)-1)])
	cv, bestScore := cvGrid[best], scores[best]
	const phi = 0.6180339887498949
	a, b := hi-phi*(hi-lo), lo+phi*(hi-lo)
	fa, fb := score(math.Exp(a)), score(math.Exp(b))
	for range 6 {
		if fa > fb {
			hi, b, fb = b, a, fa
			a = hi - phi*(hi-lo)
			fa = score(math.Exp(a))
		} else {
			lo, a, fa = a, b, fb
			b = lo + phi*(hi-lo)
			fb = score(math.Exp(b))
		}
	}
	for _, c := range []struct{ x, f float64 }{{a, fa}, {b, fb}} {
		if c.f > bestScore {
			cv, bestScore = math.Exp(c.x), c.f
		}
	}
	cv = math.Round(cv*100) / 100
	var names []string
	for _, g := range calib {
		names = append(names, fmt.Sprintf("%s at %.0f%% of its CPU", g.Name, 100*g.Utilisation))
	}
	return cv, "fitted to the server-side latency histograms of " + strings.Join(names, ", ")
}

// calibrationScore is the log-likelihood of g's measured latency buckets under a simulated pod of
// g's shape with cost variability cv, at g's measured rate per pod over the window.
func calibrationScore(g *Group, cv float64, step time.Duration, seed int64) float64 {
	sc, err := calibrationScenario(g, cv, step, seed)
	if err != nil {
		return math.Inf(-1)
	}
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{ScrapeInterval: time.Second})
	if err != nil {
		return math.Inf(-1)
	}
	if _, err := sim.Run(sc, sim.PolicyRandom, sim.Options{Metrics: rec}); err != nil {
		return math.Inf(-1)
	}
	sum, err := rec.Summary(0, sc.Duration.Duration)
	if err != nil || len(sum.Pods) == 0 {
		return math.Inf(-1)
	}
	simulated := resample(sum.Pods[0].Latency, g.Latency.BoundsMS)
	measured := bucketCounts(g.Latency)
	shares := bucketCounts(simulated)
	const alpha = 0.5 // keeps a bucket the simulation never hit from scoring −∞
	total := simulated.Count() + alpha*float64(len(shares))
	ll := 0.0
	for b, n := range measured {
		if n > 0 {
			ll += n * math.Log((shares[b]+alpha)/total)
		}
	}
	return ll
}

// calibrationScenario is one pod of g's shape under g's measured rate per pod, step by step.
func calibrationScenario(g *Group, cv float64, step time.Duration, seed int64) (*sim.Scenario, error) {
	rates := fillGaps(g.Rates, g.RequestRate/float64(len(g.Pods)))
	expected := 0.0
	for _, r := range rates {
		expected += r * step.Seconds()
	}
	stepSeconds := step.Seconds()
	if expected > maxCalibrationRequests {
		stepSeconds *= maxCalibrationRequests / expected
	}
	stepSeconds = math.Max(5, math.Round(stepSeconds))
	var b strings.Builder
	fmt.Fprintf(&b, "name: cv-fit\nduration: %.0fs\nwarmup: 0s\nseed: %d\n", stepSeconds*float64(len(rates)), seed)
	fmt.Fprintf(&b, "load:\n  rps: %s\n  phases:\n", rps(rates[0]))
	for k := 1; k < len(rates); k++ {
		fmt.Fprintf(&b, "    - {at: %.0fs, rps: %s}\n", stepSeconds*float64(k), rps(rates[k]))
	}
	b.WriteString("clients: {proxies: 1, workers: 1, lb: random}\npods:\n")
	fmt.Fprintf(&b, "  - {name: pod, replicas: 1, workers: %d, cores: %s, cpu_limit: %s, cost: {mean: %s, dist: lognormal, cv: %s}}\n",
		workersFor(g.Cores), num(g.Cores), num(g.CPULimit), seconds(g.CostSeconds), num(cv))
	if len(rates) == 1 {
		return sim.ParseScenario([]byte(strings.Replace(b.String(), "  phases:\n", "", 1)), "cv-fit")
	}
	return sim.ParseScenario([]byte(b.String()), "cv-fit")
}

// resample evaluates a cumulative histogram at other bounds, interpolating linearly inside its
// buckets, so that measured histograms with custom Istio buckets can be compared.
func resample(h sim.Histogram, bounds []float64) sim.Histogram {
	if slicesEqual(h.BoundsMS, bounds) {
		return h
	}
	out := sim.Histogram{BoundsMS: bounds, Cumulative: make([]float64, len(bounds)), SumMS: h.SumMS}
	for i, b := range bounds {
		out.Cumulative[i] = cumulativeAtBound(h, b)
	}
	return out
}

func cumulativeAtBound(h sim.Histogram, bound float64) float64 {
	if math.IsInf(bound, 1) {
		return h.Count()
	}
	lower, below := 0.0, 0.0
	for i, ub := range h.BoundsMS {
		if bound <= ub {
			if math.IsInf(ub, 1) {
				return below
			}
			return below + (h.Cumulative[i]-below)*(bound-lower)/(ub-lower)
		}
		lower, below = ub, h.Cumulative[i]
	}
	return h.Count()
}

func slicesEqual(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(math.IsInf(a[i], 1) && math.IsInf(b[i], 1)) {
			return false
		}
	}
	return true
}

// fillGaps replaces NaN rates by the previous step's (the first by fallback).
func fillGaps(rates []float64, fallback float64) []float64 {
	out := make([]float64, len(rates))
	prev := fallback
	for i, r := range rates {
		if math.IsNaN(r) || r < 0 {
			r = prev
		}
		out[i], prev = r, r
	}
	if len(out) == 0 {
		out = []float64{fallback}
	}
	return out
}

// workersFor is the concurrency assumed for a pod: one request in service per node CPU.
func workersFor(cores float64) int { return max(1, int(math.Ceil(cores))) }

// rps formats a rate for a scenario; the simulator needs a positive one.
func rps(r float64) string { return num(math.Max(r, minRate)) }

// minRate stands in for a step without requests: the simulator's rates must be positive.
const minRate = 0.01

// num writes a number with four significant digits, never in exponent form (which YAML would
// read as a string).
func num(f float64) string {
	if f == 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return "0"
	}
	scale := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(f))))
	return strconv.FormatFloat(math.Round(f*scale)/scale, 'f', -1, 64)
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Microsecond).String()
}

// parallel runs f(0..n-1) on up to GOMAXPROCS goroutines.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
