package controller

import (
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// sliceWeights maps each address of the Service's slices to its weight, and to its slice.
func (lf *loopFixture) sliceWeights() (map[string]int, map[string]string) {
	lf.t.Helper()
	weight, slice := map[string]int{}, map[string]string{}
	for _, se := range lf.serviceEntrySlices("web") {
		for _, e := range se.Spec.Endpoints {
			weight[e.Address], slice[e.Address] = int(e.Weight), se.Name
		}
	}
	return weight, slice
}

// memberWeights is what the mirror's membership record holds as each address's weight.
func memberWeights(lf *loopFixture) map[string]int {
	sharedMembership.mu.Lock()
	defer sharedMembership.mu.Unlock()
	out := map[string]int{}
	if log, ok := sharedMembership.byKey[lf.key()]; ok {
		for ip, w := range log.weight {
			out[ip] = int(w.weight)
		}
	}
	return out
}

// A weight write that fails part-way over a Service's slices changed the weights of the slices
// it reached: the status (each endpoint's weight, lastWeightWrite), the membership's record of
// the weights and the next cycle's view of its metrics window say so, instead of "nothing
// applied".
func TestWeightCycle_AWeightWriteThatFailsPartWayReportsTheSlicesItWrote(t *testing.T) {
	const pods = 90 // three slices of the suite's 40 endpoints
	lf := newLoopFixtureOf(t, adlbv1.ModeActive, pods)
	lf.useCapacity()
	cores, reversed, rps := make([]float64, pods), make([]float64, pods), make([]float64, pods)
	for i := range pods {
		cores[i], reversed[i], rps[i] = 0.2, 0.6, 100
		if i%3 == 0 {
			cores[i], reversed[i] = 0.6, 0.2
		}
	}
	lf.load(cores, rps)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("first cycle: %+v", rep.Outcomes[lf.key()])
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
	before, _ := lf.sliceWeights()
	first := lf.get("web").Status.LastWeightWrite

	apiFaults.Store(lf.ns, &apiFault{object: "web.2", status: metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}})
	defer apiFaults.Delete(lf.ns)
	lf.clock.Step(3 * loopInterval)
	lf.load(reversed, rps) // costs reversed: every slice needs new weights
	partAt := lf.clock.Now()
	if o := lf.run().Outcomes[lf.key()]; o.Action != cycle.ActionWrite {
		t.Fatalf("want a write: %s (%s)", o.Action, o.Reason)
	}
	c := lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
	if !strings.Contains(c.Message, "reached 2 of the Service's 3 ServiceEntry slices") {
		t.Errorf("WeightsApplied message %q does not say how far the write got", c.Message)
	}
	after, sliceOf := lf.sliceWeights()
	changed := map[string]bool{}
	for ip, w := range after {
		if w != before[ip] {
			changed[sliceOf[ip]] = true
		}
	}
	if !changed["web"] || !changed["web.1"] || changed["web.2"] {
		t.Fatalf("slices whose weights changed: %v; want web and web.1, not web.2", changed)
	}

	alb := lf.get("web")
	if alb.Status.LastWeightWrite == nil || !alb.Status.LastWeightWrite.Time.Equal(partAt) {
		t.Errorf("lastWeightWrite %v (the first write's was %v), want %v: weights were written to two slices", alb.Status.LastWeightWrite, first, partAt)
	}
	if len(alb.Status.Endpoints) != pods {
		t.Fatalf("status lists %d endpoints, want %d", len(alb.Status.Endpoints), pods)
	}
	for _, e := range alb.Status.Endpoints {
		if int(e.Weight) != after[e.IP] {
			t.Errorf("status shows weight %d for %s (slice %s); the ServiceEntry has %d", e.Weight, e.IP, sliceOf[e.IP], after[e.IP])
		}
	}
	for ip, w := range memberWeights(lf) {
		if w != after[ip] {
			t.Errorf("the membership records weight %d for %s (slice %s); the ServiceEntry has %d", w, ip, sliceOf[ip], after[ip])
		}
	}

	// One interval later half the metrics window lies under the new weights of two slices: the
	// next cycle takes it for mixed, not for a clean window under the old ones.
	apiFaults.Delete(lf.ns)
	lf.clock.Step(loopInterval)
	lf.load(reversed, rps)
	if o := lf.run().Outcomes[lf.key()]; o.Decision.Reason != weights.ReasonWindowUnsettled {
		t.Errorf("the cycle after the part-way write decided %s (%s); want %q: its window is mixed", o.Action, o.Decision.Reason, weights.ReasonWindowUnsettled)
	}
}
