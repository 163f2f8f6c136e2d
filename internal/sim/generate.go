package sim

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// This file draws random scenarios meant to find where a policy does harm: mixed hardware,
// loads that change, fleets that scale while they do, few or many client proxies. Every draw is
// documented in docs/benchmarks.md ("Random scenarios"); change both together.

// Drawn is one generated scenario and a one-line account of what was drawn.
type Drawn struct {
	Scenario *Scenario
	Summary  string
	// CostFamily is the request cost's family (CostExponential, CostLognormal, CostGamma or
	// CostMixture), shared by every class.
	CostFamily string
	// SlowedClass is the class whose speed steps down during the run ("" when none does: always
	// without GenerateOptions.SpeedChanges).
	SlowedClass string
}

// GenerateOptions add draws that `bench --random` leaves out.
type GenerateOptions struct {
	// SpeedChanges: in a share of the scenarios (speedChangeShare), one class slows down step by
	// step during the run, as when a neighbour takes its nodes' cores. Meant for the what-if's
	// round trips, which must fit a Service whose speed moved during the window.
	SpeedChanges bool
}

// Ranges of the draws.
const (
	minClasses, maxClasses   = 2, 4
	minReplicas, maxReplicas = 1, 6       // per class
	minCostCV, maxCostCV     = 0.3, 1.5   // a lognormal or gamma cost's
	minLoad, maxLoad         = 0.30, 0.95 // the peak's share of the fleet's smallest capacity
	minProxies, maxProxies   = 2, 50
	// The fleet's capacity before any scaling is aimed at a log-uniform draw in this range
	// (requests per second): it keeps a run to about a million requests, so that 200 scenarios
	// × 3 seeds × 4 policies take minutes, not hours.
	minCapacityRPS, maxCapacityRPS = 400, 2000
	generatedWarmup                = 60 * time.Second
	// loadStep is the width of the steps a ramp or a decay is drawn in.
	loadStep = 10 * time.Second
)

// Hardware and work are drawn from grids, not from continuous ranges. The tail engine builds a
// latency model per pod shape (CPU limit, node cores, CPU cost per request) and caches it for
// the process: drawn continuously, every scenario has shapes of its own and a tail run spends
// 6 to 15 s building models, against 0.3 s with them cached. On these grids the shapes recur:
// costs are powers of two and speeds powers of √2, so a cost over a speed is a power of √2.
var (
	// classSpeeds are the speeds a class can have; the fastest class drawn is moved to 1. The
	// slowest is 2√2 ≈ 2.83× slower than 1.
	classSpeeds = []float64{1, 1 / math.Sqrt2, 0.5, 0.5 / math.Sqrt2}
	// cpuLimits are the Deployment's CPU limits; coreFactors multiply a limit into a class's
	// node cores, always above the limit. One limit only: every other limit would double the
	// models tail builds, which the process caches 512 of.
	cpuLimits   = []float64{2}
	coreFactors = []float64{2, 4}
	// meanCosts are the request costs on speed 1 (the grid the capacity target picks from).
	meanCosts = []time.Duration{1 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond, 16 * time.Millisecond, 32 * time.Millisecond, 64 * time.Millisecond}
)

// LoadShapes are the shapes of offered load the generator draws from, equally likely.
var LoadShapes = []string{"ramp-up", "ramp-down", "step", "bursts", "flash-crowd"}

// GenerateScenario draws the index-th scenario of the series seed. The same (seed, index) gives
// the same scenario whatever else is drawn, so a series of 200 starts with the series of 50.
// The scenario is complete (defaults filled in) and valid.
func GenerateScenario(seed int64, index int) (Drawn, error) {
	return GenerateScenarioWith(seed, index, GenerateOptions{})
}

// Salts of the generator's random streams. Each group of draws added after the first has a stream
// of its own, so that adding it left every earlier draw of a (seed, index) as it was: the cost
// family changed the costs of the series drawn before it and nothing else, and speed changes
// leave the rest of the scenario as GenerateScenario draws it.
const (
	mainStream  = 0
	costStream  = 1
	speedStream = 2
)

// stream is the random stream salt of scenario (seed, index).
func stream(seed int64, index int, salt uint64) *rand.Rand {
	base := splitmix64(uint64(seed)<<24 ^ uint64(index))
	if salt != mainStream {
		base = splitmix64(base + salt)
	}
	return rand.New(rand.NewSource(int64(base)))
}

// GenerateScenarioWith is GenerateScenario with the draws opts adds.
func GenerateScenarioWith(seed int64, index int, opts GenerateOptions) (Drawn, error) {
	g := generator{rng: stream(seed, index, mainStream)}
	costs := generator{rng: stream(seed, index, costStream)}
	sc, summary, family := g.draw(fmt.Sprintf("random-s%d-%03d", seed, index), costs)
	slowed := ""
	if opts.SpeedChanges {
		var text string
		slowed, text = generator{rng: stream(seed, index, speedStream)}.slowDown(sc)
		summary += text
	}
	data, err := MarshalScenario(sc)
	if err != nil {
		return Drawn{}, err
	}
	// Parsing the file a user would keep fills the defaults and proves it valid.
	parsed, err := ParseScenario(data, sc.Name)
	if err != nil {
		return Drawn{}, fmt.Errorf("generated scenario %s does not validate (a generator bug): %w", sc.Name, err)
	}
	return Drawn{Scenario: parsed, Summary: summary, CostFamily: family, SlowedClass: slowed}, nil
}

// MarshalScenario writes a scenario as the YAML `simulate --scenario` reads.
func MarshalScenario(sc *Scenario) ([]byte, error) {
	data, err := yaml.Marshal(sc)
	if err != nil {
		return nil, fmt.Errorf("encode scenario %s: %w", sc.Name, err)
	}
	return data, nil
}

type generator struct{ rng *rand.Rand }

func (g generator) uniform(lo, hi float64) float64 { return lo + (hi-lo)*g.rng.Float64() }

func (g generator) logUniform(lo, hi float64) float64 {
	return math.Exp(g.uniform(math.Log(lo), math.Log(hi)))
}

func (g generator) intIn(lo, hi int) int { return lo + g.rng.Intn(hi-lo+1) }

// seconds draws a whole number of seconds in [lo, hi].
func (g generator) seconds(lo, hi int) time.Duration {
	return time.Duration(g.intIn(lo, hi)) * time.Second
}

func (g generator) pick(xs []string) string { return xs[g.rng.Intn(len(xs))] }

// class is one hardware class: a pod group.
type class struct {
	name     string
	replicas int
	speed    float64
	cores    float64
}

// draw draws a scenario from g, and its request costs from costs; it returns the scenario, its
// summary and its cost family.
func (g generator) draw(name string, costs generator) (*Scenario, string, string) {
	// Hardware: 2-4 classes on the speed grid, at least two speeds in the fleet, the fastest
	// moved to speed 1; one CPU limit for the Deployment; nodes with 2 or 4 times as many cores
	// as the limit.
	limit := cpuLimits[g.rng.Intn(len(cpuLimits))]
	classes := make([]class, g.intIn(minClasses, maxClasses))
	steps := make([]int, len(classes)) // each class's place on the speed grid
	for slices.Min(steps) == slices.Max(steps) {
		for i := range classes {
			steps[i] = g.rng.Intn(len(classSpeeds))
			classes[i] = class{name: string(rune('a' + i)), replicas: g.intIn(minReplicas, maxReplicas), cores: limit * coreFactors[g.rng.Intn(len(coreFactors))]}
		}
	}
	for i := range classes {
		classes[i].speed = classSpeeds[steps[i]-slices.Min(steps)]
	}
	// Work: one cost distribution for the fleet (the workload's; hardware only divides it by its
	// speed); the mean is the cost of the grid that puts the fleet's capacity nearest (in ratio)
	// to a log-uniform draw in the capacity range. The CV drawn here is the one the generator drew
	// before cost families came in, when every cost was lognormal: a lognormal or gamma cost keeps
	// it, so that a scenario that draws lognormal is the one drawn then. Everything else about the
	// cost comes from its own stream.
	cv := roundTo(g.uniform(minCostCV, maxCostCV), 100)
	target := g.logUniform(minCapacityRPS, maxCapacityRPS)
	cpu := 0.0
	for _, c := range classes {
		cpu += float64(c.replicas) * limit * c.speed
	}
	mean := meanCosts[0]
	for _, m := range meanCosts {
		if math.Abs(math.Log(cpu/m.Seconds()/target)) < math.Abs(math.Log(cpu/mean.Seconds()/target)) {
			mean = m
		}
	}
	ratio := 1.0
	for _, c := range classes {
		ratio = math.Max(ratio, 1/c.speed)
	}

	// Load: one shape around the drawn peak, then maybe a scaling during the change.
	shape := g.pick(LoadShapes)
	pre := g.seconds(120, 240)
	peakShare := g.uniform(minLoad, maxLoad)
	levels, change, post, shapeText := g.loadShape(shape, pre)
	duration := pre + change + post

	var events []scaleEvent
	scaleText := ""
	if g.rng.Float64() < 0.5 {
		ev := g.scaling(shape, classes, pre, change)
		events = append(events, ev)
		scaleText = "; " + ev.describe(classes)
	}
	// The peak is a share of the smallest capacity the fleet has during the run.
	capacity := func(replicas map[int]int) float64 {
		total := 0.0
		for i, c := range classes {
			total += float64(replicas[i]) * limit * c.speed / mean.Seconds()
		}
		return total
	}
	replicas := map[int]int{}
	for i, c := range classes {
		replicas[i] = c.replicas
	}
	smallest := capacity(replicas)
	for _, ev := range events {
		replicas[ev.class] = ev.replicas
		smallest = math.Min(smallest, capacity(replicas))
	}
	peak := peakShare * smallest

	cost, costText, family := costs.costFamily(mean, cv)

	sc := &Scenario{
		Name:     name,
		Duration: Duration{duration},
		Warmup:   Duration{generatedWarmup},
		Seed:     int64(g.intIn(1, 1_000_000)),
		Load:     Load{Arrival: "poisson"},
		Clients: Clients{
			Proxies:        int(math.Round(g.logUniform(minProxies, maxProxies))),
			Workers:        2,
			LB:             LBLeastRequest,
			NetworkLatency: Duration{time.Duration([]int{1, 2, 4, 8}[g.rng.Intn(4)]) * time.Millisecond},
		},
	}
	for i, lv := range levels {
		rps := roundTo(lv.share*peak, 10)
		if i == 0 {
			sc.Load.RPS = rps
			continue
		}
		sc.Load.Phases = append(sc.Load.Phases, Phase{At: Duration{lv.at}, RPS: rps})
	}
	for i, c := range classes {
		pg := PodGroup{
			Name:     c.name,
			Replicas: c.replicas,
			Workers:  max(4, int(c.cores)),
			Cores:    c.cores,
			CPULimit: limit,
			Speed:    c.speed,
			Cost:     cost,
		}
		for _, ev := range events {
			if ev.class == i {
				r := ev.replicas
				pg.Events = append(pg.Events, PodEvent{At: Duration{ev.at}, Replicas: &r})
			}
		}
		sc.Pods = append(sc.Pods, pg)
	}
	speeds := make([]string, len(classes))
	cores := make([]string, len(classes))
	for i, c := range classes {
		speeds[i] = fmt.Sprintf("%s×%d %.3g", c.name, c.replicas, c.speed)
		cores[i] = fmt.Sprintf("%g", c.cores)
	}
	summary := fmt.Sprintf("%s, peak %.0f%% of capacity (%.0f rps); %d classes (%s; %.1f× apart), limit %g on %s-core nodes; cost %s; %d proxies%s",
		shapeText, 100*peakShare, peak, len(classes), strings.Join(speeds, ", "), ratio, limit, strings.Join(cores, "/"), costText, sc.Clients.Proxies, scaleText)
	return sc, summary, family
}

// level is the offered load from at on, as a share of the peak.
type level struct {
	at    time.Duration
	share float64
}

// loadShape draws the load's levels (the first at 0), how long the change lasts from pre on,
// how long the run goes on after it, and a description.
func (g generator) loadShape(shape string, pre time.Duration) (levels []level, change, post time.Duration, text string) {
	steps := func(from, to float64, start, over time.Duration) {
		n := max(1, int(over/loadStep))
		for k := 1; k <= n; k++ {
			at := start + (time.Duration(k-1) * over / time.Duration(n)).Truncate(time.Second)
			levels = append(levels, level{at: at, share: from + (to-from)*float64(k)/float64(n)})
		}
	}
	switch shape {
	case "ramp-up", "ramp-down":
		low := g.uniform(0.3, 0.7)
		change = g.seconds(60, 600)
		post = g.seconds(180, 300)
		from, to := low, 1.0
		if shape == "ramp-down" {
			from, to = 1, low
		}
		levels = []level{{0, from}}
		steps(from, to, pre, change)
		text = fmt.Sprintf("%s from %.0f%% to %.0f%% of the peak over %v from %v", shape, 100*from, 100*to, change, pre)
	case "step":
		low := g.uniform(0.4, 0.8)
		change, post = loadStep, g.seconds(240, 360)
		if g.rng.Float64() < 0.7 {
			levels = []level{{0, low}, {pre, 1}}
			text = fmt.Sprintf("step up from %.0f%% of the peak at %v", 100*low, pre)
		} else {
			levels = []level{{0, 1}, {pre, low}}
			text = fmt.Sprintf("step down to %.0f%% of the peak at %v", 100*low, pre)
		}
	case "bursts":
		base := g.uniform(0.3, 0.7)
		length, period := g.seconds(10, 60), g.seconds(60, 180)
		change, post = g.seconds(300, 480), 0
		levels = []level{{0, base}}
		for at := pre; at+length < pre+change; at += period {
			levels = append(levels, level{at, 1}, level{at + length, base})
		}
		text = fmt.Sprintf("bursts from %.0f%% to the peak for %v every %v from %v", 100*base, length, period, pre)
	default: // flash-crowd
		base := g.uniform(0.2, 0.5)
		hold, decay := g.seconds(60, 240), g.seconds(60, 180)
		change, post = hold+decay, g.seconds(60, 120)
		levels = []level{{0, base}, {pre, 1}}
		steps(1, base, pre+hold, decay)
		text = fmt.Sprintf("flash crowd from %.0f%% to the peak at %v, held %v, back over %v", 100*base, pre, hold, decay)
	}
	return levels, change, post, text
}

// scaleEvent sets a class's replicas at a time.
type scaleEvent struct {
	at              time.Duration
	class, replicas int
}

func (e scaleEvent) describe(classes []class) string {
	c := classes[e.class]
	verb := "scale-out"
	if e.replicas < c.replicas {
		verb = "scale-in"
	}
	return fmt.Sprintf("%s of %s from %d to %d at %v", verb, c.name, c.replicas, e.replicas, e.at)
}

// scaling draws a scale-out or a scale-in of one class during the load change: out more often
// while the load rises, in more often while it falls.
func (g generator) scaling(shape string, classes []class, pre, change time.Duration) scaleEvent {
	pOut := 0.5
	switch shape {
	case "ramp-up", "flash-crowd":
		pOut = 0.75
	case "ramp-down":
		pOut = 0.25
	}
	i := g.rng.Intn(len(classes))
	at := pre + g.seconds(0, int(min(change, 120*time.Second)/time.Second))
	if g.rng.Float64() < pOut || classes[i].replicas == 1 {
		return scaleEvent{at: at, class: i, replicas: classes[i].replicas + g.intIn(1, 3)}
	}
	return scaleEvent{at: at, class: i, replicas: classes[i].replicas - g.intIn(1, min(2, classes[i].replicas-1))}
}

func roundTo(x, per float64) float64 { return math.Round(x*per) / per }
