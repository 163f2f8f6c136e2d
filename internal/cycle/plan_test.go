package cycle

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const interval = 30 * time.Second

// skewed returns endpoints where the last one costs 3x more per request, at the given weights.
func skewed(current ...int) []weights.Endpoint {
	eps := make([]weights.Endpoint, len(current))
	for i, w := range current {
		cpu := 0.5
		if i == len(current)-1 {
			cpu = 1.5
		}
		eps[i] = weights.Endpoint{ID: fmt.Sprintf("pod-%d", i), CPUCores: cpu, RequestRate: 100, CPULimitCores: 2, HasMetrics: true, CurrentWeight: w}
	}
	return eps
}

func target(key string, eps []weights.Endpoint) Target {
	s := weights.DefaultSettings(weights.AlgorithmCapacity)
	s.Capacity.PlanningLoadFactor = 1 // hand-computed converged states assume the load as seen
	return Target{Key: key, Endpoints: eps, Settings: s, HoldTime: 5 * interval}
}

func TestPlan_WritesOnlyRealChanges(t *testing.T) {
	targets := []Target{
		target("ns/skewed", skewed(100, 100, 100)),
		// Converged: capacities 900, 900, 400, 400 rps already serve their target shares
		// 3:3:1:1 at weights 3:3:1:1, so the engine keeps the weights.
		target("ns/converged", []weights.Endpoint{
			{ID: "a", CPUCores: 1200.0 / 900, RequestRate: 600, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 300},
			{ID: "b", CPUCores: 1200.0 / 900, RequestRate: 600, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 300},
			{ID: "c", CPUCores: 1, RequestRate: 200, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 100},
			{ID: "d", CPUCores: 1, RequestRate: 200, CPULimitCores: 2, HasMetrics: true, CurrentWeight: 100},
		}),
	}
	outs, states := Plan(t0, targets, nil, 0)
	if outs[0].Action != ActionWrite {
		t.Fatalf("skewed target: action %s, want Write (%s)", outs[0].Action, outs[0].Reason)
	}
	if outs[1].Action != ActionNone {
		t.Fatalf("converged target: action %s, want None (%s)", outs[1].Action, outs[1].Reason)
	}
	if !states["ns/skewed"].LastGoodMetrics.Equal(t0) {
		t.Fatal("a successful cycle must record when metrics were last good")
	}
}

func TestPlan_DryRunNeverWrites(t *testing.T) {
	tg := target("ns/dry", skewed(100, 100, 100))
	tg.DryRun = true
	outs, _ := Plan(t0, []Target{tg}, nil, 0)
	if outs[0].Action != ActionDryRun {
		t.Fatalf("action %s, want DryRun", outs[0].Action)
	}
	if !outs[0].Decision.Changed {
		t.Fatal("dry run must still compute the weights it would write")
	}
}

func TestPlan_MetricsOutageHoldsThenFallsBack(t *testing.T) {
	outage := errors.New("connection refused")
	tg := target("ns/svc", skewed(120, 120, 40))
	states := map[string]State{"ns/svc": {LastGoodMetrics: t0}}

	tg.MetricsErr = outage
	steps := []struct {
		at          time.Duration
		wantAction  Action
		wantStarted bool
	}{
		{1 * interval, ActionHold, false},
		{4 * interval, ActionHold, false},
		{5 * interval, ActionWrite, true}, // hold time ran out: reset to equal
		{6 * interval, ActionNone, false}, // already equal: nothing more to write
	}
	for _, step := range steps {
		outs, next := Plan(t0.Add(step.at), []Target{tg}, states, 0)
		o := outs[0]
		if o.Action != step.wantAction || o.FallbackStarted != step.wantStarted {
			t.Fatalf("at %v: action %s started %v, want %s started %v (%s)", step.at, o.Action, o.FallbackStarted, step.wantAction, step.wantStarted, o.Reason)
		}
		if o.Action == ActionHold {
			for i, r := range o.Decision.Endpoints {
				if r.Weight != tg.Endpoints[i].CurrentWeight {
					t.Fatalf("at %v: held weight %d, want the current %d", step.at, r.Weight, tg.Endpoints[i].CurrentWeight)
				}
			}
		}
		if o.Action == ActionWrite {
			for _, r := range o.Decision.Endpoints {
				if r.Weight != 100 {
					t.Fatalf("fallback weight %d, want the equal default 100", r.Weight)
				}
			}
			if !strings.Contains(o.Reason, "connection refused") {
				t.Fatalf("fallback reason %q must carry the metrics error", o.Reason)
			}
			// The operator wrote them: the next cycle sees equal weights applied.
			for i := range tg.Endpoints {
				tg.Endpoints[i].CurrentWeight = 100
			}
		}
		states = next
	}
	// Metrics return: the loop resumes and reports the recovery.
	tg.MetricsErr = nil
	outs, next := Plan(t0.Add(7*interval), []Target{tg}, states, 0)
	if !outs[0].Recovered || outs[0].Action != ActionWrite {
		t.Fatalf("after recovery: action %s recovered %v, want Write and recovered", outs[0].Action, outs[0].Recovered)
	}
	if next["ns/svc"].FallenBack {
		t.Fatal("state still fallen back after metrics returned")
	}
}

func TestPlan_MetricsThatNeverWorkedFallBackAtOnce(t *testing.T) {
	tg := target("ns/svc", skewed(120, 120, 40))
	tg.MetricsErr = errors.New("no data")
	outs, _ := Plan(t0, []Target{tg}, nil, 0)
	if !outs[0].Fallback || !outs[0].FallbackStarted {
		t.Fatalf("want an immediate fallback, got %+v", outs[0])
	}
}

func TestPlan_BudgetServesLargestNeedFirstAndCarriesOver(t *testing.T) {
	// Fifty targets whose slow pod is more and more mis-weighted; budget 10.
	var targets []Target
	for i := 0; i < 50; i++ {
		// The slow pod's current weight ranges from 100 (far from its target) to 51.
		targets = append(targets, target(fmt.Sprintf("ns/svc-%02d", i), skewed(100, 100, 100-i)))
	}
	states := map[string]State{}
	served := map[string]int{}
	for cycle := 0; cycle < 5; cycle++ {
		outs, next := Plan(t0.Add(time.Duration(cycle)*interval), targets, states, 10)
		writes := 0
		for _, o := range outs {
			if o.Action == ActionWrite {
				writes++
				served[o.Key] = cycle
			}
		}
		if writes != 10 {
			t.Fatalf("cycle %d: %d writes, want exactly the budget 10", cycle, writes)
		}
		for _, o := range outs {
			if o.Action == ActionNone && served[o.Key] != cycle && cycle > 0 {
				if _, ok := served[o.Key]; !ok {
					t.Fatalf("cycle %d: %s needs no write but was never served", cycle, o.Key)
				}
			}
		}
		// Writes go to the largest needs; every deferred need is at most the smallest written.
		minWritten := math.Inf(1)
		for _, o := range outs {
			if o.Action == ActionWrite {
				minWritten = math.Min(minWritten, o.Need)
			}
		}
		for _, o := range outs {
			if o.Action == ActionDeferred && o.Need > minWritten {
				t.Fatalf("cycle %d: deferred %s with need %.3f above a written need %.3f", cycle, o.Key, o.Need, minWritten)
			}
		}
		// The operator applies this cycle's writes and traffic follows: each pod now serves in
		// proportion to its weight at equal utilization, so the target has converged.
		for i, o := range outs {
			if o.Action == ActionWrite {
				for j, r := range o.Decision.Endpoints {
					targets[i].Endpoints[j].CurrentWeight = r.Weight
					targets[i].Endpoints[j].CPUCores = 1
					targets[i].Endpoints[j].RequestRate = float64(r.Weight)
				}
			}
		}
		states = next
	}
	if len(served) != 50 {
		t.Fatalf("%d of 50 targets served in 5 cycles of budget 10; the rest starved", len(served))
	}
	if served["ns/svc-00"] != 0 {
		t.Fatalf("the most mis-weighted target was served in cycle %d, want 0", served["ns/svc-00"])
	}
}

func TestPlan_EngineErrorLeavesTargetAlone(t *testing.T) {
	tg := target("ns/bad", skewed(100, 100))
	tg.Settings.MinWeight = 0
	outs, _ := Plan(t0, []Target{tg}, nil, 0)
	if outs[0].Err == nil || outs[0].Action != ActionNone {
		t.Fatalf("want an error and no action, got %+v", outs[0])
	}
}

func TestPlan_CarriedOverWritesGoBeforeNewOnes(t *testing.T) {
	small := target("ns/small", skewed(100, 100, 90))  // small need
	large := target("ns/large", skewed(100, 100, 100)) // first step: large need
	// Cycle 0: budget 1 and a competitor with a larger need, so the small one is deferred.
	competitor := target("ns/competitor", skewed(100, 100, 100))
	outs, states := Plan(t0, []Target{small, competitor}, nil, 1)
	if outs[0].Action != ActionDeferred || outs[1].Action != ActionWrite {
		t.Fatalf("cycle 0: small %s, competitor %s; want Deferred, Write", outs[0].Action, outs[1].Action)
	}
	if !states["ns/small"].DeferredSince.Equal(t0) {
		t.Fatal("deferral time not recorded")
	}
	// Cycle 1: a new target with a larger need arrives; the carried-over one still goes first.
	outs, states = Plan(t0.Add(interval), []Target{small, large}, states, 1)
	if outs[0].Action != ActionWrite || outs[1].Action != ActionDeferred {
		t.Fatalf("cycle 1: small %s, large %s; want Write, Deferred", outs[0].Action, outs[1].Action)
	}
	if !states["ns/small"].DeferredSince.IsZero() {
		t.Fatal("a served target must clear its deferral")
	}
	if !strings.Contains(outs[1].Reason, "write budget of 1 ServiceEntry objects per cycle spent") {
		t.Fatalf("deferral reason %q does not explain the budget", outs[1].Reason)
	}
}

// Issue 15.2: an endpoint without usable metrics gets neither the engine's median of all
// endpoints nor equal weights: a known one keeps its weight, a new one takes the median of its
// instance type's endpoints with metrics, and without such peers keeps what the mirror gave it.
func TestPlan_EndpointsWithoutMetricsFollowThePeerRule(t *testing.T) {
	fast := func(id string, w int) weights.Endpoint {
		return weights.Endpoint{ID: id, CPUCores: 0.5, RequestRate: 100, CPULimitCores: 2, HasMetrics: true, CurrentWeight: w}
	}
	slow := func(id string, w int) weights.Endpoint {
		return weights.Endpoint{ID: id, CPUCores: 1.5, RequestRate: 100, CPULimitCores: 2, HasMetrics: true, CurrentWeight: w}
	}
	missing := func(id string, w int) weights.Endpoint {
		return weights.Endpoint{ID: id, CPULimitCores: 2, CurrentWeight: w}
	}
	groups := map[string]string{"f1": "fast", "f2": "fast", "f3": "fast", "s1": "slow", "s2": "slow", "s-new": "slow"}

	t.Run("a known slow endpoint keeps its last weight", func(t *testing.T) {
		tg := target("ns/svc", []weights.Endpoint{fast("f1", 100), fast("f2", 100), fast("f3", 100), slow("s1", 30), missing("s2", 30)})
		tg.PeerGroups, tg.Known = groups, map[string]bool{"s2": true}
		outs, _ := Plan(t0, []Target{tg}, nil, 0)
		if r := outs[0].Decision.Endpoints[4]; r.Weight != 30 || r.Reason != ReasonNoMetricsKept {
			t.Fatalf("s2: %+v, want weight 30 kept", r)
		}
	})
	t.Run("a new slow endpoint takes its instance type's median", func(t *testing.T) {
		tg := target("ns/svc", []weights.Endpoint{fast("f1", 100), fast("f2", 100), fast("f3", 100), slow("s1", 30), missing("s-new", 60)})
		tg.PeerGroups = groups
		outs, _ := Plan(t0, []Target{tg}, nil, 0)
		d := outs[0].Decision
		if r := d.Endpoints[4]; r.Weight != d.Endpoints[3].Weight || r.Reason != ReasonNoMetricsPeers {
			t.Fatalf("s-new: %+v, want s1's decided weight %d", r, d.Endpoints[3].Weight)
		}
	})
	t.Run("without a peer of its type an endpoint keeps the mirror's weight", func(t *testing.T) {
		tg := target("ns/svc", []weights.Endpoint{fast("f1", 100), fast("f2", 100), fast("f3", 100), slow("s1", 30), missing("odd", 45)})
		tg.PeerGroups = groups
		outs, _ := Plan(t0, []Target{tg}, nil, 0)
		if r := outs[0].Decision.Endpoints[4]; r.Weight != 45 || r.Reason != ReasonNoMetricsNoPeers {
			t.Fatalf("odd: %+v, want 45 kept", r)
		}
	})
	t.Run("fewer than two endpoints with metrics keep every weight", func(t *testing.T) {
		tg := target("ns/svc", []weights.Endpoint{fast("f1", 100), missing("f2", 120), missing("s1", 30)})
		outs, _ := Plan(t0, []Target{tg}, nil, 0)
		if outs[0].Action != ActionNone {
			t.Fatalf("action %s (%s), want None: nothing justifies a change", outs[0].Action, outs[0].Reason)
		}
	})
}

// Plan decides the targets on several goroutines; each outcome and state must be the one its
// own target gets when decided alone, in input order, whatever order the workers ran in.
func TestPlan_ConcurrentDecisionsEqualOneByOne(t *testing.T) {
	var targets []Target
	for i := range 40 {
		eps := skewed(100, 100, 100+i)
		for j := range eps {
			eps[j].RequestRate = 50 + float64(7*i+3*j)
		}
		tg := target(fmt.Sprintf("ns/svc-%d", i), eps)
		tg.Settings = weights.DefaultSettings(weights.AlgorithmTail)
		if i%5 == 0 {
			tg.Settings = weights.DefaultSettings(weights.AlgorithmCapacity)
		}
		targets = append(targets, tg)
	}
	outs, states := Plan(t0, targets, nil, 0)
	if len(outs) != len(targets) || len(states) != len(targets) {
		t.Fatalf("got %d outcomes and %d states for %d targets", len(outs), len(states), len(targets))
	}
	for i, tg := range targets {
		want, wantState := decide(t0, tg, State{})
		if outs[i].Key != tg.Key || outs[i].Action != want.Action || outs[i].Reason != want.Reason ||
			fmt.Sprint(outs[i].Decision.Weights()) != fmt.Sprint(want.Decision.Weights()) {
			t.Fatalf("target %s: concurrent plan gave %s %v (%s), alone it gets %s %v (%s)", tg.Key,
				outs[i].Action, outs[i].Decision.Weights(), outs[i].Reason, want.Action, want.Decision.Weights(), want.Reason)
		}
		if states[tg.Key] != wantState {
			t.Fatalf("target %s: concurrent state %+v, alone %+v", tg.Key, states[tg.Key], wantState)
		}
	}
}

func TestPlan_TailWritePromisingTooLittleGainIsNotWrittenByAnyLeader(t *testing.T) {
	// Four alike pods at a tenth of their capacity, one with twice its peers' weight and
	// traffic: evening it out is outside the dead band but gains the p99 nothing. The decision
	// rests on the applied weights and this window's rates only, so a new leader with no
	// remembered state decides the same.
	var eps []weights.Endpoint
	for i, r := range []float64{16, 8, 8, 8} {
		w := 100
		if i == 0 {
			w = 200
		}
		eps = append(eps, weights.Endpoint{ID: fmt.Sprintf("pod-%d", i), CPUCores: r * 0.010, RequestRate: r, CPULimitCores: 1, NodeCPUCores: 4, HasMetrics: true, CurrentWeight: w})
	}
	tgt := Target{Key: "ns/quiet", Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmTail), HoldTime: 5 * interval,
		WindowCoverage: 1, WindowSeconds: 60, RecentPeakRequestRate: 40}
	for _, states := range []map[string]State{nil, {"ns/quiet": {LastGoodMetrics: t0.Add(-interval)}}} {
		outs, _ := Plan(t0, []Target{tgt}, states, 0)
		if outs[0].Action != ActionNone || outs[0].Reason != weights.ReasonGainTooSmall {
			t.Fatalf("state %v: action %s reason %q, want None: %q", states, outs[0].Action, outs[0].Reason, weights.ReasonGainTooSmall)
		}
	}
}

// Issue 21.4: a fallback to equal weights is failing open, the safe direction; it is never
// deferred by the write budget (at 10,000 Services and 50 writes per 5 s tick, a cluster-wide
// TSDB outage would otherwise take 17 minutes beyond the hold time to reach the last Service).
// Fallbacks count against the budget: the other writes get what they leave.
func TestPlan_FallbacksJumpTheBudget(t *testing.T) {
	outage := errors.New("connection refused")
	var targets []Target
	states := map[string]State{}
	for i := range 3 {
		tg := target(fmt.Sprintf("ns/down-%d", i), skewed(120, 120, 40))
		tg.MetricsErr = outage
		targets = append(targets, tg)
		states[tg.Key] = State{LastGoodMetrics: t0.Add(-10 * interval)} // past the hold time
	}
	targets = append(targets, target("ns/adapting", skewed(100, 100, 100)))
	outs, next := Plan(t0, targets, states, 2)
	for _, o := range outs[:3] {
		if o.Action != ActionWrite || !o.Fallback || !o.FallbackStarted {
			t.Errorf("%s: %s (fallback %v): a fallback must be written whatever the budget: %s", o.Key, o.Action, o.Fallback, o.Reason)
		}
		if !next[o.Key].FallenBack || !next[o.Key].DeferredSince.IsZero() {
			t.Errorf("%s: state %+v after its fallback write", o.Key, next[o.Key])
		}
	}
	if o := outs[3]; o.Action != ActionDeferred {
		t.Errorf("%s: %s, want Deferred: three fallbacks spent a budget of 2 (%s)", o.Key, o.Action, o.Reason)
	}
}

// Issue 21.4, at scale: a TSDB outage across 10,000 Services fails every one of them open in the
// first cycle after the hold time, whatever the write budget (50); before, the budget let 50
// fallbacks out per 5 s tick, 200 ticks (17 minutes) for the last.
func TestPlan_AClusterWideOutageFailsOpenInOneCycle(t *testing.T) {
	const services, budget = 10_000, 50
	outage := errors.New("connection refused")
	targets := make([]Target, services)
	states := make(map[string]State, services)
	for i := range targets {
		targets[i] = target(fmt.Sprintf("ns/svc-%05d", i), skewed(120, 120, 40))
		targets[i].MetricsErr = outage
		states[targets[i].Key] = State{LastGoodMetrics: t0.Add(-10 * interval)}
	}
	outs, _ := Plan(t0, targets, states, budget)
	writes := 0
	for _, o := range outs {
		if o.Action == ActionWrite && o.Fallback {
			writes++
		}
	}
	if writes != services {
		t.Fatalf("%d of %d Services fail open in the first cycle after the hold time", writes, services)
	}
}

// hotTarget is a tail target whose fast pods the weights loaded to 98% of their limit, with a
// p99 forty times their cost, while the slow pods run at 75% with a p99 of three times theirs.
func hotTarget(key string) Target {
	var eps []weights.Endpoint
	for i := range 6 {
		eps = append(eps, weights.Endpoint{ID: fmt.Sprintf("fast-%d", i), CPUCores: 1.95, RequestRate: 390, CPULimitCores: 2, NodeCPUCores: 8, HasMetrics: true, CurrentWeight: 200, LatencyP99Seconds: 0.2})
		eps = append(eps, weights.Endpoint{ID: fmt.Sprintf("slow-%d", i), CPUCores: 1.5, RequestRate: 150, CPULimitCores: 2, NodeCPUCores: 8, HasMetrics: true, CurrentWeight: 50, LatencyP99Seconds: 0.03})
	}
	return Target{Key: key, Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmTail), HoldTime: 5 * interval, WindowCoverage: 1, WindowSeconds: 60, RecentPeakRequestRate: 3240}
}

func TestPlan_AnOverruledModelsReliefJumpsTheBudget(t *testing.T) {
	targets := []Target{target("ns/a-adapting", skewed(100, 100, 100)), target("ns/b-adapting", skewed(100, 100, 100)), hotTarget("ns/z-hot")}
	outs, next := Plan(t0, targets, map[string]State{}, 1)
	hot := outs[2]
	if hot.Action != ActionWrite || hot.Decision.ModelOverruled == "" {
		t.Fatalf("%s: %s (overruled %q): the relief of a group at its limit must be written whatever the budget: %s", hot.Key, hot.Action, hot.Decision.ModelOverruled, hot.Reason)
	}
	if next[hot.Key].ModelDistrust != 1 {
		t.Fatalf("state after the overrule: %+v, want ModelDistrust 1 carried to the next cycle", next[hot.Key])
	}
	for _, o := range outs[:2] {
		if o.Action != ActionDeferred {
			t.Errorf("%s: %s, want Deferred: the relief spent the budget of 1 (%s)", o.Key, o.Action, o.Reason)
		}
	}
}

func TestPlan_DryRunDoesNotJudgeTheModel(t *testing.T) {
	tg := hotTarget("ns/dry")
	tg.DryRun = true
	outs, next := Plan(t0, []Target{tg}, map[string]State{}, 0)
	if outs[0].Action != ActionDryRun {
		t.Fatalf("%s: %s", outs[0].Action, outs[0].Reason)
	}
	if d := next[tg.Key].ModelDistrust; d != 0 {
		t.Fatalf("ModelDistrust %v after a DryRun cycle, want 0: the split measured is the mirror's, not the model's", d)
	}
}

func TestPlan_TheModelsDistrustIsCarriedIntoTheNextDecision(t *testing.T) {
	// A calm window after an overrule: the distrust the planner remembered fades by one step,
	// instead of starting again from full trust.
	tg := hotTarget("ns/calm")
	for i := range tg.Endpoints {
		e := &tg.Endpoints[i]
		e.CPUCores, e.RequestRate, e.LatencyP99Seconds = e.CPUCores/2, e.RequestRate/2, 0.02
	}
	tg.RecentPeakRequestRate = 1620 // a settled load
	_, next := Plan(t0, []Target{tg}, map[string]State{tg.Key: {LastGoodMetrics: t0.Add(-interval), ModelDistrust: 1}}, 0)
	if got := next[tg.Key].ModelDistrust; got != 0.75 {
		t.Fatalf("ModelDistrust after a calm window = %v, want 0.75", got)
	}
}

// A cycle that measures fewer than two endpoints (a scrape gap, every pod but one idle) or none
// at all says nothing about the model: the distrust the last overrule left is carried on, into
// the next cycle and into the decision the status (status.modelCheck) and a new leader read,
// instead of falling back to full trust in the model the measurement overruled.
func TestPlan_ACycleThatMeasuresTooFewEndpointsKeepsTheModelsDistrust(t *testing.T) {
	oneMeasured := hotTarget("ns/one-measured")
	for i := 1; i < len(oneMeasured.Endpoints); i++ {
		oneMeasured.Endpoints[i].HasMetrics = false
	}
	noEndpoints := hotTarget("ns/no-endpoints")
	noEndpoints.Endpoints = nil
	for _, tg := range []Target{oneMeasured, noEndpoints} {
		outs, next := Plan(t0, []Target{tg}, map[string]State{tg.Key: {LastGoodMetrics: t0.Add(-interval), ModelDistrust: 0.75}}, 0)
		if outs[0].Err != nil {
			t.Fatalf("%s: %v", tg.Key, outs[0].Err)
		}
		if got := next[tg.Key].ModelDistrust; got != 0.75 {
			t.Errorf("%s: ModelDistrust carried to the next cycle = %v, want 0.75 (%s)", tg.Key, got, outs[0].Reason)
		}
		if got := outs[0].Decision.ModelDistrust; got != 0.75 {
			t.Errorf("%s: the decision's ModelDistrust (status.modelCheck) = %v, want 0.75", tg.Key, got)
		}
	}
}

// The reliefs written since the last cycle were urgent writes, never held for the budget; they
// count against it as a plan's own urgent writes do, so the other writes get what they left,
// and an urgent write of this cycle still goes out when they spent it all.
func TestPlanAfterUrgent_ReliefsSinceTheLastCycleCountAgainstTheBudget(t *testing.T) {
	targets := []Target{target("ns/a-adapting", skewed(100, 100, 100)), target("ns/b-adapting", skewed(100, 100, 100)), hotTarget("ns/z-hot")}
	for spent, wantWrites := range map[int]int{0: 2, 1: 1, 2: 0, 5: 0} {
		outs, _ := PlanAfterUrgent(t0, targets, map[string]State{}, 3, spent)
		writes := 0
		for _, o := range outs[:2] {
			if o.Action == ActionWrite {
				writes++
			}
		}
		if writes != wantWrites {
			t.Errorf("%d reliefs since the last cycle, budget 3, one urgent write: %d other writes, want %d", spent, writes, wantWrites)
		}
		if hot := outs[2]; hot.Action != ActionWrite {
			t.Errorf("%d reliefs since the last cycle: the overruled model's relief is %s, want Write whatever the budget", spent, hot.Action)
		}
	}
	// Without a budget nothing is deferred, however many reliefs went out.
	outs, _ := PlanAfterUrgent(t0, targets, map[string]State{}, 0, 10)
	for _, o := range outs {
		if o.Action != ActionWrite {
			t.Errorf("%s: %s with no budget", o.Key, o.Action)
		}
	}
}

// The surge bound learned from the Service's history, and the history, reach the engine: the
// same tail target at low load decides differently with no bound (1) than with the default (4).
func TestPlan_TheLearnedSurgeBoundAndLoadHistoryReachTheEngine(t *testing.T) {
	tg := hotTarget("ns/quiet")
	for i := range tg.Endpoints {
		e := &tg.Endpoints[i]
		e.CPUCores, e.RequestRate, e.LatencyP99Seconds = e.CPUCores/5, e.RequestRate/5, 0.01
	}
	tg.RecentPeakRequestRate = 3240.0 / 5
	decide := func(surge float64, history weights.LoadHistory) weights.Decision {
		t.Helper()
		tg := tg
		tg.SurgeFactor, tg.LoadHistory = surge, history
		outs, _ := Plan(t0, []Target{tg}, map[string]State{}, 0)
		if outs[0].Err != nil {
			t.Fatal(outs[0].Err)
		}
		want, err := weights.Compute(weights.Input{Endpoints: tg.Endpoints, WindowCoverage: 1, WindowSeconds: 60, RecentPeakRequestRate: tg.RecentPeakRequestRate, SurgeFactor: surge, LoadHistory: history}, tg.Settings)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(outs[0].Decision.Weights()) != fmt.Sprint(want.Weights()) {
			t.Fatalf("surge %v: the plan decided %v, the engine with the same input %v", surge, outs[0].Decision.Weights(), want.Weights())
		}
		return outs[0].Decision
	}
	history := weights.LoadHistory{MaxRise: 1.05, Seconds: 3 * 86400, Samples: 25000}
	unbound, bound := decide(1, history), decide(0, weights.LoadHistory{})
	if fmt.Sprint(unbound.Weights()) == fmt.Sprint(bound.Weights()) {
		t.Fatalf("the same weights with no surge bound and with the default bound: %v", bound.Weights())
	}
}

// sliced spreads a skewed Service of n endpoints over ServiceEntry slices of per endpoints.
func sliced(key string, n, per int) Target {
	current := make([]int, n)
	for i := range current {
		current[i] = 100
	}
	t := target(key, skewed(current...))
	t.Slices = map[string]int{}
	for i, e := range t.Endpoints {
		t.Slices[e.ID] = i / per
		if i%per == per-1 {
			t.Endpoints[i].CPUCores = 1.5 // one slow pod in each slice: every slice's weights move
		}
	}
	return t
}

// Issue 31: the write budget counts the ServiceEntry objects a write patches, not Services: a
// Service whose weights change in three slices spends three, and one larger than the whole budget
// is written alone once it is the first of the cycle's writes, so that it is written at all.
func TestPlan_TheBudgetCountsServiceEntryObjects(t *testing.T) {
	three := sliced("ns/a-three-slices", 30, 10) // a weight moves in each of three slices
	if outs, _ := Plan(t0, []Target{three}, nil, 0); outs[0].Action != ActionWrite || outs[0].Objects != 3 {
		t.Fatalf("a write moving weights in 3 slices: %s patching %d objects, want Write patching 3", outs[0].Action, outs[0].Objects)
	}
	// Budget 5: three objects, then another three do not fit, a one-object write does.
	outs, states := Plan(t0, []Target{three, sliced("ns/b-three-slices", 30, 10), target("ns/c-one", skewed(100, 100, 100))}, nil, 5)
	if got := []Action{outs[0].Action, outs[1].Action, outs[2].Action}; got[0] != ActionWrite || got[1] != ActionDeferred || got[2] != ActionWrite {
		t.Fatalf("budget 5 for writes of 3, 3 and 1 objects: %v, want Write, Deferred, Write", got)
	}
	if !strings.Contains(outs[1].Reason, "write budget of 5 ServiceEntry objects per cycle spent (this write patches 3)") {
		t.Fatalf("the deferral does not say what the budget counts: %q", outs[1].Reason)
	}
	// A Service larger than the budget waits behind an older write, then goes first, alone.
	big := sliced("ns/big", 1000, 100) // 10 slices
	outs, states = Plan(t0.Add(interval), []Target{big, sliced("ns/b-three-slices", 30, 10)}, states, 5)
	if outs[0].Action != ActionDeferred || outs[1].Action != ActionWrite {
		t.Fatalf("cycle 1: big %s (10 objects), the carried-over write %s; want Deferred, Write", outs[0].Action, outs[1].Action)
	}
	outs, _ = Plan(t0.Add(2*interval), []Target{big, target("ns/c-one", skewed(100, 100, 100))}, states, 5)
	if outs[0].Action != ActionWrite || outs[0].Objects != 10 || outs[1].Action != ActionDeferred {
		t.Fatalf("cycle 2: big %s (%d objects), a one-object write %s; want the big one written alone over the budget", outs[0].Action, outs[0].Objects, outs[1].Action)
	}
}
