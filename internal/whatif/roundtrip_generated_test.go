package whatif

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// The round trip of roundtrip_test.go on generated scenarios (sim.GenerateScenarioWith, with speed
// changes): request costs of every family the generator draws, fleets and loads it draws, and in
// some scenarios a class that slows down during the window. It takes minutes per scenario, so it
// is a benchmark, run on demand (docs/benchmarks.md, "What-if round trips on generated
// scenarios"):
//
//	go test ./internal/whatif -run '^$' -bench BenchmarkWhatIfRoundTripGenerated -benchtime 1x -timeout 4h \
//	  -args -whatif.scenarios 30 -whatif.seed 101 -whatif.keep-worst "$PWD/DIR"
var (
	generatedScenarios = flag.Int("whatif.scenarios", 4, "BenchmarkWhatIfRoundTripGenerated: how many generated scenarios to round-trip (each under two seeds)")
	generatedSeries    = flag.Int64("whatif.seed", 101, "BenchmarkWhatIfRoundTripGenerated: the series the scenarios are drawn from")
	generatedKeepWorst = flag.String("whatif.keep-worst", "", "BenchmarkWhatIfRoundTripGenerated: write the worst round trips to this directory as scenario files (a relative path is taken from internal/whatif, where go test runs)")
)

// roundTripWorkers is how many round trips run at once: the simulations are CPU-bound.
const roundTripWorkers = 2

// comparedPolicies are the policies whose p99 over least_request's the round trip compares between
// the original scenario and the fitted one.
var comparedPolicies = []string{sim.PolicyTail, sim.PolicyCapacity}

// generatedRoundTrip is one generated scenario, run under one seed, round-tripped.
type generatedRoundTrip struct {
	index int
	seed  int64
	drawn sim.Drawn
	// scenario is the drawn one under seed.
	scenario *sim.Scenario
	// err is a step that failed before the check (the fit refusing the measurements, say).
	err error
	// What the fit found: its cost, its groups against the original's classes, and the largest
	// errors of cost per request (NaN when the groups are not the classes) and of a load step.
	fittedCost          sim.Cost
	fittedCV            float64
	groups, classes     int
	costErr, loadErr    float64
	disagreements       []string
	checkP99, checkCPU  float64
	passed              bool
	original, predicted map[string]float64 // comparedPolicies' p99 over least_request's
	wall                time.Duration
}

// ratioError is the predicted ratio's relative error for policy (NaN unless the check passed).
func (rt *generatedRoundTrip) ratioError(policy string) float64 {
	if !rt.passed {
		return math.NaN()
	}
	return rt.predicted[policy]/rt.original[policy] - 1
}

// worstRatioError is the largest absolute ratio error of the compared policies.
func (rt *generatedRoundTrip) worstRatioError() float64 {
	worst := math.NaN()
	for _, p := range comparedPolicies {
		if e := math.Abs(rt.ratioError(p)); !(e <= worst) {
			worst = e
		}
	}
	return worst
}

func BenchmarkWhatIfRoundTripGenerated(b *testing.B) {
	vm := vmtest.Start(b)
	reader := newReader(b, vm.URL)
	series, n := *generatedSeries, *generatedScenarios
	for range b.N {
		var trips []*generatedRoundTrip
		for i := range n {
			d, err := sim.GenerateScenarioWith(series, i, sim.GenerateOptions{SpeedChanges: true})
			if err != nil {
				b.Fatal(err)
			}
			for k := range int64(2) {
				trips = append(trips, &generatedRoundTrip{index: i, seed: d.Scenario.Seed + k, drawn: d})
			}
		}
		start := time.Now()
		runRoundTrips(trips, func(rt *generatedRoundTrip) { roundTripGenerated(vm, reader, series, rt) })
		elapsed := time.Since(start)
		report := generatedReport{series: series, scenarios: n, trips: trips, elapsed: elapsed}
		fmt.Print(report.markdown())
		if dir := *generatedKeepWorst; dir != "" {
			if err := report.keepWorst(dir); err != nil {
				b.Fatal(err)
			}
		}
		var busy time.Duration
		for _, rt := range trips {
			busy += rt.wall
		}
		b.ReportMetric(busy.Seconds()/float64(len(trips)), "s/roundtrip")
		b.ReportMetric(report.passRate(), "passed/roundtrip")
	}
}

// runRoundTrips runs f on every trip on roundTripWorkers goroutines.
func runRoundTrips(trips []*generatedRoundTrip, f func(*generatedRoundTrip)) {
	next := make(chan *generatedRoundTrip)
	var wg sync.WaitGroup
	for range min(roundTripWorkers, len(trips)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rt := range next {
				f(rt)
			}
		}()
	}
	for _, rt := range trips {
		next <- rt
	}
	close(next)
	wg.Wait()
}

// roundTripGenerated simulates rt's scenario under least_request, exports and imports its series
// under a namespace of its own, reads, fits and checks it, and when the check passes predicts and
// runs the original under the compared policies. It runs on a worker goroutine, so it records
// every failure in rt instead of failing the benchmark.
func roundTripGenerated(vm *vmtest.Server, reader *Reader, series int64, rt *generatedRoundTrip) {
	began := time.Now()
	defer func() { rt.wall = time.Since(began) }()
	sc := *rt.drawn.Scenario
	sc.Seed = rt.seed
	rt.scenario = &sc
	namespace := fmt.Sprintf("gen-s%d-%03d-%d", series, rt.index, rt.seed)
	start := pastStart()
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: namespace, Service: "svc"})
	if err != nil {
		rt.err = err
		return
	}
	leastRequest, err := sim.Run(&sc, sim.PolicyLeastRequest, sim.Options{Metrics: rec})
	if err != nil {
		rt.err = fmt.Errorf("simulating the original: %w", err)
		return
	}
	var text strings.Builder
	if err := rec.WriteText(&text, start); err != nil {
		rt.err = err
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := vm.Import(ctx, text.String()); err != nil {
		rt.err = fmt.Errorf("importing into VictoriaMetrics: %w", err)
		return
	}
	m, err := reader.Read(ctx, Window{Namespace: namespace, Service: "svc", End: start.Add(sc.Duration.Duration), Length: sc.Duration.Duration - sc.Warmup.Duration})
	if err != nil {
		rt.err = fmt.Errorf("reading: %w", err)
		return
	}
	md, err := Fit(m, Options{Warmup: sc.Warmup.Duration, Seed: sc.Seed})
	if err != nil {
		rt.err = fmt.Errorf("fitting: %w", err)
		return
	}
	rt.fittedCost, rt.fittedCV = md.Scenario.Pods[0].Cost, md.Cost.Shape.OverallCV()
	rt.groups, rt.classes = len(md.Groups), len(sc.Pods)
	rt.costErr, rt.loadErr = groupCostError(&sc, md), loadStepError(&sc, md)
	check, err := md.Check()
	if err != nil {
		rt.err = fmt.Errorf("checking: %w", err)
		return
	}
	rt.disagreements = check.Disagreements
	rt.checkP99, rt.checkCPU = check.largestErrors()
	if check.Err() != nil {
		return
	}
	pred, err := md.Predict(check, append([]string{sim.PolicyLeastRequest}, comparedPolicies...))
	if err != nil {
		rt.err = fmt.Errorf("predicting: %w", err)
		return
	}
	rt.passed = true
	rt.original, rt.predicted = map[string]float64{}, map[string]float64{}
	predictedP99 := map[string]float64{}
	for _, r := range pred.Results {
		predictedP99[r.Policy] = r.Latency.P99
	}
	for _, p := range comparedPolicies {
		r, err := sim.Run(&sc, p, sim.Options{})
		if err != nil {
			rt.err, rt.passed = fmt.Errorf("simulating the original under %s: %w", p, err), false
			return
		}
		rt.original[p] = r.Latency.P99 / leastRequest.Latency.P99
		rt.predicted[p] = predictedP99[p] / predictedP99[sim.PolicyLeastRequest]
	}
}

// meanSpeed is a pod group's speed averaged over the window from the warm-up to the end: a slowed
// class's cost per request over the window is about its mean cost over this.
func meanSpeed(sc *sim.Scenario, pg sim.PodGroup) float64 {
	from, to := sc.Warmup.Seconds(), sc.Duration.Seconds()
	speed, at, sum := pg.Speed, from, 0.0
	for _, ev := range pg.Events {
		if ev.Speed == nil {
			continue
		}
		if t := ev.At.Seconds(); t > at {
			sum += speed * (min(t, to) - at)
			at = min(t, to)
		}
		speed = *ev.Speed
	}
	return (sum + speed*(to-at)) / (to - from)
}

// groupCostError is the largest relative error of a fitted group's cost per request against its
// class's (the class's mean cost over its mean speed), matched by name; NaN when the fitted
// groups are not the classes (two classes of one shape fit as one group).
func groupCostError(sc *sim.Scenario, md *Model) float64 {
	if len(md.Groups) != len(sc.Pods) {
		return math.NaN()
	}
	worst := 0.0
	for _, g := range md.Groups {
		found := false
		for _, pg := range sc.Pods {
			if pg.Name == g.Name {
				found = true
				worst = math.Max(worst, math.Abs(g.CostSeconds/(pg.Cost.Mean.Seconds()/meanSpeed(sc, pg))-1))
			}
		}
		if !found {
			return math.NaN()
		}
	}
	return worst
}

// loadStepError is the largest relative error of a fitted load step against the rate the
// original offered over the same stretch (as compareLoad, without failing).
func loadStepError(sc *sim.Scenario, md *Model) float64 {
	worst := 0.0
	for _, l := range loadSteps(sc, md) {
		worst = math.Max(worst, l.err())
	}
	return worst
}

// smallGeneratedSeries and smallGeneratedIndex name a short generated scenario for the round trip
// in `make test`: a cost mixture (92% gamma, 8% gamma 5.2× slower), three classes of distinct
// shapes that do not scale, bursts to 136 rps, about 58,000 requests in 10 min 30 s.
const smallGeneratedSeries, smallGeneratedIndex = 17, 9

func TestRoundTrip_GeneratedScenarioWithAMixedCostFindsItsGroupsAndLoad(t *testing.T) {
	d, err := sim.GenerateScenario(smallGeneratedSeries, smallGeneratedIndex)
	if err != nil {
		t.Fatal(err)
	}
	orig := d.Scenario
	if d.CostFamily != sim.CostExponential && d.CostFamily != sim.CostMixture {
		t.Fatalf("%s draws a %s cost now; pick a small generated scenario with an exponential or mixture cost", orig.Name, d.CostFamily)
	}
	vm := vmtest.Start(t)
	reader := newReader(t, vm.URL)
	start := pastStart()
	text, _ := exportRun(t, orig, sim.PolicyLeastRequest, "generated", "svc", start)
	vm.ImportText(t, text)
	m, err := reader.Read(context.Background(), Window{Namespace: "generated", Service: "svc", End: start.Add(orig.Duration.Duration), Length: orig.Duration.Duration - orig.Warmup.Duration})
	if err != nil {
		t.Fatal(err)
	}
	md, err := Fit(m, Options{Warmup: orig.Warmup.Duration, Seed: orig.Seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\nfitted scenario:\n%s", d.Summary, md.YAML)
	// The groups, speeds, load, clients and network do not depend on the cost's family: they are
	// held to roundtrip_test.go's tolerances. Whether the model check passes on each family, and
	// how close the prediction comes, is measured over a series by
	// BenchmarkWhatIfRoundTripGenerated.
	compareGroups(t, orig, md)
	compareLoad(t, orig, md)
	if got, want := md.Scenario.Clients.Proxies, orig.Clients.Proxies; got != want {
		t.Errorf("fitted %d client proxies, the original has %d", got, want)
	}
	if got, want := md.Scenario.Clients.NetworkLatency.Seconds()*1000, orig.Clients.NetworkLatency.Seconds()*1000; math.Abs(got-want) > networkToleranceMS {
		t.Errorf("fitted network latency %.2f ms, the original %.2f ms", got, want)
	}
}
