package controller

import (
	"os"
	"regexp"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
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
