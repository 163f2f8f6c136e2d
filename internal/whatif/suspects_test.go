package whatif

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// suspectsModel is a fitted model of two groups, one at low and one at high utilisation, with a
// mixture that beat a gamma.
func suspectsModel() *Model {
	return &Model{
		Scenario: &sim.Scenario{Clients: sim.Clients{LB: sim.LBLeastRequest, Workers: 2, NetworkLatency: sim.Duration{Duration: 2 * time.Millisecond}}},
		Current:  Policy{Name: sim.PolicyLeastRequest},
		Groups: []Group{
			{Name: "fast", Pods: []string{"fast-0", "fast-1"}, MeanPods: 2, Replicas: 2, Cores: 8, Utilisation: 0.3, CostSeconds: 0.005},
			{Name: "slow", Pods: []string{"slow-0"}, MeanPods: 1, Replicas: 1, Cores: 8, Utilisation: 0.8, CostSeconds: 0.01},
		},
		Cost: CostFit{
			Shape: CostShape{Family: sim.CostMixture, CV: 0.3, SlowShare: 0.1, SlowRatio: 8},
			Candidates: []CostCandidate{
				{Shape: CostShape{Family: sim.CostGamma, CV: 1.2}, Score: -1050},
				{Shape: CostShape{Family: sim.CostMixture, CV: 0.3, SlowShare: 0.1, SlowRatio: 8}, Score: -1000},
			},
		},
	}
}

// row is a check row: p99s with a narrow sampling range, CPU and rate.
func row(name string, measuredP99, simulatedP99, measuredCPU, simulatedCPU, measuredRate, simulatedRate float64) CheckRow {
	return CheckRow{Name: name, MeasuredP99: measuredP99, SimulatedP99: simulatedP99,
		MeasuredLo: 0.98 * measuredP99, MeasuredHi: 1.02 * measuredP99, SimulatedLo: 0.98 * simulatedP99, SimulatedHi: 1.02 * simulatedP99,
		MeasuredCPU: measuredCPU, SimulatedCPU: simulatedCPU, MeasuredRate: measuredRate, SimulatedRate: simulatedRate}
}

func TestSuspects_NameTheAssumptionTheDisagreementPointsAt(t *testing.T) {
	service := func(measured, simulated float64) CheckRow {
		r := row("Service (client side)", measured, simulated, math.NaN(), math.NaN(), math.NaN(), math.NaN())
		return r
	}
	cases := []struct {
		name  string
		edit  func(md *Model)
		check Check
		want  []string
		// ordered: the wanted suspects come in this order.
		ordered bool
	}{
		{
			name:  "a lightly loaded group's latency: the cost distribution",
			check: Check{Groups: []CheckRow{row("fast", 40, 20, 1, 1, 200, 200), row("slow", 80, 80, 1.6, 1.6, 160, 160)}, Service: service(60, 60)},
			want:  []string{"the request-cost distribution: a mixture", "the next best family, gamma with CV 1.20, scored 50 below it", "statsHistogramBuckets"},
		},
		{
			name:  "a loaded group queueing more than simulated: the concurrency",
			check: Check{Groups: []CheckRow{row("fast", 20, 20, 1, 1, 200, 200), row("slow", 200, 80, 1.6, 1.6, 160, 160)}, Service: service(60, 60)},
			want:  []string{"the pods' concurrency: group slow, at 80% of its CPU", "Set workers"},
		},
		{
			name:  "a group sent another share: the balancer",
			check: Check{Groups: []CheckRow{row("fast", 20, 20, 1, 0.8, 200, 160), row("slow", 200, 80, 1.6, 1.9, 160, 200)}, Service: service(60, 60)},
			want:  []string{"the split of requests between groups: the model sends group fast 160.0 rps where it served 200.0 (-20%)", "pass --kubeconfig"},
		},
		{
			name:  "only the client side: network, workers, balancer",
			check: Check{Groups: []CheckRow{row("fast", 20, 20, 1, 1, 200, 200), row("slow", 80, 80, 1.6, 1.6, 160, 160)}, Service: service(60, 90)},
			want:  []string{"the clients: every group's latency agrees but the client side is simulated higher (+50%)", "clients.workers"},
		},
		{
			name:  "a changing group's CPU: the speed steps",
			edit:  func(md *Model) { md.Groups[1].SpeedSteps = []SpeedStep{{0, 0.5}, {5 * time.Minute, 0.3}} },
			check: Check{Groups: []CheckRow{row("fast", 20, 20, 1, 1, 200, 200), row("slow", 80, 80, 1.6, 1.2, 160, 160)}, Service: service(60, 60)},
			want:  []string{"group slow's speed changed during the window (0.500 from 0s, 0.300 from 5m0s)"},
		},
		{
			name: "bursts within steps: the load's resolution first",
			edit: func(md *Model) {
				md.Step = 30 * time.Second
				md.Scenario.Load = sim.Load{RPS: 200, Phases: []sim.Phase{{At: sim.Duration{Duration: time.Minute}, RPS: 400}, {At: sim.Duration{Duration: 90 * time.Second}, RPS: 200}, {At: sim.Duration{Duration: 3 * time.Minute}, RPS: 400}, {At: sim.Duration{Duration: 210 * time.Second}, RPS: 200}}}
			},
			check:   Check{Groups: []CheckRow{row("fast", 20, 20, 1, 1, 200, 200), row("slow", 200, 80, 1.6, 1.6, 160, 160)}, Service: service(60, 60)},
			want:    []string{"the pods' concurrency", "the load's resolution: the Service's rate jumps by more than 30% of its mean between 4 pairs of 30s steps"},
			ordered: true,
		},
		{
			name:  "a group that served part of the window: its replicas",
			edit:  func(md *Model) { md.Groups[0].MeanPods = 1.2 },
			check: Check{Groups: []CheckRow{row("fast", 20, 20, 1, 1.5, 200, 200), row("slow", 80, 80, 1.6, 1.6, 160, 160)}, Service: service(60, 60)},
			want:  []string{"group fast's pods did not all serve the whole window (1.2 on average of 2)"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			md := suspectsModel()
			if tc.edit != nil {
				tc.edit(md)
			}
			got := strings.Join(md.suspects(&tc.check), "\n")
			last := -1
			for _, want := range tc.want {
				at := strings.Index(got, want)
				if at < 0 {
					t.Errorf("suspects lack %q:\n%s", want, got)
				} else if tc.ordered && at < last {
					t.Errorf("suspect %q comes before the one wanted before it:\n%s", want, got)
				}
				last = at
			}
		})
	}
}

func TestSuspects_NoneWhenTheModelHolds(t *testing.T) {
	md := suspectsModel()
	c := Check{Groups: []CheckRow{row("fast", 20, 20.5, 1, 1.02, 200, 201), row("slow", 80, 79, 1.6, 1.6, 160, 160)}, Service: row("Service (client side)", 60, 61, math.NaN(), math.NaN(), math.NaN(), math.NaN())}
	if got := md.suspects(&c); len(got) != 0 {
		t.Errorf("suspects on a model that holds: %q", got)
	}
}
