package controller

import (
	"os"
	"regexp"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// status.recentPeak is written only in a form the CRD's schema accepts: a refused value would
// make the API server refuse the weight cycle's whole status write (conditions, endpoints) every
// cycle for as long as the rate stays in the 10-minute window. The schema is read from the
// generated CRD, so the test follows it.
func TestRecentPeakStatus_AlwaysFitsTheSchema(t *testing.T) {
	raw, err := os.ReadFile("../../config/crd/bases/adaptivelb.io_adaptiveloadbalancers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	rateSchema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["recentPeak"].Properties["requestRate"]
	if rateSchema.Pattern == "" || rateSchema.MaxLength == nil {
		t.Fatalf("status.recentPeak.requestRate has no pattern or maxLength in the CRD: %+v", rateSchema)
	}
	pattern := regexp.MustCompile(rateSchema.Pattern)
	at := time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		rate      float64
		wantWrite bool
	}{
		{0, true},
		{0.04, true},
		{612.37, true},
		{2.5e6, true},
		{9.9e12, true},
		{-3, false},   // a query override that subtracts
		{1e14, false}, // "100000000000000.0": 17 characters
		{1e300, false},
	} {
		p := recentPeakStatus(rateObservation{at: at, rate: c.rate}, true)
		if (p != nil) != c.wantWrite {
			t.Errorf("rate %g: written = %v, want %v", c.rate, p != nil, c.wantWrite)
			continue
		}
		if p == nil {
			continue
		}
		if got := string(p.RequestRate); !pattern.MatchString(got) || int64(len(got)) > *rateSchema.MaxLength {
			t.Errorf("rate %g is written as %q, which the CRD refuses (pattern %s, maxLength %d)", c.rate, got, rateSchema.Pattern, *rateSchema.MaxLength)
		}
		if !p.ObservedAt.Time.Equal(at) {
			t.Errorf("rate %g: observedAt %v, want %v", c.rate, p.ObservedAt, at)
		}
	}
	if recentPeakStatus(rateObservation{at: at, rate: 5}, false) != nil {
		t.Error("a peak is written although none was observed")
	}
}

// Under a CRD older than status.recentPeak (crds/ is not applied by helm upgrade) the API server
// prunes the field, so every status read back has none. Compared with that, each cycle's peak
// would look like a first one and the status would be written every cycle (333 patches per
// second at 10,000 AdaptiveLoadBalancers on a 30 s interval); the cycle compares with the peak
// it wrote instead, and still writes a real rise at once and refreshes after the interval.
func TestWeightCycle_APrunedRecentPeakIsNotRewrittenEveryCycle(t *testing.T) {
	w := &WeightCycle{}
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	t0 := time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)
	pruned := func(cpu string) *adlbv1.AdaptiveLoadBalancerStatus {
		return &adlbv1.AdaptiveLoadBalancerStatus{Endpoints: []adlbv1.EndpointStatus{{Pod: "a", IP: "10.0.0.1", Weight: 100, CPUCores: adlbv1.Decimal(cpu)}}}
	}
	withPeak := func(cpu, rate string, at time.Time) *adlbv1.AdaptiveLoadBalancerStatus {
		s := pruned(cpu)
		s.RecentPeak = &adlbv1.RecentPeak{RequestRate: adlbv1.Decimal(rate), ObservedAt: metav1.NewTime(at)}
		return s
	}
	if w.skipStatusWrite(key, pruned("0.5"), withPeak("0.6", "600.0", t0), t0) {
		t.Fatal("the first peak was not written")
	}
	for i := 1; i <= 4; i++ {
		now := t0.Add(time.Duration(i) * 30 * time.Second)
		if !w.skipStatusWrite(key, pruned("0.6"), withPeak("0.7", "610.0", now), now) {
			t.Fatalf("cycle %d: the status was written again because the API server pruned the peak written before", i)
		}
	}
	rise := t0.Add(150 * time.Second)
	if w.skipStatusWrite(key, pruned("0.6"), withPeak("0.7", "900.0", rise), rise) {
		t.Error("a peak 1.5x the one written was held back")
	}
	refresh := rise.Add(statusSignalsInterval)
	if w.skipStatusWrite(key, pruned("0.7"), withPeak("0.8", "900.0", rise), refresh) {
		t.Error("the status was not refreshed after the interval")
	}
}
