package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

// With --tsdb-latency-offset=0s the cycle reads what a stock VictoriaMetrics has up to now:
// samples stamped at the wall clock are fresh at a 5 s interval (stale after 10 s), where without
// the argument every pod is stale (TestWeightCycle_ReportsStaleMetrics), and the weights follow
// them.
func TestWeightCycle_ReadsTheNewestDataWithLatencyOffset(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	src, err := metrics.New(metrics.Config{URL: lf.vm.URL, LatencyOffset: ptrTo(time.Duration(0))}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lf.loop.Source = src
	lf.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	lf.loop.Clock = lf.clock
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; lf.wrote(rep) == 0 || !o.Decision.Changed {
		t.Fatalf("samples up to now should steer the weights at a 5s interval: %+v", o)
	}
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)
}
