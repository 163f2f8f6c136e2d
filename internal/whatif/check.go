package whatif

import (
	"fmt"
	"math"
	"strings"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Before anything is predicted, the scenario is run under the policy in force over the window and
// compared with what was measured: each group's p99 and CPU, and the Service's p99. Both sides go
// through the same Istio buckets and the same interpolation, so a difference is the model's, not
// the estimator's.

// p99Tolerance is how far a simulated p99 may lie outside the measured one's sampling range
// (and the other way round) before the model is said to disagree.
const p99Tolerance = 0.25

// cpuTolerance is how far a group's simulated CPU may be from the measured CPU.
const cpuTolerance = 0.10

// Check compares the policy in force, simulated, with the measurements.
type Check struct {
	Policy  Policy
	Groups  []CheckRow
	Service CheckRow
	// Disagreements says, one sentence each, which measurements the model does not reproduce.
	// Empty when the model holds.
	Disagreements []string
	// Suspects names, most likely first, the assumptions the disagreements point at and what to
	// measure or set to fix each.
	Suspects []string
	// Result is the simulated run of the policy in force.
	Result *sim.Result
}

// CheckRow is one group's (or the Service's) measured and simulated figures.
type CheckRow struct {
	Name string
	// P99s in milliseconds, with their sampling ranges (±2 standard deviations of the rank).
	MeasuredP99, SimulatedP99 float64
	MeasuredLo, MeasuredHi    float64
	SimulatedLo, SimulatedHi  float64
	// CPU in cores (the group's pods together); NaN for the Service row (client side).
	MeasuredCPU, SimulatedCPU float64
	// Request rates (the group's pods together); NaN for the Service row.
	MeasuredRate, SimulatedRate float64
}

// rateError is the simulated request rate's relative error.
func (r CheckRow) rateError() float64 { return r.SimulatedRate/r.MeasuredRate - 1 }

// P99Error is the simulated p99's relative error.
func (r CheckRow) P99Error() float64 { return r.SimulatedP99/r.MeasuredP99 - 1 }

// CPUError is the simulated CPU's relative error.
func (r CheckRow) CPUError() float64 { return r.SimulatedCPU/r.MeasuredCPU - 1 }

// p99Disagrees: the two sampling ranges, each widened by p99Tolerance, do not overlap.
func (r CheckRow) p99Disagrees() bool {
	if math.IsNaN(r.MeasuredP99) || math.IsNaN(r.SimulatedP99) {
		return false
	}
	return r.SimulatedHi*(1+p99Tolerance) < r.MeasuredLo || r.SimulatedLo > r.MeasuredHi*(1+p99Tolerance)
}

func (r CheckRow) cpuDisagrees() bool {
	return r.MeasuredCPU > 0 && math.Abs(r.CPUError()) > cpuTolerance
}

// runPolicy runs the scenario under p, recording its series.
func (md *Model) runPolicy(p Policy) (*sim.Result, *sim.MetricsRecorder, error) {
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: md.Namespace, Service: md.Service})
	if err != nil {
		return nil, nil, err
	}
	name, opts := p.Name, sim.Options{Metrics: rec}
	if p.Name == PolicyCurrentWeights {
		name, opts.StaticWeights = sim.PolicyOracle, p.StaticWeights
	}
	r, err := sim.Run(md.Scenario, name, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("simulating %s on the fitted scenario: %w", p.Name, err)
	}
	r.Policy = p.Name
	return r, rec, nil
}

// Check simulates the policy in force over the window and compares it with the measurements.
func (md *Model) Check() (*Check, error) {
	r, rec, err := md.runPolicy(md.Current)
	if err != nil {
		return nil, err
	}
	sum, err := rec.Summary(md.Warmup, md.Warmup+md.To.Sub(md.From))
	if err != nil {
		return nil, fmt.Errorf("reading the simulated window back: %w", err)
	}
	c := &Check{Policy: md.Current, Result: r}
	for _, g := range md.Groups {
		var cpu, rate float64
		var lat sim.Histogram
		for _, p := range sum.Pods {
			if p.Group == g.Name {
				cpu += p.CPUCores
				rate += p.RequestRate
				lat = lat.Add(p.Latency)
			}
		}
		row := newRow(g.Name, g.Latency, lat, g.CPUCores, cpu)
		row.MeasuredRate, row.SimulatedRate = g.RequestRate, rate
		c.Groups = append(c.Groups, row)
	}
	c.Service = newRow("Service (client side)", md.ClientLatency, sum.Clients, math.NaN(), math.NaN())
	c.Service.MeasuredRate, c.Service.SimulatedRate = math.NaN(), math.NaN()
	for _, row := range append(c.Groups, c.Service) {
		what := "group " + row.Name
		if row.Name == c.Service.Name {
			what = "the Service, client side,"
		}
		if row.p99Disagrees() {
			c.Disagreements = append(c.Disagreements, fmt.Sprintf("the p99 of %s is %s measured (plausible %s – %s) but %s simulated (%+.0f%%)",
				what, ms(row.MeasuredP99), ms(row.MeasuredLo), ms(row.MeasuredHi), ms(row.SimulatedP99), 100*row.P99Error()))
		}
		if row.cpuDisagrees() {
			c.Disagreements = append(c.Disagreements, fmt.Sprintf("the CPU of %s is %.2f cores measured but %.2f simulated (%+.0f%%)",
				what, row.MeasuredCPU, row.SimulatedCPU, 100*row.CPUError()))
		}
	}
	c.Suspects = md.suspects(c)
	return c, nil
}

// largestErrors returns the largest relative errors of the check, on a p99 and on a CPU.
func (c *Check) largestErrors() (p99, cpu float64) {
	for _, r := range append(c.Groups, c.Service) {
		if e := math.Abs(r.P99Error()); !math.IsNaN(e) {
			p99 = math.Max(p99, e)
		}
		if e := math.Abs(r.CPUError()); !math.IsNaN(e) {
			cpu = math.Max(cpu, e)
		}
	}
	return p99, cpu
}

func newRow(name string, measured, simulated sim.Histogram, measuredCPU, simulatedCPU float64) CheckRow {
	row := CheckRow{Name: name, MeasuredP99: quantile(measured, 0.99), SimulatedP99: quantile(simulated, 0.99), MeasuredCPU: measuredCPU, SimulatedCPU: simulatedCPU}
	row.MeasuredLo, row.MeasuredHi = quantileBand(measured, 0.99)
	row.SimulatedLo, row.SimulatedHi = quantileBand(simulated, 0.99)
	return row
}

// Err is nil when the model reproduces the measurements, else an ErrModelDisagrees that says
// which measurements disagree and what to do.
func (c *Check) Err() error {
	if len(c.Disagreements) == 0 {
		return nil
	}
	suspect := ""
	if len(c.Suspects) > 0 {
		suspect = ". Suspected: " + strings.Join(c.Suspects, "; ")
	}
	return fmt.Errorf("%w under %s, so no gain is predicted: %s%s. Write the scenario with --write-scenario, correct it and run it with --scenario, or measure over a window without incidents",
		ErrModelDisagrees, c.Policy.Name, strings.Join(c.Disagreements, "; "), suspect)
}
