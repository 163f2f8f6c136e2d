package controller

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestMembership_ShareCountsOnlyTheTimeInTheServiceEntry(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	m := NewMembership(clk)
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	a, b, c := MemberEndpoint{IP: "a", Pod: "pa", Weight: 100}, MemberEndpoint{IP: "b", Pod: "pb", Weight: 100}, MemberEndpoint{IP: "c", Pod: "pc", Weight: 100}
	m.Observe(key, []MemberEndpoint{a, b}) // first record: present since before any window
	m.Weighted(key, map[string]int{"a": 120, "b": 30})
	clk.Step(2 * time.Second)
	m.Observe(key, []MemberEndpoint{a}) // b leaves at t0+2s
	if w, ok := m.RecentWeight(key, "b", "pb"); !ok || w != 30 {
		t.Errorf("b's weight when it left: %d (%v), want the cycle's 30", w, ok)
	}
	if _, ok := m.RecentWeight(key, "b", "another-pod"); ok {
		t.Error("another pod on b's address inherited b's weight")
	}
	clk.Step(3 * time.Second)
	m.Observe(key, []MemberEndpoint{a, b, c}) // b returns and c joins at t0+5s
	clk.Step(5 * time.Second)
	from, to := t0, t0.Add(10*time.Second)

	for ip, want := range map[string]float64{"a": 1, "b": 0.7, "c": 0.5, "unknown": 0} {
		if got := m.Share(key, ip, from, to); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: share %.3f, want %.3f", ip, got, want)
		}
	}
	if got := m.Share(types.NamespacedName{Namespace: "shop", Name: "other"}, "a", from, to); got != 1 {
		t.Errorf("a ServiceEntry without records: share %.3f, want 1", got)
	}
	m.Retain(map[types.NamespacedName]bool{})
	if got := m.Share(key, "b", from, to); got != 1 {
		t.Errorf("after its balancer is gone the record should be dropped: share %.3f", got)
	}
}

// A new AdaptiveLoadBalancer's first reconcile can write its ServiceEntry before the
// EndpointSlice cache lists any endpoint; the endpoints that arrive next all join together and
// none of them may count as a newcomer that served less than its share.
func TestMembership_EndpointsJoiningAnEmptyServiceEntryAreNotNewcomers(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	m := NewMembership(clk)
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	a, b := MemberEndpoint{IP: "a", Pod: "pa", Weight: 100}, MemberEndpoint{IP: "b", Pod: "pb", Weight: 100}
	m.Observe(key, nil)
	clk.Step(10 * time.Second)
	m.Observe(key, []MemberEndpoint{a})
	clk.Step(time.Second)
	m.Observe(key, []MemberEndpoint{a, b}) // b is a real newcomer
	clk.Step(5 * time.Second)
	from, to := t0.Add(-time.Minute), clk.Now()
	for ip, want := range map[string]float64{"a": 1, "b": 5.0 / 76} {
		if got := m.Share(key, ip, from, to); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: share %.3f, want %.3f", ip, got, want)
		}
	}
}

// The first reconciles of a new AdaptiveLoadBalancer can list its endpoints a few at a time
// while the Pod and EndpointSlice caches catch up; those are not newcomers either.
func TestMembership_EndpointsListedInTheFirstMomentsAreNotNewcomers(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	m := NewMembership(clk)
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	a, b, c := MemberEndpoint{IP: "a", Pod: "pa", Weight: 100}, MemberEndpoint{IP: "b", Pod: "pb", Weight: 100}, MemberEndpoint{IP: "c", Pod: "pc", Weight: 100}
	m.Observe(key, []MemberEndpoint{a})
	clk.Step(time.Second)
	m.Observe(key, []MemberEndpoint{a, b})
	clk.Step(membershipSettle)
	m.Observe(key, []MemberEndpoint{a, b, c}) // past the settling time: c is a newcomer
	clk.Step(membershipSettle)
	from, to := t0.Add(-time.Minute), clk.Now()
	for ip, want := range map[string]float64{"a": 1, "b": 1, "c": 5.0 / 71} {
		if got := m.Share(key, ip, from, to); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: share %.3f, want %.3f", ip, got, want)
		}
	}
}
