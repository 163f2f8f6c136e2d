package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/pushmodel"
)

// maxConditionMessage bounds what a condition may carry: a summary, not the PromQL texts and
// their errors (those go to events and the log).
const maxConditionMessage = 1024

func (lf *loopFixture) get(name string) *adlbv1.AdaptiveLoadBalancer {
	lf.t.Helper()
	a := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: name}, a); err != nil {
		lf.t.Fatal(err)
	}
	return a
}

func (lf *loopFixture) weightsOf(name string) map[string]int {
	lf.t.Helper()
	se, err := lf.serviceEntry(name)
	if err != nil {
		lf.t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range se.Spec.Endpoints {
		out[e.Address] = int(e.Weight)
	}
	return out
}

// useCapacity pins the capacity algorithm: these tests reason about its feedback on traffic
// shares, whatever the CRD's default algorithm is.
func (lf *loopFixture) useCapacity() {
	lf.t.Helper()
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Algorithm = adlbv1.AlgorithmCapacity })
}

// withoutSurgeBound sets spec.tail.surgeFactor to 1: the model's split, as for a Service whose
// load history shows no surge. The fixture's Service has no history, and the default bound (4)
// takes the split proportional to capacity at its load, which leaves the tests of the model
// check and of the re-plan nothing to tell apart.
func (lf *loopFixture) withoutSurgeBound() {
	lf.t.Helper()
	one := adlbv1.Decimal("1")
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) {
		if a.Spec.Tail == nil {
			a.Spec.Tail = &adlbv1.TailParameters{}
		}
		a.Spec.Tail.SurgeFactor = &one
	})
}

// updateALB changes the spec and waits until the operator's cache has the new generation.
func (lf *loopFixture) updateALB(name string, change func(*adlbv1.AdaptiveLoadBalancer)) {
	lf.t.Helper()
	// The operator writes the status meanwhile: the edit retries on a conflict, as kubectl's does.
	var a *adlbv1.AdaptiveLoadBalancer
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a = lf.get(name)
		change(a)
		return k8s.Update(lf.ctx, a)
	})
	if err != nil {
		lf.t.Fatal(err)
	}
	lf.eventually("the operator's cache sees the update", func() error {
		c := &adlbv1.AdaptiveLoadBalancer{}
		if err := operatorClient.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: name}, c); err != nil {
			return err
		}
		if c.Generation != a.Generation {
			return errNotYet
		}
		return nil
	})
}

func (lf *loopFixture) assertShortConditions(name string) {
	lf.t.Helper()
	for _, c := range lf.get(name).Status.Conditions {
		if len(c.Message) > maxConditionMessage {
			lf.t.Errorf("condition %s carries %d bytes; want a summary under %d: %s", c.Type, len(c.Message), maxConditionMessage, c.Message)
		}
	}
}

func endpointReason(a *adlbv1.AdaptiveLoadBalancer, ip string) string {
	for _, e := range a.Status.Endpoints {
		if e.IP == ip {
			return e.Reason
		}
	}
	return ""
}

// Issue 15.1: web (default queries) and api (its own CPU query) select the same pods. Each
// must be weighted by its own queries' results: the fetch keys results by (queries, pod).
func TestWeightCycle_TwoServicesOnTheSamePodsUseTheirOwnQueries(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.addService("api", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Algorithm = adlbv1.AlgorithmCapacity
		a.Spec.Metrics = &adlbv1.MetricsSpec{Queries: &adlbv1.QueryOverrides{
			CPU: `sum by (namespace, pod) (rate(app_cpu_seconds_total{namespace=~"{{.Namespaces}}", pod=~"{{.Pods}}"}[{{.Window}}]))`}}
	})

	// For web, pods 5 and 6 are the costly ones; api's query says pods 1 and 2 are.
	lf.appCores = []float64{0.6, 0.6, 0.2, 0.2, 0.2, 0.2}
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	for _, name := range []string{"web", "api"} {
		if o := rep.Outcomes[types.NamespacedName{Namespace: lf.ns, Name: name}]; o.Action != cycle.ActionWrite {
			t.Fatalf("%s: action %s (%s), want Write", name, o.Action, o.Reason)
		}
	}
	web, apiW := lf.weightsOf("web"), lf.weightsOf("api")
	t.Logf("web %v, api %v", orderedWeights(lf.ips, web), orderedWeights(lf.ips, apiW))
	if web[lf.ips[0]] <= web[lf.ips[5]] {
		t.Errorf("web weighted by another Service's query: pod 1 %d not above costly pod 6 %d", web[lf.ips[0]], web[lf.ips[5]])
	}
	if apiW[lf.ips[5]] <= apiW[lf.ips[0]] {
		t.Errorf("api weighted by another Service's query: pod 6 %d not above costly pod 1 %d", apiW[lf.ips[5]], apiW[lf.ips[0]])
	}
}

// withInstanceType puts pods 1-4 on a fast machine type and pods 5-6 on a slow one.
func withInstanceTypes(f *fixture) func(i int) []func(*corev1.Pod) {
	for name, typ := range map[string]string{"fast-node": "m-fast", "slow-node": "m-slow"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"topology.kubernetes.io/region": "eu-west", "topology.kubernetes.io/zone": "eu-west-1a", InstanceTypeLabel: typ}}}
		if err := k8s.Create(f.ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
			f.t.Fatal(err)
		}
	}
	return func(i int) []func(*corev1.Pod) {
		node := "fast-node"
		if i >= 4 {
			node = "slow-node"
		}
		return []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.NodeName = node }}
	}
}

// Issue 15.2: a pod without usable metrics must not get the median of all pods, which
// overloads a slow machine. A known pod keeps its last good weight; a new one gets the median
// of its instance type's pods, as the mirror gives it.
func TestWeightCycle_APodWithoutMetricsKeepsItsWeightOrTakesItsInstanceTypesMedian(t *testing.T) {
	requireVM(t)
	lf := newLoopFixture(t, adlbv1.ModeActive, withInstanceTypes(newFixtureFor(t)))
	lf.useCapacity()
	adapted := lf.adapt(skewedCores, equalRPS)
	slow := adapted[lf.ips[5]]
	t.Logf("adapted %v", orderedWeights(lf.ips, adapted))

	// The slow pod 6 loses its CPU series: three intervals later its samples are gone.
	lf.omitCPU[5] = true
	lf.clock.Step(3 * loopInterval)
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	o := rep.Outcomes[lf.key()]
	if got := o.Decision.Weights()[lf.ips[5]]; got != slow {
		t.Fatalf("slow pod without metrics: weight %d, want its last good weight %d (%s)", got, slow, o.Reason)
	}
	if lf.wrote(rep) == 1 {
		if got := lf.weights()[lf.ips[5]]; got != slow {
			t.Fatalf("slow pod without metrics written with %d, want %d", got, slow)
		}
	}
	lf.eventually("status explains the kept weight", func() error {
		if r := endpointReason(lf.get("web"), lf.ips[5]); r != cycle.ReasonNoMetricsKept {
			return fmt.Errorf("reason %q", r)
		}
		return nil
	})

	// A new pod on the slow machine type joins, without metrics yet.
	lf.joinSeventh(func(p *corev1.Pod) { p.Spec.NodeName = "slow-node" })
	lf.clock.Step(loopInterval)
	lf.load(skewedCores, equalRPS)
	rep = lf.run()
	o = rep.Outcomes[lf.key()]
	decided := o.Decision.Weights()
	newPod, peer := decided["10.20.0.7"], decided[lf.ips[4]]
	t.Logf("decided %v, new pod %d", orderedWeights(lf.ips, decided), newPod)
	if newPod != peer {
		t.Errorf("new slow pod: weight %d, want the median of its instance type's pods with metrics (%d)", newPod, peer)
	}
	for _, fast := range lf.ips[:4] {
		if decided[fast] <= newPod {
			t.Errorf("new slow pod weight %d is not below fast pod %s's %d", newPod, fast, decided[fast])
		}
	}
}

// newFixtureFor returns a fixture handle for creating cluster-scoped objects before the loop
// fixture's namespace exists.
func newFixtureFor(t *testing.T) *fixture {
	requireEnv(t)
	return &fixture{t: t, ctx: context.Background()}
}

// Issue 13.2: a weight write the API server refuses is not applied: WeightsApplied turns False,
// the status keeps the weights and the lastWeightWrite the ServiceEntry really has.
func TestWeightCycle_AFailedWeightWriteIsNotReportedAsApplied(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	applied := lf.weights()
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
	before := lf.get("web")
	if before.Status.LastWeightWrite == nil {
		t.Fatal("no lastWeightWrite after the first write")
	}

	fault := &apiFault{status: metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}}
	apiFaults.Store(lf.ns, fault)
	defer apiFaults.Delete(lf.ns)
	lf.clock.Step(3 * loopInterval)
	lf.load([]float64{0.6, 0.6, 0.2, 0.2, 0.2, 0.2}, equalRPS) // costs reversed: new weights needed
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite || lf.wrote(rep) != 0 || fault.attempts.Load() == 0 {
		t.Fatalf("want a refused write: action %s, %d written, %d attempts", o.Action, lf.wrote(rep), fault.attempts.Load())
	}
	c := lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
	if !strings.Contains(c.Message, "injected") {
		t.Errorf("the condition should say why: %q", c.Message)
	}
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
	after := lf.get("web")
	if !after.Status.LastWeightWrite.Equal(before.Status.LastWeightWrite) {
		t.Errorf("lastWeightWrite moved to %v after a failed write (was %v)", after.Status.LastWeightWrite, before.Status.LastWeightWrite)
	}
	for _, e := range after.Status.Endpoints {
		if int(e.Weight) != applied[e.IP] {
			t.Errorf("status shows weight %d for %s; the ServiceEntry has %d", e.Weight, e.IP, applied[e.IP])
		}
	}

	apiFaults.Delete(lf.ns)
	lf.clock.Step(loopInterval)
	lf.load([]float64{0.6, 0.6, 0.2, 0.2, 0.2, 0.2}, equalRPS)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("after the API server recovered: %+v", rep.Outcomes[lf.key()])
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
}

// Issue 13.3: when only the Istio series vanish, no pod has every signal the algorithm needs:
// that is an outage, so the last weights are held, not reset to equal at once.
func TestWeightCycle_OneMissingSignalIsAnOutage(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	adapted := lf.weights()
	for i := range lf.ips {
		lf.omitRequests[i] = true
	}
	lf.clock.Step(3 * loopInterval)
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionHold || lf.wrote(rep) != 0 {
		t.Fatalf("CPU without request rates: action %s (%s), want Hold", o.Action, o.Reason)
	}
	lf.waitForWeights(adapted)
	c := lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)
	if !strings.Contains(c.Message, "requestRate") {
		t.Errorf("the condition should name the missing signal: %q", c.Message)
	}
	lf.assertShortConditions("web")
}

// Issue 15.5: a query that fails for every pod (here invalid PromQL in an override) turns
// MetricsAvailable False, while the weights still use the signals that work.
func TestWeightCycle_AQueryFailingForEveryPodIsReported(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Metrics = &adlbv1.MetricsSpec{Queries: &adlbv1.QueryOverrides{LatencyP99: `histogram_quantile(0.99, sum by (le) (`}}
	})
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite {
		t.Fatalf("the needed signals work: action %s (%s), want Write", o.Action, o.Reason)
	}
	c := lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonQueryFailed)
	if !strings.Contains(c.Message, "latencyP99") {
		t.Errorf("the condition should name the failing query: %q", c.Message)
	}
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonQueryFailed)
	lf.assertShortConditions("web")
}

// Issue 15.4: a stock VictoriaMetrics asked without latency_offset (the fixture's source sends
// none, as --tsdb-latency-offset=none) answers 30 s in the past, so at a short interval (here
// 5 s: stale after 10 s; the same holds at 15 s) every pod looks stale. The condition says so,
// and what to change. TestWeightCycle_ReadsTheNewestDataWithLatencyOffset is the other side.
func TestWeightCycle_ReportsStaleMetrics(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	// Samples up to the wall clock's now, evaluated now: within VictoriaMetrics' latency offset.
	lf.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	lf.loop.Clock = lf.clock
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; lf.wrote(rep) != 0 || o.Decision.Changed {
		t.Fatalf("stale metrics changed the weights: %+v", o)
	}
	c := lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsStale)
	for _, want := range []string{"--tsdb-latency-offset", "-search.latencyOffset", "spec.interval", "30s"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the stale condition should mention %q: %s", want, c.Message)
		}
	}
	lf.assertShortConditions("web")
}

// Issue 13.6: a new leader that takes over during a TSDB outage continues the hold period the
// old one started (seeded from status) instead of resetting the weights at once.
func TestWeightCycle_FailoverDuringAnOutageKeepsHolding(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	adapted := lf.weights()
	lf.eventually("the operator's cache sees MetricsAvailable=True", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := operatorClient.Get(lf.ctx, lf.key(), a); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(a.Status.Conditions, adlbv1.ConditionMetricsAvailable) {
			return errNotYet
		}
		return nil
	})
	lf.vm.Stop()
	src, err := metrics.New(metrics.Config{URL: lf.vm.URL}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	successor := &WeightCycle{
		Client: operatorClient, APIReader: k8s, Source: src, Recorder: record.NewFakeRecorder(100), Clock: lf.clock,
		Metrics: testMetrics, Cycle: NewCycleMetrics(prometheus.NewRegistry()),
		Tick: loopInterval, HoldIntervals: 5, Debounce: pushmodel.DefaultConfig(), Versions: sharedVersions,
	}
	lf.clock.Step(loopInterval)
	rep, err := successor.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionHold {
		t.Fatalf("the new leader's first cycle in the outage: action %s (%s), want Hold", o.Action, o.Reason)
	}
	lf.waitForWeights(adapted)
}

// #13 "Least privilege and tenancy": mode Frozen keeps mirroring at the current weights and
// changes none; a joining pod gets the mirror's median weight.
func TestWeightCycle_FrozenKeepsTheWeights(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	adapted := lf.weights()
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeFrozen })
	lf.clock.Step(3 * loopInterval)
	lf.load([]float64{0.6, 0.6, 0.2, 0.2, 0.2, 0.2}, equalRPS)
	if rep := lf.run(); lf.wrote(rep) != 0 {
		t.Fatalf("a Frozen balancer's weights were written: %+v", rep.Outcomes[lf.key()])
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonFrozen)
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	lf.joinSeventh()
	got := lf.weights()
	for ip, w := range adapted {
		if got[ip] != w {
			t.Errorf("Frozen: %s's weight changed from %d to %d", ip, w, got[ip])
		}
	}
	if got["10.20.0.7"] == 0 {
		t.Error("the joining pod has no weight")
	}
	lf.clock.Step(loopInterval)
	lf.load([]float64{0.6, 0.6, 0.2, 0.2, 0.2, 0.2}, equalRPS)
	if rep := lf.run(); lf.wrote(rep) != 0 {
		t.Fatalf("a Frozen balancer's weights were written: %+v", rep.Outcomes[lf.key()])
	}
}

// listed reports whether the membership record lists the endpoint in the ServiceEntry now.
func (m *Membership) listed(key types.NamespacedName, ip string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.byKey[key]
	if !ok {
		return false
	}
	_, in := log.in[ip]
	return in
}

// waitForMembership waits until the mirror has recorded the endpoint's membership (it does so
// right after the ServiceEntry write the test saw), so that the fake clock moves only after.
func (lf *loopFixture) waitForMembership(ip string, in bool) {
	lf.t.Helper()
	lf.eventually(fmt.Sprintf("membership of %s recorded as %v", ip, in), func() error {
		if sharedMembership.listed(lf.key(), ip) != in {
			return errNotYet
		}
		return nil
	})
}

// followWeights is traffic that follows the weights at equal target shares: 600 rps split by
// weight, each pod's CPU at its cost per request.
func (lf *loopFixture) followWeights(w map[string]int) (cores, rps []float64) {
	total := 0
	for _, ip := range lf.ips {
		total += w[ip]
	}
	for i, ip := range lf.ips {
		rps = append(rps, 600*float64(w[ip])/float64(total))
		cores = append(cores, rps[i]*skewedCores[i]/100)
	}
	return cores, rps
}

// Issue 15.3: a pod whose readiness flaps is out of the ServiceEntry for part of the window and
// serves nothing then. Its rate over the whole window looks like spare capacity; only its time
// in the ServiceEntry may count, so its weight must not rise.
func TestWeightCycle_AFlappingPodDoesNotGainWeight(t *testing.T) {
	requireVM(t)
	// On typed nodes the mirror gives the pod, when it returns, its instance type's median:
	// the weight it had. (On untyped nodes that is the median of all pods.)
	lf := newLoopFixture(t, adlbv1.ModeActive, withInstanceTypes(newFixtureFor(t)))
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	w := lf.weights()
	cores, rps := lf.followWeights(w)
	lf.clock.Step(loopInterval)
	lf.load(cores, rps)
	if rep := lf.run(); lf.wrote(rep) != 0 {
		t.Fatalf("not converged: %+v", rep.Outcomes[lf.key()])
	}

	// Pod 1 turns unready for 4 s of the next 10 s window and serves nothing meanwhile.
	flapping := lf.ips[0]
	endpoints := func(readyFlapping bool) []sliceEndpoint {
		var eps []sliceEndpoint
		for i, ip := range lf.ips {
			e := ready(fmt.Sprintf("web-%d", i+1), ip)
			if ip == flapping && !readyFlapping {
				e.ready, e.serving = false, false
			}
			eps = append(eps, e)
		}
		return eps
	}
	lf.slice("web", "web-x", endpoints(false)...)
	var others []string
	for _, ip := range lf.ips {
		if ip != flapping {
			others = append(others, ip)
		}
	}
	lf.waitForAddresses("web", others...)
	lf.waitForMembership(flapping, false)
	idle, idleCores := append([]float64{}, rps...), append([]float64{}, cores...)
	idle[0], idleCores[0] = 0, 0
	lf.clock.Step(4 * time.Second)
	lf.load(idleCores, idle)
	lf.slice("web", "web-x", endpoints(true)...)
	lf.waitForAddresses("web", lf.ips...)
	lf.waitForMembership(flapping, true)
	lf.clock.Step(6 * time.Second)
	lf.load(cores, rps)

	if share := sharedMembership.Share(lf.key(), flapping, lf.clock.Now().Add(-2*loopInterval), lf.clock.Now()); share != 0.6 {
		t.Fatalf("the mirror recorded the pod in the ServiceEntry for %.2f of the window, want 0.6", share)
	}
	if back := lf.weights()[flapping]; back != w[flapping] {
		t.Fatalf("the mirror gave the returning pod weight %d, want its instance type's median %d", back, w[flapping])
	}
	rep := lf.run()
	o := rep.Outcomes[lf.key()]
	got := o.Decision.Weights()[flapping]
	t.Logf("flapping pod: weight %d before, %d decided (%s); all %v", w[flapping], got, o.Reason, orderedWeights(lf.ips, o.Decision.Weights()))
	if float64(got) > 1.05*float64(w[flapping]) {
		t.Fatalf("the flapping pod's weight rose from %d to %d: its time out of the ServiceEntry was counted as spare capacity", w[flapping], got)
	}
}

// #15 "What the user sees": each weight-cycle decision is logged once at info level, in one
// format (JSON, as the operator's), with the AdaptiveLoadBalancer's key.
func TestWeightCycle_LogsEachDecisionOnceAtInfo(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	var out strings.Builder
	ctx := log.IntoContext(context.Background(), zap.New(zap.WriteTo(&out), zap.UseDevMode(false), zap.Level(zapcore.InfoLevel)))
	runLogged := func() {
		t.Helper()
		if _, err := lf.loop.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		lf.settle()
	}
	lf.load(skewedCores, equalRPS)
	runLogged()
	lf.vm.Stop()
	for range 2 { // two cycles of the same outage: one line
		lf.clock.Step(loopInterval)
		runLogged()
	}

	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("a log line is not JSON: %q", line)
		}
		key, _ := entry["adaptiveLoadBalancer"].(map[string]any)
		if key == nil || key["namespace"] != lf.ns {
			continue // another test's balancer, or a line without a key
		}
		if key["name"] != "web" {
			t.Errorf("line for the wrong object: %q", line)
		}
		if entry["level"] != "info" {
			t.Errorf("a decision logged at %v, want info: %q", entry["level"], line)
		}
		count[entry["msg"].(string)]++
	}
	t.Logf("decisions logged: %v", count)
	written, outage := 0, 0
	for msg, n := range count {
		switch {
		case msg == "weights written":
			written += n
		case strings.HasPrefix(msg, "metrics outage"):
			outage += n
		}
	}
	if written != 1 || outage != 1 {
		t.Fatalf("want one 'weights written' and one 'metrics outage' line, got %v", count)
	}
}

// Issue 15.3, the mirror's side: a pod whose readiness flaps returns to the ServiceEntry at the
// weight it had, not at the median of all pods (what a new pod on an untyped node gets), which
// would send a slow pod ten times its traffic until the next cycle.
func TestMirror_AFlappingPodReturnsAtItsWeight(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.useCapacity()
	lf.load(skewedCores, equalRPS)
	lf.run()
	w := lf.weights()
	slow := lf.ips[5]
	endpoints := func(withSlow bool) []sliceEndpoint {
		var eps []sliceEndpoint
		for i, ip := range lf.ips {
			e := ready(fmt.Sprintf("web-%d", i+1), ip)
			if ip == slow && !withSlow {
				e.ready, e.serving = false, false
			}
			eps = append(eps, e)
		}
		return eps
	}
	lf.slice("web", "web-x", endpoints(false)...)
	lf.waitForAddresses("web", lf.ips[:5]...)
	lf.waitForMembership(slow, false)
	lf.slice("web", "web-x", endpoints(true)...)
	lf.waitForAddresses("web", lf.ips...)
	if got := lf.weights()[slow]; got != w[slow] {
		t.Fatalf("the slow pod came back at weight %d, want the %d it had (weights before %v)", got, w[slow], orderedWeights(lf.ips, w))
	}
}

// The recent peak rate survives a leader change: the leader records it in status.recentPeak,
// and a new leader, which has no history of its own, plans for it until it leaves the window,
// instead of for its first cycle's (quiet) rate.
func TestWeightCycle_ANewLeaderPlansForThePreviousLeadersRecentPeak(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	quietCores, quietRPS := make([]float64, len(skewedCores)), make([]float64, len(equalRPS))
	for i := range quietCores {
		quietCores[i], quietRPS[i] = skewedCores[i]*0.1, equalRPS[i]*0.1
	}
	lf.load(skewedCores, equalRPS) // 600 rps in all
	peakAt := lf.clock.Now()
	lf.run()
	lf.eventually("the operator's cache sees status.recentPeak", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := operatorClient.Get(lf.ctx, lf.key(), a); err != nil {
			return err
		}
		p := a.Status.RecentPeak
		if p == nil {
			return errNotYet
		}
		rate, err := strconv.ParseFloat(string(p.RequestRate), 64)
		if err != nil || math.Abs(rate-600) > 6 || !p.ObservedAt.Time.Equal(peakAt) {
			return fmt.Errorf("recentPeak %s at %s, want 600 at %s", p.RequestRate, p.ObservedAt.Time, peakAt)
		}
		return nil
	})
	// The leader goes; the traffic falls to 60 rps, longer than the metrics window.
	for range 3 {
		lf.clock.Step(loopInterval)
		lf.load(quietCores, quietRPS)
	}
	successor := func() *WeightCycle {
		src, err := metrics.New(metrics.Config{URL: lf.vm.URL}, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return &WeightCycle{
			Client: operatorClient, APIReader: k8s, Source: src, Recorder: record.NewFakeRecorder(100), Clock: lf.clock,
			Metrics: testMetrics, Cycle: NewCycleMetrics(prometheus.NewRegistry()),
			Tick: loopInterval, HoldIntervals: 5, Debounce: pushmodel.DefaultConfig(), Versions: sharedVersions, Membership: sharedMembership,
		}
	}
	rep, err := successor().RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Inputs[lf.key()].RecentPeakRequestRate; math.Abs(got-600) > 6 {
		t.Fatalf("the new leader's first cycle at 60 rps plans for a recent peak of %.1f, want the previous leader's 600", got)
	}

	// Once the recorded peak has left the window, a new leader knows no peak in its first cycle.
	for lf.clock.Now().Sub(peakAt) <= peakRateWindow {
		lf.clock.Step(loopInterval)
		lf.load(quietCores, quietRPS)
	}
	rep, err = successor().RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Inputs[lf.key()].RecentPeakRequestRate; got != 0 {
		t.Fatalf("a new leader %s after the recorded peak plans for a recent peak of %.1f, want 0 (unknown)", lf.clock.Now().Sub(peakAt), got)
	}
}

// A latency-histogram query that fails (here: its answer is larger than the source's response
// limit, as at the largest fleets) leaves the weights to the other signals; it shows in the
// WeightsApplied message, not in Ready, which stays True: the weights are applied.
func TestWeightCycle_AFailedLatencyHistogramQueryIsReportedWithoutFailingReady(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)
	now := lf.clock.Now()
	var b strings.Builder
	for i := range lf.ips {
		for le := 1; le <= 40; le++ {
			b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace=%q,pod="web-%d",le="%d"}`, lf.ns, i+1, le*5), float64(le), now.Add(-time.Minute), now, time.Second))
		}
	}
	lf.vm.ImportText(t, b.String())
	// 240 histogram series answer with tens of kilobytes; each other query's six series with a
	// few. The limit sits between.
	src, err := metrics.New(metrics.Config{URL: lf.vm.URL, MaxResponseBytes: 16 << 10}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lf.loop.Source = src
	rep := lf.run()
	for _, e := range rep.Inputs[lf.key()].Endpoints {
		if len(e.LatencyBuckets) != 0 {
			t.Fatalf("%s got latency buckets though the histogram query should fail at the size limit", e.ID)
		}
	}
	c := lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
	if !strings.Contains(c.Message, "latency-histogram query failed (too_large)") {
		t.Fatalf("WeightsApplied does not report the failed histogram query: %q", c.Message)
	}
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}
