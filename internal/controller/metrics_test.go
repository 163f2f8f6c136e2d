package controller

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

func histogramCount(t *testing.T, h interface{ Write(*dto.Metric) error }) uint64 {
	t.Helper()
	m := &dto.Metric{}
	if err := h.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestMetrics_MoveWhenTheirEventsHappen(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	// Mirror: an endpoint change is observed for propagation and costs an endpoints write.
	propagations := histogramCount(t, testMetrics.EndpointPropagation)
	endpointWrites := testutil.ToFloat64(testMetrics.ServiceEntryWrites.WithLabelValues(WriteReasonEndpoints))
	lf.slice("web", "web-x", ready("web-1", "10.20.0.1"), ready("web-2", "10.20.0.2"), ready("web-3", "10.20.0.3"),
		ready("web-4", "10.20.0.4"), ready("web-5", "10.20.0.5"), ready("web-6", "10.20.0.6"), sliceEndpoint{pod: "web-7", ip: "10.20.0.7"})
	lf.eventually("propagation observed", func() error {
		if histogramCount(t, testMetrics.EndpointPropagation) <= propagations {
			return errNotYet
		}
		return nil
	})
	// Removing an endpoint is a write.
	lf.slice("web", "web-x", ready("web-1", "10.20.0.1"), ready("web-2", "10.20.0.2"), ready("web-3", "10.20.0.3"),
		ready("web-4", "10.20.0.4"), ready("web-5", "10.20.0.5"))
	lf.waitForAddresses("web", lf.ips[:5]...)
	// The API server shows the write a moment before the operator, back from the call, counts it.
	lf.eventually("the endpoints write counted", func() error {
		if got := testutil.ToFloat64(testMetrics.ServiceEntryWrites.WithLabelValues(WriteReasonEndpoints)); got <= endpointWrites {
			return fmt.Errorf("endpoints writes %v, was %v", got, endpointWrites)
		}
		return nil
	})
	lf.slice("web", "web-x", ready("web-1", "10.20.0.1"), ready("web-2", "10.20.0.2"), ready("web-3", "10.20.0.3"),
		ready("web-4", "10.20.0.4"), ready("web-5", "10.20.0.5"), ready("web-6", "10.20.0.6"))
	lf.waitForAddresses("web", lf.ips...)

	// Weight cycle: a write, its estimated push, the cycle duration and the last-success stamp.
	weightWrites := testutil.ToFloat64(testMetrics.ServiceEntryWrites.WithLabelValues(WriteReasonWeights))
	lf.load(skewedCores, equalRPS)
	lf.run()
	if got := testutil.ToFloat64(testMetrics.ServiceEntryWrites.WithLabelValues(WriteReasonWeights)); got != weightWrites+1 {
		t.Fatalf("weights writes %v, want %v", got, weightWrites+1)
	}
	if got := testutil.ToFloat64(lf.loop.Cycle.EstimatedPushes); got != 1 {
		t.Fatalf("estimated pushes %v, want 1", got)
	}
	if histogramCount(t, lf.loop.Cycle.CycleDuration) != 1 || testutil.ToFloat64(lf.loop.Cycle.LastSuccess) <= 0 {
		t.Fatal("cycle duration or last-success stamp not recorded")
	}
	// The per-endpoint gauge follows the written weights.
	got := lf.weights()
	for i, ip := range lf.ips {
		l := prometheus.Labels{"namespace": lf.ns, "adaptiveloadbalancer": "web", "pod": fmt.Sprintf("web-%d", i+1), "ip": ip}
		if v := testutil.ToFloat64(testMetrics.EndpointWeights.With(l)); int(v) != got[ip] {
			t.Fatalf("adaptivelb_endpoint_weight%v = %v, ServiceEntry weight %d", l, v, got[ip])
		}
	}
}
