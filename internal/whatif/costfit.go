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

// The request cost's family and parameters are fitted to the server-side latency histograms
// (costfamily.go). The variability is the workload's, shared by every group (faster hardware
// divides every request's cost by the same factor), so one shape is fitted for the Service, from
// the groups that run at low utilisation, each at its own: there a request's latency is mostly
// its own service time, where near the limit queueing and CPU throttling dominate the histogram.
// A candidate is judged by simulating one pod of each such group at its own measured load,
// through the same simulator and the same Istio buckets, and scoring the measured bucket counts
// against the simulated shares (multinomial likelihood).

// lowUtilisation is the utilisation under which a group calibrates the cost shape.
const lowUtilisation = 0.5

// minCalibrationRequests is the fewest requests a group's histogram needs to calibrate the shape.
const minCalibrationRequests = 200

// maxCalibrationRequests caps one calibration run; longer windows are compressed in time, each
// step keeping its rate.
const maxCalibrationRequests = 150_000

// fitCost chooses the cost shape, and says how it was found. Each group calibrates over the
// whole window where it ran below lowUtilisation, else over the window's calmest stretch where it
// did there; when none did either, the least loaded of them calibrates alone.
func fitCost(md *Model, calm *Stretch, seed int64) CostFit {
	var calib, all []*Group
	for i := range md.Groups {
		g := &md.Groups[i]
		if !(g.CostSeconds > 0) || len(g.SpeedSteps) > 0 {
			continue
		}
		var units []*Group
		if g.Latency.Count() >= minCalibrationRequests {
			units = append(units, g)
		}
		if calm != nil && g.CalmLatency.Count() >= minCalibrationRequests && !math.IsNaN(g.CalmUtilisation) {
			c := *g
			c.Name = g.Name + " in the window's calmest stretch"
			c.Latency, c.Utilisation, c.Rates = g.CalmLatency, g.CalmUtilisation, g.Rates[calm.From:calm.To]
			units = append(units, &c)
		}
		all = append(all, units...)
		for _, u := range units {
			if u.Utilisation < lowUtilisation {
				calib = append(calib, u)
				break // the whole window's requests include the calm stretch's
			}
		}
	}
	if len(calib) == 0 {
		var best *Group
		for _, u := range all {
			if best == nil || u.Utilisation < best.Utilisation {
				best = u
			}
		}
		if best == nil {
			md.Assumptions = append(md.Assumptions, fmt.Sprintf("request costs are %s (no group with a steady speed served %d requests with a latency histogram to fit them)", assumedShape, minCalibrationRequests))
			return CostFit{Shape: assumedShape, Assumed: true, From: "assumed"}
		}
		calib = []*Group{best}
	}
	fit := fitCostShape(calib, md.Step, seed)
	if fit.Assumed {
		md.Assumptions = append(md.Assumptions, fmt.Sprintf("request costs are %s: %s", fit.Shape, fit.From))
		return fit
	}
	var names []string
	for _, g := range calib {
		names = append(names, fmt.Sprintf("%s at %.0f%% of its CPU", g.Name, 100*g.Utilisation))
	}
	fit.From = "fitted to the server-side latency histograms of " + strings.Join(names, ", ")
	return fit
}

// calibrationScore is the log-likelihood of g's measured latency buckets under a simulated pod of
// g's shape with the cost shape, at g's measured rate per pod over the window.
func calibrationScore(g *Group, shape CostShape, step time.Duration, seed int64) float64 {
	sc, err := calibrationScenario(g, shape, step, seed)
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
	weight := math.Min(1, simulated.Count()/g.Latency.Count())
	ll := 0.0
	for b, n := range measured {
		if n > 0 {
			ll += weight * n * math.Log((shares[b]+alpha)/total)
		}
	}
	return ll
}

// calibrationRates is one pod's rate in each step of g's calibration run, and the requests they
// add up to.
func calibrationRates(g *Group, step time.Duration) (rates []float64, requests float64) {
	rates = fillGaps(g.Rates, g.RequestRate/float64(len(g.Pods)))
	for _, r := range rates {
		requests += r * step.Seconds()
	}
	return rates, requests
}

// calibrationResolution is about how many requests g's calibration run simulates: one pod's
// share of the group's requests, at most maxCalibrationRequests.
func calibrationResolution(g *Group, step time.Duration) float64 {
	_, requests := calibrationRates(g, step)
	return math.Min(requests, maxCalibrationRequests)
}

// calibrationScenario is one pod of g's shape under g's measured rate per pod, step by step.
func calibrationScenario(g *Group, shape CostShape, step time.Duration, seed int64) (*sim.Scenario, error) {
	rates, expected := calibrationRates(g, step)
	stepSeconds := step.Seconds()
	if expected > maxCalibrationRequests {
		stepSeconds *= maxCalibrationRequests / expected
	}
	stepSeconds = math.Max(5, math.Round(stepSeconds))
	var b strings.Builder
	fmt.Fprintf(&b, "name: cost-fit\nduration: %.0fs\nwarmup: 0s\nseed: %d\n", stepSeconds*float64(len(rates)), seed)
	fmt.Fprintf(&b, "load:\n  rps: %s\n  phases:\n", rps(rates[0]))
	for k := 1; k < len(rates); k++ {
		fmt.Fprintf(&b, "    - {at: %.0fs, rps: %s}\n", stepSeconds*float64(k), rps(rates[k]))
	}
	b.WriteString("clients: {proxies: 1, workers: 1, lb: random}\npods:\n")
	fmt.Fprintf(&b, "  - {name: pod, replicas: 1, workers: %d, cores: %s, cpu_limit: %s, cost: %s}\n",
		workersFor(g.Cores), num(g.Cores), num(g.CPULimit), costYAML(shape.Cost(secondsDuration(g.CostSeconds))))
	if len(rates) == 1 {
		return sim.ParseScenario([]byte(strings.Replace(b.String(), "  phases:\n", "", 1)), "cost-fit")
	}
	return sim.ParseScenario([]byte(b.String()), "cost-fit")
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
