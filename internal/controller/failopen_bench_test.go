package controller

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// BenchmarkFallbackBurst measures how fast the weight cycle's write puts equal weights into
// ServiceEntries of 20 endpoints one after another, as the burst of a cycle does, through the
// operator's client (200 requests/s, burst 400: the run command's defaults) against the real API
// server: the rate at which a cluster-wide metrics outage fails open once the hold time has
// passed, every fallback in the same cycle (the write budget never defers one). It reports the
// rate and the time the burst would take at 10,000 Services.
//
//	make test-assets && eval "$(make -s test-env)" && go test -run '^$' -bench FallbackBurst -benchtime 3x ./internal/controller/
//
// ADAPTIVELB_BENCH_FALLBACK_SERVICES changes the number of ServiceEntries (default 1,000).
func BenchmarkFallbackBurst(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("ADAPTIVELB_BENCH_FALLBACK_SERVICES")); err == nil && v > 0 {
		n = v
	}
	f := newFixture(b)
	ctx := context.Background()
	for i := range n {
		se := sizedServiceEntry(f.ns, fmt.Sprintf("svc-%05d", i), 20)
		// Not the operator's (no label, no controller): neither the mirror nor the orphan check
		// acts on them; an owner reference of the kind keeps them whole in the operator's cache.
		se.Labels = nil
		se.OwnerReferences = []metav1.OwnerReference{{APIVersion: adlbv1.GroupVersion.String(), Kind: "AdaptiveLoadBalancer", Name: "bench", UID: "5b7a3c9e-0000-4000-8000-0000000000b1"}}
		for j, e := range se.Spec.Endpoints {
			e.Weight = uint32(10 + 90*(j%2))
		}
		f.create(se)
	}
	f.eventually("the operator's cache has every ServiceEntry", func() error {
		var list networkingv1.ServiceEntryList
		if err := operatorClient.List(ctx, &list, client.InNamespace(f.ns)); err != nil {
			return err
		}
		if len(list.Items) != n {
			return fmt.Errorf("%d of %d", len(list.Items), n)
		}
		return nil
	})
	w := &WeightCycle{Client: operatorClient, Versions: &ServiceEntryVersions{}, Metrics: testMetrics}
	equal := 100
	for b.Loop() {
		equal++ // every iteration writes a change
		var list networkingv1.ServiceEntryList
		if err := operatorClient.List(ctx, &list, client.InNamespace(f.ns)); err != nil {
			b.Fatal(err)
		}
		start, before := time.Now(), seWrites.Load()
		for i := range list.Items {
			se := list.Items[i]
			var d weights.Decision
			for _, e := range se.Spec.Endpoints {
				d.Endpoints = append(d.Endpoints, weights.Result{ID: e.Address, Weight: equal})
			}
			if _, err := w.writeWeights(ctx, &dueTarget{se: se, replannedAt: replannedAt(se)}, d, false); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		if written := seWrites.Load() - before; written != int64(len(list.Items)) {
			b.Fatalf("%d ServiceEntry writes for %d ServiceEntries", written, len(list.Items))
		}
		rate := float64(len(list.Items)) / elapsed.Seconds()
		b.ReportMetric(rate, "writes/s")
		b.ReportMetric(10_000/rate, "s_per_10k_services")
	}
}
