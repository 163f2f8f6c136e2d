package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The mirror refreshes the status endpoint list from the ServiceEntry; the weight cycle fills in
// the signals, reasons and (in DryRun) the weights it computed. A refresh must not erase them.
func TestEndpointStatus_RefreshKeepsTheWeightCyclesView(t *testing.T) {
	earlier := metav1.NewTime(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	now := metav1.NewTime(earlier.Add(time.Minute))
	previous := []adlbv1.EndpointStatus{
		{Pod: "a", IP: "10.0.0.1", Weight: 250, Reason: "share from estimated capacity", CPUCores: "0.700", RequestRate: "70.0", LastChange: &earlier},
		{Pod: "b", IP: "10.0.0.2", Weight: 40, Reason: "share from estimated capacity", CPUCores: "0.300", RequestRate: "12.0", LastChange: &earlier},
	}
	mirrored := []istio.Endpoint{ // the ServiceEntry: equal weights in DryRun, a new pod c
		{Pod: "a", IP: "10.0.0.1", Weight: 100}, {Pod: "b", IP: "10.0.0.2", Weight: 100}, {Pod: "c", IP: "10.0.0.3", Weight: 100},
	}

	t.Run("DryRun keeps the computed weights, reasons and signals", func(t *testing.T) {
		got, _ := endpointStatus(previous, mirrored, now, true)
		if got[0].Weight != 250 || got[1].Weight != 40 || got[0].Reason == "" || got[1].CPUCores != "0.300" || !got[0].LastChange.Equal(&earlier) {
			t.Errorf("the refresh replaced the weight cycle's view: %+v", got[:2])
		}
		if got[2].Weight != 100 || got[2].Reason != "" || !got[2].LastChange.Equal(&now) {
			t.Errorf("a new pod should show the ServiceEntry's weight, changed now: %+v", got[2])
		}
	})
	t.Run("Active shows the written weight; a changed weight drops the stale reason", func(t *testing.T) {
		active := []istio.Endpoint{{Pod: "a", IP: "10.0.0.1", Weight: 250}, {Pod: "b", IP: "10.0.0.2", Weight: 55}}
		got, _ := endpointStatus(previous, active, now, false)
		if got[0].Weight != 250 || got[0].RequestRate != "70.0" || !got[0].LastChange.Equal(&earlier) {
			t.Errorf("an unchanged endpoint lost its signals: %+v", got[0])
		}
		if got[1].Weight != 55 || got[1].Reason != "" || !got[1].LastChange.Equal(&now) {
			t.Errorf("a weight written by someone else should show as changed now, without the old reason: %+v", got[1])
		}
	})
	t.Run("a reused IP of another pod starts fresh", func(t *testing.T) {
		got, _ := endpointStatus(previous, []istio.Endpoint{{Pod: "z", IP: "10.0.0.1", Weight: 100}}, now, true)
		if got[0].Weight != 100 || got[0].Reason != "" || got[0].CPUCores != "" {
			t.Errorf("pod z inherited pod a's status: %+v", got[0])
		}
	})
}

// The per-endpoint CPU and request rate change every cycle; written each time they would cost
// one status patch per AdaptiveLoadBalancer per interval. They are refreshed every
// statusSignalsInterval; anything else that changes is written at once.
func TestWeightCycle_StatusSignalsAreThrottled(t *testing.T) {
	w := &WeightCycle{}
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	status := func(cpu string, weight int32) *adlbv1.AdaptiveLoadBalancerStatus {
		return &adlbv1.AdaptiveLoadBalancerStatus{Endpoints: []adlbv1.EndpointStatus{{Pod: "a", IP: "10.0.0.1", Weight: weight, CPUCores: adlbv1.Decimal(cpu)}}}
	}
	if !w.skipStatusWrite(key, status("0.5", 100), status("0.5", 100), t0) {
		t.Error("an unchanged status was written")
	}
	if w.skipStatusWrite(key, status("0.5", 100), status("0.6", 100), t0) {
		t.Error("the first signals were not written")
	}
	if !w.skipStatusWrite(key, status("0.6", 100), status("0.7", 100), t0.Add(time.Minute)) {
		t.Error("signals alone were written again within the interval")
	}
	if w.skipStatusWrite(key, status("0.6", 100), status("0.7", 120), t0.Add(2*time.Minute)) {
		t.Error("a weight change was held back")
	}
	if w.skipStatusWrite(key, status("0.7", 120), status("0.8", 120), t0.Add(2*time.Minute+statusSignalsInterval)) {
		t.Error("signals were not refreshed after the interval")
	}
}
