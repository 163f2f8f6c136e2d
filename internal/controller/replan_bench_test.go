package controller

import (
	"fmt"
	"testing"
	"time"

	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// BenchmarkReplanWeights is the mirror's added work when one of a Service's pods leaves: the
// tail re-plan of the survivors, for Services of 20 and 200 pods (a quarter fast, the rest three
// times as costly per request).
func BenchmarkReplanWeights(b *testing.B) {
	for _, n := range []int{20, 200} {
		b.Run(fmt.Sprintf("tail-%d-pods", n), func(b *testing.B) {
			m := NewMembership(clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
			key := types.NamespacedName{Namespace: "ns", Name: "web"}
			alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "uid-1"}}
			alb.Spec.Algorithm = adlbv1.AlgorithmTail
			var eps []weights.Endpoint
			var listed []MemberEndpoint
			se := &networkingv1.ServiceEntry{}
			var built []istio.Endpoint
			for i := 0; i < n; i++ {
				ip, pod := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), fmt.Sprintf("web-%d", i)
				cost := 0.003
				if i >= n/4 {
					cost = 0.009
				}
				eps = append(eps, weights.Endpoint{ID: ip, CPUCores: 100 * cost, RequestRate: 100, CPULimitCores: 2, NodeCPUCores: 8, HasMetrics: true, CurrentWeight: 100})
				listed = append(listed, MemberEndpoint{IP: ip, Pod: pod, Weight: 100})
				se.Spec.Endpoints = append(se.Spec.Endpoints, &apinetworkingv1.WorkloadEntry{Address: ip, Weight: 100})
				if i > 0 {
					built = append(built, istio.Endpoint{Pod: pod, IP: ip, Weight: 100})
				}
			}
			m.Observe(key, listed)
			m.RecordPlan(alb, time.Minute, cycle.Target{Key: key.String(), Endpoints: eps, Settings: weights.DefaultSettings(weights.AlgorithmTail), WindowSeconds: 60, RecentPeakRequestRate: float64(100 * n)}, 0)
			if got, _ := m.replanWeights(alb, se, built); got == nil {
				b.Fatal("no re-plan: the benchmark would time the early exits")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				m.replanWeights(alb, se, built)
			}
		})
	}
}
