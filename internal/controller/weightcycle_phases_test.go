package controller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

// steppingSource moves the cycle's fake clock by step in every fetch, as a TSDB that took that
// long would: the time must show in the fetch phase and in no other.
type steppingSource struct {
	metrics.Source
	clock     *clocktesting.FakeClock
	namespace string
	step      time.Duration
	calls     int
}

func (s *steppingSource) Fetch(ctx context.Context, req metrics.Request) (metrics.Batch, error) {
	// Only the fixture's own Service's fetch takes time: other tests' AdaptiveLoadBalancers,
	// due on their own schedule, must not move the clock.
	for _, p := range req.Pods {
		if p.Namespace == s.namespace {
			s.calls++
			s.clock.Step(s.step)
			break
		}
	}
	return s.Source.Fetch(ctx, req)
}

var cyclePhases = []string{PhaseGather, PhaseFetch, PhaseEvaluate, PhaseWrite, PhaseStatus}

// phaseObservation is one phase's histogram so far: how many cycles observed it, and their sum.
type phaseObservation struct {
	count uint64
	sum   time.Duration
}

func phaseObservations(t *testing.T, c *CycleMetrics) map[string]phaseObservation {
	t.Helper()
	out := map[string]phaseObservation{}
	for _, p := range cyclePhases {
		m := &dto.Metric{}
		if err := c.PhaseDuration.WithLabelValues(p).(prometheus.Histogram).Write(m); err != nil {
			t.Fatal(err)
		}
		out[p] = phaseObservation{count: m.GetHistogram().GetSampleCount(), sum: time.Duration(m.GetHistogram().GetSampleSum() * float64(time.Second))}
	}
	return out
}

// checkPhaseCounts fails unless each phase was observed want[phase] times (0 when absent).
func checkPhaseCounts(t *testing.T, when string, got map[string]phaseObservation, want map[string]uint64) {
	t.Helper()
	for _, p := range cyclePhases {
		if got[p].count != want[p] {
			t.Errorf("%s: phase %s observed %d times, want %d", when, p, got[p].count, want[p])
		}
	}
}

// runWithNothingDue runs cycles at the current instant until one has nothing due (another
// test's AdaptiveLoadBalancer may just have become due; once run it is not due again at the
// same instant) and returns how many times that cycle observed each phase.
func (lf *loopFixture) runWithNothingDue(t *testing.T) map[string]phaseObservation {
	t.Helper()
	for range 10 {
		before := phaseObservations(t, lf.loop.Cycle)
		rep := lf.run()
		if rep.Due > 0 {
			continue
		}
		after := phaseObservations(t, lf.loop.Cycle)
		delta := map[string]phaseObservation{}
		for _, p := range cyclePhases {
			delta[p] = phaseObservation{count: after[p].count - before[p].count, sum: after[p].sum - before[p].sum}
		}
		return delta
	}
	t.Fatal("every one of 10 cycles at the same instant had a Service due")
	return nil
}

// The phases of a cycle are observed once per cycle that goes through them, on the cycle's own
// clock, each with the time spent in it: a cycle with a Service due goes through all five; one
// with nothing due only gathers; one whose only target is Frozen gathers and writes its status.
func TestWeightCycle_ObservesEachPhaseItGoesThroughOnce(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	slowTSDB := &steppingSource{Source: lf.loop.Source, clock: lf.clock, namespace: lf.ns, step: 2 * time.Second}
	lf.loop.Source = slowTSDB
	lf.load(skewedCores, equalRPS)

	// A Service due: every phase once, and the TSDB's time in fetch only (the fake clock moves
	// nowhere else).
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("first cycle: %d writes of web (%+v): the scenario needs web due and written", lf.wrote(rep), rep.Outcomes[lf.key()])
	}
	got := phaseObservations(t, lf.loop.Cycle)
	checkPhaseCounts(t, "a cycle with a Service due", got, map[string]uint64{PhaseGather: 1, PhaseFetch: 1, PhaseEvaluate: 1, PhaseWrite: 1, PhaseStatus: 1})
	if want := time.Duration(slowTSDB.calls) * slowTSDB.step; slowTSDB.calls == 0 || got[PhaseFetch].sum != want {
		t.Errorf("fetch phase %s after %d fetches of %s each, want %s", got[PhaseFetch].sum, slowTSDB.calls, slowTSDB.step, want)
	}
	for _, p := range []string{PhaseGather, PhaseEvaluate, PhaseWrite, PhaseStatus} {
		if got[p].sum != 0 {
			t.Errorf("phase %s took %s on a clock that moved only in the fetch", p, got[p].sum)
		}
	}

	// Nothing due a second later (the interval is 5 s, the fetch took 2): only the gather.
	lf.clock.Step(time.Second)
	checkPhaseCounts(t, "a cycle with nothing due", lf.runWithNothingDue(t), map[string]uint64{PhaseGather: 1})

	// Frozen: nothing to fetch, evaluate or write, but a status to write (every cycle).
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeFrozen })
	lf.clock.Step(loopInterval)
	checkPhaseCounts(t, "a cycle with web Frozen and nothing due", lf.runWithNothingDue(t), map[string]uint64{PhaseGather: 1, PhaseStatus: 1})
}
