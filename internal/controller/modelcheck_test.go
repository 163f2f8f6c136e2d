package controller

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// latencyHistogram imports pod's server-side latency histogram over the last minute, as
// cumulative per-second rates by bound (ms).
func (lf *loopFixture) latencyHistogram(pod string, perSecond map[string]float64) {
	lf.t.Helper()
	now := lf.clock.Now()
	var b strings.Builder
	for le, rate := range perSecond {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace=%q,pod=%q,le=%q}`, lf.ns, pod, le), rate, now.Add(-time.Minute), now, time.Second))
	}
	lf.vm.ImportText(lf.t, b.String())
}

// The tail algorithm's check of its model, end to end: the weights loaded four fast pods to 98% of
// their 2-core limit and their p99 rose to over 40 times their cost, while the two slow pods run at
// 75%. The cycle relieves them at once, says so in WeightsApplied, in status.modelCheck and in an
// event, and a new leader continues from the distrust status recorded.
func TestWeightCycle_AGroupTheWeightsLoadedToItsLimitIsRelievedAndSaysSo(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.withoutSurgeBound()
	// A first cycle sets unequal weights (a first step is never judged: nothing was planned yet).
	lf.load([]float64{0.5, 0.5, 0.5, 0.5, 1, 1}, equalRPS)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("first cycle wrote %d times: %+v", lf.wrote(rep), rep.Outcomes[lf.key()])
	}
	before := lf.weights()
	// Then a whole window in which the fast pods serve 390 rps at 5 ms each and the slow ones
	// 150 rps at 10 ms.
	hotCores := []float64{1.95, 1.95, 1.95, 1.95, 1.5, 1.5}
	hotRPS := []float64{390, 390, 390, 390, 150, 150}
	for range 3 {
		lf.clock.Step(loopInterval)
		lf.load(hotCores, hotRPS)
	}
	for i := 1; i <= 4; i++ { // p99 between 100 and 250 ms
		lf.latencyHistogram(fmt.Sprintf("web-%d", i), map[string]float64{"5": 195, "25": 312, "100": 370, "250": 389, "+Inf": 390})
	}
	for i := 5; i <= 6; i++ { // p99 between 25 and 50 ms
		lf.latencyHistogram(fmt.Sprintf("web-%d", i), map[string]float64{"10": 75, "25": 145, "50": 150, "+Inf": 150})
	}
	rep := lf.run()
	o := rep.Outcomes[lf.key()]
	if o.Action != cycle.ActionWrite || o.Decision.ModelOverruled == "" {
		t.Fatalf("cycle with the fast pods at their limit: %s, overruled %q (%s); want the relief written", o.Action, o.Decision.ModelOverruled, o.Reason)
	}
	after := lf.weights()
	share := func(w map[string]int) float64 {
		var fast, all float64
		for i, ip := range lf.ips {
			all += float64(w[ip])
			if i < 4 {
				fast += float64(w[ip])
			}
		}
		return fast / all
	}
	if share(after) >= share(before) {
		t.Fatalf("the fast pods' share of the weight went %.3f -> %.3f; want it cut (before %v, after %v)", share(before), share(after), before, after)
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonModelOverruled)
	var alb adlbv1.AdaptiveLoadBalancer
	lf.eventually("status.modelCheck", func() error {
		if err := k8s.Get(lf.ctx, lf.key(), &alb); err != nil {
			return err
		}
		mc := alb.Status.ModelCheck
		if mc == nil || mc.Distrust != "1.00" || mc.LastOverrule == nil || !strings.Contains(mc.LastOverruleReason, "of its CPU limit") {
			return fmt.Errorf("modelCheck %+v", mc)
		}
		return nil
	})
	events := lf.drainEvents()
	found := false
	for _, ev := range events {
		found = found || (strings.HasPrefix(ev, corev1.EventTypeNormal+" "+EventModelOverruled) && strings.Contains(ev, "CPU limit"))
	}
	if !found {
		t.Fatalf("events %q: want a %s event naming the group at its CPU limit", events, EventModelOverruled)
	}

	// A new leader plans from the distrust the status recorded, not from a fresh trust.
	if st := seedState(&alb, lf.clock.Now(), loopInterval); st.ModelDistrust != 1 {
		t.Fatalf("a new leader's planner state %+v, want ModelDistrust 1 from status.modelCheck", st)
	}
}

// The projection of a rising rate reaches the engine: the cycles' rates rise by 100 rps per
// interval, so the rate expected when the next weights take over lies above the current one.
func TestWeightCycle_GivesTheEngineTheProjectedRateOfARisingLoad(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	var rep CycleReport
	for step := range 4 {
		rps := make([]float64, 6)
		cores := make([]float64, 6)
		for i := range rps {
			rps[i] = 100 + 20*float64(step)
			cores[i] = rps[i] * skewedCores[i] / 100
		}
		if step > 0 {
			lf.clock.Step(loopInterval)
		}
		lf.load(cores, rps)
		rep = lf.run()
	}
	in := rep.Inputs[lf.key()]
	var current float64
	for _, e := range in.Endpoints {
		current += e.RequestRate
	}
	// The windows' rates rise by 120 rps per 5 s cycle (24 rps/s) over the last three cycles.
	// The horizon: half the 10 s window, no TSDB lag (the samples reach the evaluation time),
	// the next cycle and the push, 5 + 0 + 5 + 1 = 11 s.
	want := current + 24*11
	if math.Abs(in.ProjectedRequestRate-want) > 0.05*want {
		t.Fatalf("projected rate %.1f with the current window at %.1f rps and rising by 24 rps/s; want %.0f within 5%%", in.ProjectedRequestRate, current, want)
	}
}

func TestWindowCoverage_CountsFromTheEndOfTheWindowTheTSDBAnsweredFor(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	window := time.Minute
	for _, tc := range []struct {
		name               string
		dataEnd, lastWrite time.Time
		want               float64
	}{
		{"no write yet", t0, time.Time{}, 1},
		{"a write a whole window before the data's end", t0, t0.Add(-time.Minute), 1},
		{"a write half a window before the data's end", t0, t0.Add(-30 * time.Second), 0.5},
		// A TSDB that answers 30 s in the past: a write 10 s ago is not in the window at all.
		{"a write after the data's end", t0, t0.Add(20 * time.Second), minWindowCoverage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := windowCoverage(tc.dataEnd, tc.lastWrite, window); math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("windowCoverage = %v, want %v", got, tc.want)
			}
		})
	}
}
