package controller

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// The check between cycles in the fixture: every 2 s, over the last 4 s (the fixture's samples
// are a second apart), between cycles 5 s apart.
const (
	checkInterval = 2 * time.Second
	checkWindow   = 4 * time.Second
)

// Latency histograms, per second, by bound in ms: a healthy pod answers 99% within 10 ms
// (p99 9.9 ms), a jumped one within 250 ms (p99 247 ms).
var (
	healthyLatency = map[string]float64{"5": 50, "10": 100, "100": 100, "250": 100, "+Inf": 100}
	jumpedLatency  = map[string]float64{"5": 0, "10": 0, "100": 50, "250": 100, "+Inf": 100}
)

// newCheckFixture is the loop fixture with the check between cycles, every pod healthy.
func newCheckFixture(t *testing.T) *loopFixture {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.loop.FastCheckInterval, lf.loop.FastCheckWindow = checkInterval, checkWindow
	lf.latency = make([]map[string]float64, len(lf.ips))
	for i := range lf.latency {
		lf.latency[i] = healthyLatency
	}
	return lf
}

func (lf *loopFixture) check() CheckReport {
	lf.t.Helper()
	rep, err := lf.loop.RunCheck(context.Background())
	if err != nil {
		lf.t.Fatal(err)
	}
	lf.settle()
	return rep
}

func (lf *loopFixture) alb() *adlbv1.AdaptiveLoadBalancer {
	lf.t.Helper()
	a := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(lf.ctx, lf.key(), a); err != nil {
		lf.t.Fatal(err)
	}
	return a
}

var evenCores = []float64{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}

// A pod whose latency jumps (a neighbour took its cores: three times the CPU per request, a p99
// 25 times its own) is relieved by the next check, before the next cycle: its weight in the
// ServiceEntry is at least halved, and the object says so, stamped between the two cycles. The
// next cycle restores it slowly and does not halve it again for the queue the relief answered.
func TestRelief_APodWhoseLatencyJumpsIsRelievedBeforeTheNextCycle(t *testing.T) {
	lf := newCheckFixture(t)
	lf.load(evenCores, equalRPS)
	lf.run() // the baseline: every pod healthy
	cycleAt := lf.clock.Now()
	before := lf.weights()

	// At the next check, two seconds later (the next cycle is due at five), web-1 serves the
	// same rate with three times the CPU, and its p99 jumped.
	lf.latency[0] = jumpedLatency
	lf.clock.Step(checkInterval)
	lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
	rep := lf.check()
	decision, ok := rep.Relieved[lf.key()]
	if !ok {
		t.Fatalf("the check relieved nothing: %+v", rep)
	}
	after := lf.weights()
	if after[lf.ips[0]]*2 > before[lf.ips[0]] {
		t.Fatalf("web-1's weight went %d -> %d; a relief at least halves it (all %v -> %v)", before[lf.ips[0]], after[lf.ips[0]], before, after)
	}
	checkAt := lf.clock.Now()
	alb := lf.alb()
	if r := alb.Status.LastRelief; r == nil || !r.Time.Time.Equal(checkAt) || !strings.Contains(r.Reason, "web") && !strings.Contains(r.Reason, lf.ips[0]) {
		t.Fatalf("status.lastRelief %+v, want one at the check's time %v naming web-1", r, checkAt)
	}
	if rt := alb.Status.LastRelief.Time.Time; !rt.After(cycleAt) || !rt.Before(cycleAt.Add(loopInterval)) {
		t.Fatalf("the relief at %v is not between the cycle at %v and the next at %v", alb.Status.LastRelief.Time, cycleAt, cycleAt.Add(loopInterval))
	}
	if w := alb.Status.LastWeightWrite; w == nil || !w.Time.Equal(checkAt) {
		t.Fatalf("status.lastWeightWrite %v, want the relief's %v", w, checkAt)
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonRelieved)
	found := false
	for _, e := range alb.Status.Endpoints {
		if e.IP == lf.ips[0] {
			found = e.Reason == weights.ReasonRelievedLatency && int(e.Weight) == after[lf.ips[0]]
		}
	}
	if !found {
		t.Fatalf("web-1's status %+v, want weight %d with the reason %q", alb.Status.Endpoints, after[lf.ips[0]], weights.ReasonRelievedLatency)
	}
	if n := testutil.ToFloat64(lf.loop.Cycle.Reliefs); n != 1 {
		t.Fatalf("adaptivelb_reliefs_total = %v, want 1", n)
	}
	events := lf.drainEvents()
	relieved := false
	for _, ev := range events {
		relieved = relieved || strings.HasPrefix(ev, corev1.EventTypeWarning+" "+EventRelieved) && strings.Contains(ev, decision.Reason[:20])
	}
	if !relieved {
		t.Fatalf("events %q: want a %s warning with the relief's reason", events, EventRelieved)
	}

	// The next check sees the jump in its whole window: the relief answered it, and the check
	// does not cut again.
	lf.clock.Step(checkInterval)
	lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
	if again := lf.check(); again.Relieved[lf.key()].Changed {
		t.Fatalf("the check after the relief cut again: %s", again.Relieved[lf.key()].Reason)
	}
	if w := lf.weights(); w[lf.ips[0]] != after[lf.ips[0]] {
		t.Fatalf("web-1's weight %d -> %d at the check after the relief", after[lf.ips[0]], w[lf.ips[0]])
	}

	// The next cycle counts web-1 as relieved (restored slowly) and its queue as answered.
	lf.clock.Step(loopInterval - 2*checkInterval)
	lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
	next := lf.run()
	var web1 *weights.Endpoint
	for i, e := range next.Inputs[lf.key()].Endpoints {
		if e.ID == lf.ips[0] {
			web1 = &next.Inputs[lf.key()].Endpoints[i]
		}
	}
	if web1 == nil || !web1.Relieved || !web1.OverloadAnswered {
		t.Fatalf("the next cycle's input for web-1: %+v; want Relieved and OverloadAnswered", web1)
	}
	if w := lf.weights()[lf.ips[0]]; float64(w) > 1.5*float64(after[lf.ips[0]])+1 {
		t.Fatalf("the next cycle raised web-1's weight %d -> %d, more than the slow restore's 1.5 times", after[lf.ips[0]], w)
	}
}

// A healthy Service with pods that differ (two cost three times as much per request, answer five
// times as slowly and run hotter than the others, as they did at the last cycle) gets no relief
// over several checks and cycles: a relief needs a jump of a pod against its own last cycle.
// At 200 rps each pod's short window holds enough requests for its CPU per request to be judged.
func TestRelief_ASteadyServiceIsNeverRelieved(t *testing.T) {
	lf := newCheckFixture(t)
	cores, rps := make([]float64, len(skewedCores)), make([]float64, len(equalRPS))
	for i := range cores {
		cores[i], rps[i] = 2*skewedCores[i], 2*equalRPS[i]
	}
	slowLatency := map[string]float64{"5": 0, "10": 0, "50": 100, "100": 100, "250": 100, "+Inf": 100} // p99 49.6 ms
	lf.latency[4], lf.latency[5] = slowLatency, slowLatency
	for i := range lf.latency[:4] {
		lf.latency[i] = map[string]float64{"5": 50, "10": 100, "50": 100, "100": 100, "250": 100, "+Inf": 100}
	}
	lf.load(cores, rps)
	lf.run()
	se, err := lf.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}
	version := se.ResourceVersion
	// Checks at 2 and 4 s after each cycle, cycles 5 s apart.
	start := lf.clock.Now()
	for _, at := range []time.Duration{2, 4, 5, 7, 9, 10, 12, 14} {
		lf.clock.SetTime(start.Add(at * time.Second))
		lf.load(cores, rps)
		if at%5 == 0 {
			lf.run()
			se, _ = lf.serviceEntry("web")
			version = se.ResourceVersion
			continue
		}
		rep := lf.check()
		if !slices.Contains(rep.Checked, lf.key()) {
			t.Fatalf("the check at +%ds did not judge the Service: %+v", at, rep)
		}
		if d, ok := rep.Relieved[lf.key()]; ok {
			t.Fatalf("the check at +%ds relieved a steady Service: %s", at, d.Reason)
		}
		if se, _ := lf.serviceEntry("web"); se.ResourceVersion != version {
			t.Fatalf("the check at +%ds wrote the ServiceEntry (resourceVersion %s -> %s)", at, version, se.ResourceVersion)
		}
	}
	if r := lf.alb().Status.LastRelief; r != nil {
		t.Fatalf("status.lastRelief %+v on a Service never relieved", r)
	}
}

// A relief goes out whatever the write budget, although the cycle's budget is spent and another
// Service waits for it; it counts against the next cycle's budget. Membership never waits behind
// it: an endpoint that leaves right after reaches the ServiceEntry through the mirror at once,
// with no cycle or check running, and the mirror does not re-plan the survivors from the weights
// the relief replaced.
func TestRelief_TheBudgetNeverHoldsAReliefAndMembershipNeverWaitsBehindIt(t *testing.T) {
	lf := newCheckFixture(t)
	lf.loop.Budget = 1
	apiKey := lf.addService("api")

	// Both Services need a write (equal weights on skewed pods); the budget of 1 serves one.
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	written, waiting := lf.key(), apiKey
	if rep.Outcomes[lf.key()].Action == cycle.ActionDeferred {
		written, waiting = apiKey, lf.key()
	}
	if rep.Outcomes[written].Action != cycle.ActionWrite || rep.Outcomes[waiting].Action != cycle.ActionDeferred {
		t.Fatalf("the first cycle: %s %s, %s %s; want one written and one deferred by the budget of 1", written, rep.Outcomes[written].Action, waiting, rep.Outcomes[waiting].Action)
	}

	// web-1 jumps in both Services (they share the pods).
	lf.latency[0] = jumpedLatency
	lf.clock.Step(checkWindow)
	jumped := []float64{1.5, 0.2, 0.2, 0.2, 0.6, 0.6}
	lf.load(jumped, equalRPS)
	before := lf.weightsOf("web")
	check := lf.check()
	if _, ok := check.Relieved[lf.key()]; !ok {
		t.Fatalf("no relief for web with the budget spent: %+v", check)
	}
	if _, ok := check.Relieved[apiKey]; !ok {
		t.Fatalf("no relief for api, whose write the budget defers: %+v", check)
	}
	if w := lf.weightsOf("web"); w[lf.ips[0]]*2 > before[lf.ips[0]] {
		t.Fatalf("web-1's weight %d -> %d", before[lf.ips[0]], w[lf.ips[0]])
	}
	relieved := lf.weightsOf("web")[lf.ips[0]]

	// Right after, web-6 leaves: the mirror writes it out at once.
	lf.slice("web", "web-x", lf.allReady()[:5]...)
	lf.waitForAddresses("web", lf.ips[:5]...)
	if w := lf.weightsOf("web")[lf.ips[0]]; w != relieved {
		t.Fatalf("web-1's weight went %d -> %d when web-6 left: the mirror re-planned from the weights the relief replaced", relieved, w)
	}

	// A third Service of the same pods, new, wants its first write at the next cycle; the two
	// reliefs spent that cycle's budget of 1, so no write the budget serves goes out.
	lf.service("late", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} })
	lf.slice("late", "late-x", lf.allReady()...)
	late := lf.fixture.alb("late", "late", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Interval = &metav1.Duration{Duration: loopInterval} })
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), late) })
	lf.waitForCondition("late", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	lateKey := types.NamespacedName{Namespace: lf.ns, Name: "late"}
	lf.clock.Step(loopInterval - checkWindow)
	lf.load(jumped, equalRPS)
	rep = lf.run()
	deferred := 0
	for _, key := range []types.NamespacedName{lf.key(), apiKey, lateKey} {
		o := rep.Outcomes[key]
		if o.Action == cycle.ActionWrite && !o.Fallback && o.Decision.ModelOverruled == "" {
			t.Errorf("%s wrote (%s) although the reliefs since the last cycle spent the budget of 1", key, o.Reason)
		}
		if o.Action == cycle.ActionDeferred && strings.Contains(o.Reason, "write budget of 1 ServiceEntry objects per cycle spent") {
			deferred++
		}
	}
	if deferred == 0 {
		t.Fatalf("no Service wanted a write the budget serves (%+v); the test needs one", rep.Outcomes[lateKey])
	}
}

// A check reads the pods' short window through the same batched fetch for every Service: two
// Services, one fetch.
func TestRelief_OneBatchedFetchPerCheck(t *testing.T) {
	lf := newCheckFixture(t)
	lf.addService("api")
	counting := &countingSource{Source: lf.loop.Source}
	lf.loop.Source = counting
	lf.load(evenCores, equalRPS)
	lf.run()
	fetches := counting.fetches
	lf.clock.Step(checkInterval)
	lf.load(evenCores, equalRPS)
	rep := lf.check()
	ours := 0
	for _, k := range rep.Checked {
		if k.Namespace == lf.ns {
			ours++
		}
	}
	if ours != 2 || counting.fetches-fetches != 1 {
		t.Fatalf("the check judged %d of the fixture's Services with %d fetches; want 2 with one", ours, counting.fetches-fetches)
	}
	if got := counting.lastWindow; got != checkWindow {
		t.Fatalf("the check's fetch read a window of %v, want %v", got, checkWindow)
	}
}

// Nothing is checked that the check must leave alone, though a cycle observed it before: a
// Service switched to DryRun or Frozen, or to the cpu-distance algorithm, and one whose interval
// is no longer than the check's.
func TestRelief_ChecksOnlyActiveCapacityAndTailServicesWithALongerInterval(t *testing.T) {
	for name, mutate := range map[string]func(*adlbv1.AdaptiveLoadBalancer){
		"DryRun": func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeDryRun },
		"Frozen": func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeFrozen },
		"cpu-distance": func(a *adlbv1.AdaptiveLoadBalancer) {
			a.Spec.Algorithm = adlbv1.Algorithm(weights.AlgorithmCPUDistance)
		},
		"an interval as short": nil,
	} {
		t.Run(name, func(t *testing.T) {
			lf := newCheckFixture(t)
			lf.load(evenCores, equalRPS)
			lf.run() // a baseline, while Active with tail
			if mutate == nil {
				lf.loop.FastCheckInterval = loopInterval
			} else {
				a := lf.alb()
				mutate(a)
				if err := k8s.Update(lf.ctx, a); err != nil {
					t.Fatal(err)
				}
				lf.eventually("the operator's cache sees the change", func() error {
					c := &adlbv1.AdaptiveLoadBalancer{}
					if err := operatorClient.Get(lf.ctx, lf.key(), c); err != nil {
						return err
					}
					if c.Generation != a.Generation {
						return errNotYet
					}
					return nil
				})
			}
			lf.latency[0] = jumpedLatency
			lf.clock.Step(checkWindow)
			lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
			rep := lf.check()
			if slices.Contains(rep.Checked, lf.key()) || len(rep.Relieved) > 0 && rep.Relieved[lf.key()].Changed {
				t.Fatalf("the check judged a Service it must leave alone (%s): %+v", name, rep)
			}
		})
	}
}

// countingSource counts the batched fetches and remembers the last one's window.
type countingSource struct {
	metrics.Source
	fetches    int
	lastWindow time.Duration
}

func (c *countingSource) Fetch(ctx context.Context, req metrics.Request) (metrics.Batch, error) {
	c.fetches++
	c.lastWindow = req.Window
	return c.Source.Fetch(ctx, req)
}

// A relief whose write the API server refuses claims nothing: the ServiceEntry keeps its
// weights, status.lastRelief, WeightsApplied and adaptivelb_reliefs_total stay as they were, and
// the check reports the failure; the next check, once the API server accepts writes, relieves.
func TestRelief_ARefusedReliefWriteClaimsNothingAndTheNextCheckRetries(t *testing.T) {
	lf := newCheckFixture(t)
	lf.load(evenCores, equalRPS)
	lf.run()
	before := lf.weights()
	applied := meta.FindStatusCondition(lf.alb().Status.Conditions, adlbv1.ConditionWeightsApplied)
	if applied == nil {
		t.Fatal("no WeightsApplied condition after the first cycle")
	}
	conditionBefore := applied.Reason

	fault := &apiFault{status: metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}}
	apiFaults.Store(lf.ns, fault)
	defer apiFaults.Delete(lf.ns)
	lf.latency[0] = jumpedLatency
	lf.clock.Step(checkInterval)
	lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
	rep := lf.check()
	if fault.attempts.Load() == 0 {
		t.Fatal("the check never tried to write: the scenario does not test a refused relief")
	}
	if _, relieved := rep.Relieved[lf.key()]; relieved || rep.Failed[lf.key()] == nil {
		t.Fatalf("a refused relief reported as %+v, want a failure and no relief", rep)
	}
	if w := lf.weights(); !maps.Equal(w, before) {
		t.Fatalf("the ServiceEntry's weights went %v -> %v although the write was refused", before, w)
	}
	alb := lf.alb()
	if alb.Status.LastRelief != nil {
		t.Fatalf("status.lastRelief %+v after a refused write", alb.Status.LastRelief)
	}
	if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionWeightsApplied); c == nil || c.Reason != conditionBefore {
		t.Fatalf("WeightsApplied %+v after a refused relief, want its reason %q unchanged", c, conditionBefore)
	}
	if n := testutil.ToFloat64(lf.loop.Cycle.Reliefs); n != 0 {
		t.Fatalf("adaptivelb_reliefs_total = %v after a refused write, want 0", n)
	}

	apiFaults.Delete(lf.ns)
	lf.clock.Step(checkInterval)
	lf.load([]float64{1.5, 0.5, 0.5, 0.5, 0.5, 0.5}, equalRPS)
	if again := lf.check(); !again.Relieved[lf.key()].Changed {
		t.Fatalf("the check after the API server recovered did not relieve: %+v", again)
	}
	if w := lf.weights(); w[lf.ips[0]]*2 > before[lf.ips[0]] {
		t.Fatalf("web-1's weight went %d -> %d once the write landed; a relief at least halves it", before[lf.ips[0]], w[lf.ips[0]])
	}
}
