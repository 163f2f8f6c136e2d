package controller

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/pushmodel"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

func requireVM(t *testing.T) {
	t.Helper()
	if os.Getenv("ADAPTIVELB_VMSINGLE_BIN") == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("ADAPTIVELB_VMSINGLE_BIN is not set: run `make test`")
		}
		t.Skip("ADAPTIVELB_VMSINGLE_BIN is not set: run `make test`, which builds VictoriaMetrics")
	}
}

func withCPULimit(cores string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cores)}
	}
}

// loopFixture is a Service of six pods on the real API server, their signals in a real
// VictoriaMetrics, and a weight cycle on a fake clock.
type loopFixture struct {
	*fixture
	vm     *vmtest.Server
	clock  *clocktesting.FakeClock
	loop   *WeightCycle
	events *record.FakeRecorder
	ips    []string

	loadedTo           time.Time
	cpuTotal, reqTotal []float64
	pending            strings.Builder
	// omitCPU and omitRequests stop a pod's CPU or Istio series (by index into ips), as a
	// broken scrape would.
	omitCPU, omitRequests map[int]bool
	// appCores, when set, adds an app_cpu_seconds_total series per pod (another Service's
	// query override reads it).
	appCores []float64
	appTotal []float64
	// latency, when set, adds each pod's server-side latency histogram: per pod (by index into
	// ips), the per-second count of each cumulative bucket (le in ms). Its counters continue
	// across loads, as the request counters do.
	latency      []map[string]float64
	latencyTotal []map[string]float64
}

const loopInterval = 5 * time.Second

// newLoopFixture builds the fixture; podOpts, if given, returns the options of pod i (0-based).
func newLoopFixture(t *testing.T, mode adlbv1.Mode, podOpts ...func(i int) []func(*corev1.Pod)) *loopFixture {
	return newLoopFixtureOf(t, mode, 6, podOpts...)
}

// newLoopFixtureOf is newLoopFixture with pods pods, web-1 to web-<pods> at 10.20.<i/200>.<i%200+1>.
func newLoopFixtureOf(t *testing.T, mode adlbv1.Mode, pods int, podOpts ...func(i int) []func(*corev1.Pod)) *loopFixture {
	requireVM(t)
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	// The cycle's clock runs an hour behind the wall clock: VictoriaMetrics, started with its
	// defaults, answers a query for the last 30 s (-search.latencyOffset) as of 30 s ago, so
	// samples imported for "now" would look stale. TestWeightCycle_ReportsStaleMetrics covers that.
	lf := &loopFixture{fixture: f, vm: vmtest.Start(t), clock: clocktesting.NewFakeClock(time.Now().Add(-time.Hour).Truncate(time.Second)),
		events: record.NewFakeRecorder(1000), omitCPU: map[int]bool{}, omitRequests: map[int]bool{}}
	// The mirror stamps membership changes with the cycle's clock, as both use the real one in the operator.
	sharedMembership.SetClock(lf.clock)
	t.Cleanup(func() { sharedMembership.SetClock(clock.RealClock{}) })
	f.service("web")
	var eps []sliceEndpoint
	for i := 1; i <= pods; i++ {
		name, ip := fmt.Sprintf("web-%d", i), fmt.Sprintf("10.20.%d.%d", (i-1)/200, (i-1)%200+1)
		opts := []func(*corev1.Pod){withCPULimit("2")}
		for _, po := range podOpts {
			opts = append(opts, po(i-1)...)
		}
		f.pod("web", name, ip, opts...)
		eps = append(eps, ready(name, ip))
		lf.ips = append(lf.ips, ip)
	}
	f.slice("web", "web-x", eps...)
	alb := f.alb("web", "web", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Mode = mode
		a.Spec.Interval = &metav1.Duration{Duration: loopInterval}
	})
	// Weight cycles see every AdaptiveLoadBalancer of the cluster: leave none behind whose
	// adapted weights a later test's cycle would reset.
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), alb) })
	f.waitForAddresses("web", lf.ips...)
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	src, err := metrics.New(metrics.Config{URL: lf.vm.URL}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lf.loop = &WeightCycle{
		Client: operatorClient, APIReader: k8s, Source: src, Recorder: lf.events, Clock: lf.clock,
		Metrics: testMetrics, Cycle: NewCycleMetrics(prometheus.NewRegistry()),
		Tick: loopInterval, HoldIntervals: 5, Debounce: pushmodel.DefaultConfig(), Versions: sharedVersions, Membership: sharedMembership,
		AllowQueryOverrides: true, // the tests of overrides act as an admin who allowed them
		// Statuses go through the status queue, as in the operator; run and check wait for it.
		Status: &StatusQueue{Client: operatorClient, Reader: k8s},
	}
	queueCtx, stopQueue := context.WithCancel(context.Background())
	queueDone := make(chan struct{})
	go func() { defer close(queueDone); _ = lf.loop.Status.Start(queueCtx) }()
	t.Cleanup(func() { stopQueue(); <-queueDone })
	return lf
}

// settle waits until the status queue has written what the loop handed it.
func (lf *loopFixture) settle() {
	lf.t.Helper()
	if lf.loop.Status == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lf.loop.Status.WaitIdle(ctx); err != nil {
		lf.t.Fatalf("the status queue did not write what the cycle handed it within a minute: %v", err)
	}
}

// load imports each pod's CPU (cores) and request rate from the previous load (or a minute ago)
// up to the fake clock's now, sampled every second. The counters continue across calls, as a real
// scrape's would: re-importing overlapping samples with other values would garble rate().
func (lf *loopFixture) load(cores, rps []float64) {
	lf.t.Helper()
	now := lf.clock.Now()
	if lf.loadedTo.IsZero() {
		lf.loadedTo = now.Add(-time.Minute)
		lf.cpuTotal, lf.reqTotal, lf.appTotal = make([]float64, len(lf.ips)), make([]float64, len(lf.ips)), make([]float64, len(lf.ips))
		lf.writeSamples(lf.loadedTo)
	}
	for ts := lf.loadedTo.Add(time.Second); !ts.After(now); ts = ts.Add(time.Second) {
		for i := range lf.ips {
			lf.cpuTotal[i] += cores[i]
			lf.reqTotal[i] += rps[i]
			if lf.appCores != nil {
				lf.appTotal[i] += lf.appCores[i]
			}
			if lf.latency != nil {
				if lf.latencyTotal == nil {
					lf.latencyTotal = make([]map[string]float64, len(lf.ips))
				}
				if lf.latencyTotal[i] == nil {
					lf.latencyTotal[i] = map[string]float64{}
				}
				for le, n := range lf.latency[i] {
					lf.latencyTotal[i][le] += n
				}
			}
		}
		lf.writeSamples(ts)
	}
	lf.loadedTo = now
	lf.vm.ImportText(lf.t, lf.pending.String())
	lf.pending.Reset()
}

func (lf *loopFixture) writeSamples(ts time.Time) {
	for i := range lf.ips {
		pod := fmt.Sprintf("web-%d", i+1)
		if !lf.omitCPU[i] {
			fmt.Fprintf(&lf.pending, "container_cpu_usage_seconds_total{namespace=%q,pod=%q,container=\"app\"} %g %d\n", lf.ns, pod, lf.cpuTotal[i], ts.UnixMilli())
		}
		if !lf.omitRequests[i] {
			fmt.Fprintf(&lf.pending, "istio_requests_total{reporter=\"destination\",namespace=%q,pod=%q,response_code=\"200\"} %g %d\n", lf.ns, pod, lf.reqTotal[i], ts.UnixMilli())
		}
		if lf.appCores != nil {
			fmt.Fprintf(&lf.pending, "app_cpu_seconds_total{namespace=%q,pod=%q} %g %d\n", lf.ns, pod, lf.appTotal[i], ts.UnixMilli())
		}
		if lf.latencyTotal != nil {
			for le, n := range lf.latencyTotal[i] {
				fmt.Fprintf(&lf.pending, "istio_request_duration_milliseconds_bucket{reporter=\"destination\",namespace=%q,pod=%q,le=%q} %g %d\n", lf.ns, pod, le, n, ts.UnixMilli())
			}
		}
	}
}

func (lf *loopFixture) key() types.NamespacedName {
	return types.NamespacedName{Namespace: lf.ns, Name: "web"}
}

// wrote counts this fixture's writes in a cycle; other tests' AdaptiveLoadBalancers share the cluster.
func (lf *loopFixture) wrote(rep CycleReport) int {
	n := 0
	for _, k := range rep.Written {
		if k == lf.key() {
			n++
		}
	}
	return n
}

// addService opts in a second Service, name, on the fixture's pods, with the fixture's interval
// and opts' edits, removes it at the end of the test, and waits until it is mirrored.
func (lf *loopFixture) addService(name string, opts ...func(*adlbv1.AdaptiveLoadBalancer)) types.NamespacedName {
	lf.t.Helper()
	lf.service(name, func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} })
	lf.slice(name, name+"-x", lf.allReady()...)
	a := lf.fixture.alb(name, name, append([]func(*adlbv1.AdaptiveLoadBalancer){func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Interval = &metav1.Duration{Duration: loopInterval}
	}}, opts...)...)
	lf.t.Cleanup(func() { _ = k8s.Delete(context.Background(), a) })
	lf.waitForAddresses(name, lf.ips...)
	lf.waitForCondition(name, adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	return types.NamespacedName{Namespace: lf.ns, Name: name}
}

func (lf *loopFixture) run() CycleReport {
	lf.t.Helper()
	rep, err := lf.loop.RunOnce(context.Background())
	if err != nil {
		lf.t.Fatal(err)
	}
	lf.settle()
	return rep
}

// allReady is one ready slice endpoint for each of the fixture's pods.
func (lf *loopFixture) allReady() []sliceEndpoint {
	var eps []sliceEndpoint
	for i, ip := range lf.ips {
		eps = append(eps, ready(fmt.Sprintf("web-%d", i+1), ip))
	}
	return eps
}

// joinSeventh adds a ready seventh pod, web-7 at 10.20.0.7 (opts as for pod), to the Service and
// waits until the ServiceEntry lists it.
func (lf *loopFixture) joinSeventh(opts ...func(*corev1.Pod)) {
	lf.t.Helper()
	lf.pod("web", "web-7", "10.20.0.7", append([]func(*corev1.Pod){withCPULimit("2")}, opts...)...)
	lf.slice("web", "web-x", append(lf.allReady(), ready("web-7", "10.20.0.7"))...)
	lf.waitForAddresses("web", append(append([]string{}, lf.ips...), "10.20.0.7")...)
}

// adapt loads the signals and runs a first cycle, which must write; it returns the weights
// written.
func (lf *loopFixture) adapt(cores, rps []float64) map[string]int {
	lf.t.Helper()
	lf.load(cores, rps)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		lf.t.Fatalf("first cycle: %+v", rep.Outcomes[lf.key()])
	}
	return lf.weights()
}

func (lf *loopFixture) weights() map[string]int {
	lf.t.Helper()
	se, err := lf.serviceEntry("web")
	if err != nil {
		lf.t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range se.Spec.Endpoints {
		out[e.Address] = int(e.Weight)
	}
	return out
}

func (lf *loopFixture) waitForWeights(want map[string]int) {
	lf.t.Helper()
	lf.eventually("ServiceEntry weights", func() error {
		got := lf.weights()
		for ip, w := range want {
			if got[ip] != w {
				return fmt.Errorf("weights %v, want %v", got, want)
			}
		}
		return nil
	})
}

// skewed: pods 5 and 6 cost 3x more CPU per request than the others, at equal traffic.
var (
	skewedCores = []float64{0.2, 0.2, 0.2, 0.2, 0.6, 0.6}
	equalRPS    = []float64{100, 100, 100, 100, 100, 100}
)

func TestWeightCycle_ConvergesToTheEnginesWeightsAndThenStaysQuiet(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)

	rep := lf.run()
	o := rep.Outcomes[types.NamespacedName{Namespace: lf.ns, Name: "web"}]
	if o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		t.Fatalf("first cycle: action %s, %d writes (%s)", o.Action, lf.wrote(rep), o.Reason)
	}
	// The same input through the engine directly: the operator adds nothing of its own.
	var eps []weights.Endpoint
	for i, ip := range lf.ips {
		eps = append(eps, weights.Endpoint{ID: ip, CPUCores: skewedCores[i], RequestRate: equalRPS[i], CPULimitCores: 2, HasMetrics: true, CurrentWeight: 100})
	}
	// The first cycle knows no recent peak (RecentPeakRequestRate 0).
	want, err := weights.Compute(weights.Input{Endpoints: eps}, weights.DefaultSettings(weights.AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	got := lf.weights()
	t.Logf("cycle 0: weights %v, %d write, %d estimated istiod push", orderedWeights(lf.ips, got), lf.wrote(rep), rep.Pushes)
	for _, r := range want.Endpoints {
		if math.Abs(float64(got[r.ID]-r.Weight)) > 0.1*float64(r.Weight) {
			t.Fatalf("weight of %s is %d, the engine computes %d from the same input (all %v)", r.ID, got[r.ID], r.Weight, got)
		}
	}
	for _, fast := range lf.ips[:4] {
		for _, slow := range lf.ips[4:] {
			if got[fast] <= got[slow] {
				t.Fatalf("fast pod %s weight %d not above slow pod %s weight %d", fast, got[fast], slow, got[slow])
			}
		}
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)
	// Status explains each weight with the signals behind it.
	lf.eventually("status shows signals and reasons", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(lf.ctx, lf.key(), a); err != nil {
			return err
		}
		for _, e := range a.Status.Endpoints {
			if e.IP == lf.ips[5] && e.CPUCores == "0.600" && e.RequestRate == "100.0" && e.Reason != "" {
				return nil
			}
		}
		return fmt.Errorf("endpoints %+v", a.Status.Endpoints)
	})
	if rep.Pushes != 1 {
		t.Fatalf("estimated istiod pushes %d, want 1", rep.Pushes)
	}

	// Traffic now follows the weights at equal target shares: steady signals, no more writes.
	total := 0
	for _, w := range got {
		total += w
	}
	rps, cores := make([]float64, 6), make([]float64, 6)
	for i, ip := range lf.ips {
		rps[i] = 600 * float64(got[ip]) / float64(total)
		cores[i] = rps[i] * skewedCores[i] / 100
	}
	var settled *adlbv1.AdaptiveLoadBalancer
	for step := 1; step <= 4; step++ {
		lf.clock.Step(loopInterval)
		lf.load(cores, rps)
		rep := lf.run()
		if lf.wrote(rep) != 0 {
			t.Fatalf("cycle %d after convergence wrote %d times (%+v)", step, lf.wrote(rep), rep.Outcomes[lf.key()])
		}
		// Nor does its status change: nothing that acts changed (issue 31: a status write per
		// Service per cycle was most of what the operator sent the API server).
		now := lf.liveALB()
		if settled != nil && now.ResourceVersion != settled.ResourceVersion {
			t.Errorf("cycle %d after convergence rewrote the status:\nbefore %+v\nafter  %+v", step, settled.Status, now.Status)
		}
		if step >= 2 {
			settled = now
		}
		t.Logf("cycle %d: weights %v, %d writes, %s: %s", step, orderedWeights(lf.ips, lf.weights()), lf.wrote(rep), rep.Outcomes[lf.key()].Action, rep.Outcomes[lf.key()].Reason)
	}
}

func TestWeightCycle_DryRunNeverChangesTheServiceEntry(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeDryRun)
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	o := rep.Outcomes[types.NamespacedName{Namespace: lf.ns, Name: "web"}]
	if o.Action != cycle.ActionDryRun || lf.wrote(rep) != 0 || !o.Decision.Changed {
		t.Fatalf("action %s, %d writes, changed %v", o.Action, lf.wrote(rep), o.Decision.Changed)
	}
	for ip, w := range lf.weights() {
		if w != 100 {
			t.Fatalf("DryRun changed %s's weight to %d", ip, w)
		}
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonDryRun)
	lf.eventually("status publishes the weights it would write", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: "web"}, a); err != nil {
			return err
		}
		for _, e := range a.Status.Endpoints {
			// The slow pod would lose weight; the ServiceEntry keeps 100.
			if e.IP == lf.ips[5] && e.Weight < 100 && e.Reason != "" {
				return nil
			}
		}
		return fmt.Errorf("endpoints %+v", a.Status.Endpoints)
	})
}

func TestWeightCycle_MetricsOutageHoldsThenFallsBackToEqualWeights(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)
	lf.run()
	adapted := lf.weights()
	lf.vm.Stop()

	for step := 1; step <= 4; step++ {
		lf.clock.Step(loopInterval)
		rep := lf.run()
		o := rep.Outcomes[types.NamespacedName{Namespace: lf.ns, Name: "web"}]
		if o.Action != cycle.ActionHold || lf.wrote(rep) != 0 {
			t.Fatalf("outage cycle %d: action %s (%s), want Hold", step, o.Action, o.Reason)
		}
	}
	lf.waitForWeights(adapted)
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)
	// Six failed queries with their PromQL used to make each condition about 3 KB: summaries now.
	lf.assertShortConditions("web")

	lf.clock.Step(loopInterval) // five intervals since the last good metrics
	rep := lf.run()
	o := rep.Outcomes[types.NamespacedName{Namespace: lf.ns, Name: "web"}]
	if !o.Fallback || !o.FallbackStarted || lf.wrote(rep) != 1 {
		t.Fatalf("after the hold time: %+v", o)
	}
	equal := map[string]int{}
	for _, ip := range lf.ips {
		equal[ip] = 100
	}
	lf.waitForWeights(equal)
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonFallback)
	lf.assertShortConditions("web")
	events := lf.drainEvents()
	found := false
	for _, ev := range events {
		found = found || strings.HasPrefix(ev, "Warning "+EventFallback)
	}
	if !found {
		t.Fatalf("events %q: want a %s warning", events, EventFallback)
	}

	// The TSDB comes back (a new server stands in for the restarted one): the loop recovers.
	lf.vm = vmtest.Start(t)
	src, err := metrics.New(metrics.Config{URL: lf.vm.URL}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lf.loop.Source = src
	lf.clock.Step(loopInterval)
	lf.loadedTo = time.Time{} // the new server has no history yet
	lf.load(skewedCores, equalRPS)
	rep = lf.run()
	o = rep.Outcomes[lf.key()]
	if !o.Recovered || o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		t.Fatalf("after the TSDB returned: %+v", o)
	}
	lf.waitForWeights(adapted)
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)
}

func TestWeightCycle_BudgetBurstAndCarryOver(t *testing.T) {
	requireVM(t)
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	vm := vmtest.Start(t)
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	const services, budget = 50, 10
	var b strings.Builder
	now := clk.Now()
	keys := map[types.NamespacedName]bool{}
	for s := 0; s < services; s++ {
		name := fmt.Sprintf("svc-%02d", s)
		f.service(name)
		var eps []sliceEndpoint
		for p := 0; p < 3; p++ {
			pod, ip := fmt.Sprintf("%s-%d", name, p), fmt.Sprintf("10.30.%d.%d", s, p+1)
			f.pod(name, pod, ip, withCPULimit("2"))
			eps = append(eps, ready(pod, ip))
			// The third pod is slower, more so in higher-numbered Services: needs differ.
			cores := 0.2
			if p == 2 {
				cores = 0.2 * (1.2 + float64(s)/10)
			}
			b.WriteString(vmtest.Counter(fmt.Sprintf(`container_cpu_usage_seconds_total{namespace=%q,pod=%q,container="app"}`, f.ns, pod), cores, now.Add(-time.Minute), now.Add(time.Minute), time.Second))
			b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_requests_total{reporter="destination",namespace=%q,pod=%q,response_code="200"}`, f.ns, pod), 100, now.Add(-time.Minute), now.Add(time.Minute), time.Second))
		}
		f.slice(name, name+"-x", eps...)
		alb := f.alb(name, name, func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Interval = &metav1.Duration{Duration: time.Minute} })
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), alb) })
		keys[types.NamespacedName{Namespace: f.ns, Name: name}] = true
	}
	vm.ImportText(t, b.String())
	for s := 0; s < services; s++ {
		f.waitForCondition(fmt.Sprintf("svc-%02d", s), adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	}
	src, err := metrics.New(metrics.Config{URL: vm.URL}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	loop := &WeightCycle{Client: operatorClient, APIReader: k8s, Source: src, Recorder: record.NewFakeRecorder(1000), Clock: clk, Versions: sharedVersions,
		Metrics: testMetrics, Cycle: NewCycleMetrics(prometheus.NewRegistry()), Tick: loopInterval, Budget: budget,
		HoldIntervals: 5, Debounce: pushmodel.DefaultConfig()}

	served := map[types.NamespacedName]int{}
	lastDeferred := -1
	for c := 0; c < 5; c++ {
		rep, err := loop.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ours []types.NamespacedName
		for _, k := range rep.Written {
			if keys[k] {
				ours = append(ours, k)
				served[k] = c
			}
		}
		t.Logf("cycle %d: %d weight writes, %d estimated istiod pushes, %d deferred", c, len(ours), rep.Pushes, countDeferred(rep, keys))
		lastDeferred = countDeferred(rep, keys)
		pending := len(ours) + lastDeferred
		if len(rep.Written) > budget || len(ours) != min(budget, pending) {
			t.Fatalf("cycle %d: %d writes (%d ours) for %d pending; want min(budget %d, pending)", c, len(rep.Written), len(ours), pending, budget)
		}
		// The estimate is istiod's debounce applied to when the writes really landed. How many
		// pushes that is depends on how fast this machine's API server answered, so the test
		// checks the estimate against the model, not against a count (tests never time anything).
		if want := len(pushmodel.Pushes(rep.Writes, pushmodel.DefaultConfig())); rep.Pushes != want || (len(rep.Writes) > 0 && rep.Pushes < 1) {
			t.Fatalf("cycle %d: the burst is reported as %d estimated pushes, istiod's debounce gives %d for writes at %v", c, rep.Pushes, want, rep.Writes)
		}
		// In order of need: nothing deferred needed more than what was written this cycle.
		minWritten := math.Inf(1)
		for _, k := range ours {
			minWritten = math.Min(minWritten, rep.Outcomes[k].Need)
		}
		for k, o := range rep.Outcomes {
			if keys[k] && o.Action == cycle.ActionDeferred && o.Need > minWritten+1e-9 && c == 0 {
				t.Fatalf("cycle 0 deferred %s (need %.3f) but wrote a need of %.3f", k, o.Need, minWritten)
			}
		}
		// Endpoints win: a membership change while writes are deferred reaches the ServiceEntry
		// through the mirror at once, whatever the budget.
		if c == 0 {
			f.slice("svc-49", "svc-49-x", ready("svc-49-0", "10.30.49.1"), ready("svc-49-1", "10.30.49.2"))
			f.waitForAddresses("svc-49", "10.30.49.1", "10.30.49.2")
		}
		clk.Step(loopInterval)
	}
	// Every Service was served, except svc-49 if its membership change (two equal pods left)
	// removed its need before its turn; nothing is still waiting.
	if len(served) < services-1 || lastDeferred != 0 {
		t.Fatalf("%d of %d Services served, %d still deferred after 5 cycles of budget %d", len(served), services, lastDeferred, budget)
	}
}

func countDeferred(rep CycleReport, keys map[types.NamespacedName]bool) int {
	n := 0
	for k, o := range rep.Outcomes {
		if keys[k] && o.Action == cycle.ActionDeferred {
			n++
		}
	}
	return n
}

func orderedWeights(ips []string, w map[string]int) []int {
	out := make([]int, len(ips))
	for i, ip := range ips {
		out[i] = w[ip]
	}
	return out
}

func TestWeightCycle_RespectsTheDestinationRuleWarmup(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.loop.Warmups = startWarmups(t, testConfig, nil)
	dr := &networkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: lf.ns}}
	dr.Spec.Host = "web"
	dr.Spec.TrafficPolicy = &apinetworkingv1.TrafficPolicy{LoadBalancer: &apinetworkingv1.LoadBalancerSettings{
		Warmup: &apinetworkingv1.WarmupConfiguration{Duration: durationpb.New(5 * time.Minute)}}}
	lf.create(dr)
	lf.eventually("the DestinationRule is in the warm-up source's cache", func() error {
		d, err := lf.loop.Warmups.Warmup(lf.ctx, lf.get("web"))
		if err == nil && d != 5*time.Minute {
			err = fmt.Errorf("warm-up %v", d)
		}
		return err
	})
	// The pods start now on the cycle's clock (which runs behind the wall clock).
	for i := range lf.ips {
		pod := &corev1.Pod{}
		if err := k8s.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: fmt.Sprintf("web-%d", i+1)}, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status.StartTime = &metav1.Time{Time: lf.clock.Now()}
		if err := k8s.Status().Update(lf.ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	lf.eventually("the operator's cache sees the start times", func() error {
		pod := &corev1.Pod{}
		if err := operatorClient.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: "web-6"}, pod); err != nil {
			return err
		}
		if !pod.Status.StartTime.Time.Equal(lf.clock.Now()) {
			return errNotYet
		}
		return nil
	})
	lf.load(skewedCores, equalRPS)
	// Every pod started moments ago: Envoy is still ramping them up, so their signals are not
	// trusted and the weights stay equal.
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; lf.wrote(rep) != 0 || o.Decision.Changed {
		t.Fatalf("weights changed during the warm-up: %+v", o)
	}
	lf.clock.Step(6 * time.Minute)
	lf.load(skewedCores, equalRPS)
	if rep := lf.run(); lf.wrote(rep) != 1 {
		t.Fatalf("after the warm-up: %+v", rep.Outcomes[lf.key()])
	}
}

// The engine plans for the Service's peak rate of the last ten minutes, summed over its pods and
// kept across cycles, not for the rate of a quiet spell; a peak older than that is forgotten.
func TestWeightCycle_PlansForTheRecentPeakRate(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	scaled := func(f float64) ([]float64, []float64) {
		cores, rps := make([]float64, len(skewedCores)), make([]float64, len(equalRPS))
		for i := range cores {
			cores[i], rps[i] = skewedCores[i]*f, equalRPS[i]*f
		}
		return cores, rps
	}
	peakOf := func(rep CycleReport) float64 {
		in, ok := rep.Inputs[lf.key()]
		if !ok {
			t.Fatalf("the cycle gave the engine no input for %s", lf.key())
		}
		return in.RecentPeakRequestRate
	}
	lf.load(scaled(1)) // 600 rps in all
	// One rate tells nothing of how the load varies: the first cycle leaves the peak unknown, and
	// the engine plans with its margin for an unknown peak.
	if got := peakOf(lf.run()); got != 0 {
		t.Fatalf("first cycle at 600 rps: recent peak %.1f, want 0 (unknown)", got)
	}
	lf.clock.Step(loopInterval)
	lf.load(scaled(1))
	if got := peakOf(lf.run()); math.Abs(got-600) > 6 {
		t.Fatalf("second cycle at 600 rps: recent peak %.1f, want 600", got)
	}
	// A quiet spell: 60 rps, longer than the metrics window, so the windowed rate is 60.
	quietCores, quietRPS := scaled(0.1)
	for range 3 {
		lf.clock.Step(loopInterval)
		lf.load(quietCores, quietRPS)
	}
	rep := lf.run()
	var current float64
	for _, e := range rep.Inputs[lf.key()].Endpoints {
		current += e.RequestRate
	}
	if math.Abs(current-60) > 1 {
		t.Fatalf("quiet cycle: the endpoints' rates sum to %.1f, want 60", current)
	}
	if got := peakOf(rep); math.Abs(got-600) > 6 {
		t.Fatalf("quiet cycle after a 600 rps cycle: recent peak %.1f, want the 600 of the earlier cycle", got)
	}
	// Ten minutes of quiet cycles later the 600 rps cycle has left the window: the peak is the
	// quiet rate.
	for range int((peakRateWindow + loopInterval) / loopInterval) {
		lf.clock.Step(loopInterval)
		lf.load(quietCores, quietRPS)
		lf.run()
	}
	lf.clock.Step(loopInterval)
	lf.load(quietCores, quietRPS)
	if got := peakOf(lf.run()); math.Abs(got-60) > 1 {
		t.Fatalf("after %s at 60 rps: recent peak %.1f, want 60", peakRateWindow, got)
	}
}

// Each pod's server-side latency histogram reaches the engine: cumulative counts over the
// metrics window, bounds in seconds.
func TestWeightCycle_GivesTheEngineEachPodsLatencyHistogram(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)
	now := lf.clock.Now()
	var b strings.Builder
	// web-1: 60 rps within 5 ms, 90 within 25 ms, all 100 within 100 ms.
	for le, rate := range map[string]float64{"5": 60, "25": 90, "100": 100, "+Inf": 100} {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`istio_request_duration_milliseconds_bucket{reporter="destination",namespace=%q,pod="web-1",le=%q}`, lf.ns, le), rate, now.Add(-time.Minute), now, time.Second))
	}
	lf.vm.ImportText(t, b.String())
	rep := lf.run()
	window := (2 * loopInterval).Seconds()
	want := []weights.LatencyBucket{{UpperBoundSeconds: 0.005, Count: 60 * window}, {UpperBoundSeconds: 0.025, Count: 90 * window}, {UpperBoundSeconds: 0.1, Count: 100 * window}, {UpperBoundSeconds: math.Inf(1), Count: 100 * window}}
	found := false
	for _, e := range rep.Inputs[lf.key()].Endpoints {
		if e.ID != lf.ips[0] {
			if len(e.LatencyBuckets) != 0 {
				t.Errorf("%s has no histogram series, yet the engine got buckets %v", e.ID, e.LatencyBuckets)
			}
			continue
		}
		found = true
		if len(e.LatencyBuckets) != len(want) {
			t.Fatalf("web-1's buckets %v, want %v", e.LatencyBuckets, want)
		}
		for i, got := range e.LatencyBuckets {
			if got.UpperBoundSeconds != want[i].UpperBoundSeconds || math.Abs(got.Count-want[i].Count) > 0.02*want[i].Count {
				t.Errorf("web-1's bucket %d is %+v, want %+v (all %v)", i, got, want[i], e.LatencyBuckets)
			}
		}
	}
	if !found {
		t.Fatalf("the engine's input has no endpoint %s: %+v", lf.ips[0], rep.Inputs[lf.key()])
	}
}

// The engine learns each pod's node CPU count from the node's allocatable CPU, kept in the
// operator's trimmed node cache; a node without it leaves the count unknown (0).
func TestWeightCycle_GivesTheEngineTheNodesAllocatableCPU(t *testing.T) {
	requireVM(t)
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-cpu8", Labels: map[string]string{"topology.kubernetes.io/region": "eu-west", "topology.kubernetes.io/zone": "eu-west-1a"}}}
	if err := k8s.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), node) })
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	if err := k8s.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	// web-1 runs on the 8-CPU node, the others on node-a, which reports no allocatable CPU.
	lf := newLoopFixture(t, adlbv1.ModeActive, func(i int) []func(*corev1.Pod) {
		if i != 0 {
			return nil
		}
		return []func(*corev1.Pod){func(p *corev1.Pod) { p.Spec.NodeName = node.Name }}
	})
	lf.eventually("the operator's cache has the node's allocatable CPU", func() error {
		cached := &corev1.Node{}
		if err := operatorClient.Get(ctx, types.NamespacedName{Name: node.Name}, cached); err != nil {
			return err
		}
		if cpu := cached.Status.Allocatable.Cpu(); cpu.IsZero() {
			return fmt.Errorf("cached node status %+v", cached.Status)
		}
		if _, kept := cached.Status.Allocatable[corev1.ResourceMemory]; kept {
			return fmt.Errorf("the cache keeps more of the node than its CPU: %+v", cached.Status.Allocatable)
		}
		return nil
	})
	lf.load(skewedCores, equalRPS)
	rep := lf.run()
	in, ok := rep.Inputs[lf.key()]
	if !ok || len(in.Endpoints) != len(lf.ips) {
		t.Fatalf("engine input %+v", in)
	}
	for _, e := range in.Endpoints {
		want := 0.0
		if e.ID == lf.ips[0] {
			want = 8
		}
		if e.NodeCPUCores != want {
			t.Errorf("%s: NodeCPUCores %v, want %v", e.ID, e.NodeCPUCores, want)
		}
	}
}

// A cycle that decided while the ServiceEntry existed must not report on weights after the
// mirror has deleted it (here the Service became unsupported meanwhile): WeightsApplied stays
// the mirror's NoServiceEntry, not "applied" or "the ServiceEntry keeps its weights".
func TestWeightCycle_StatusAfterTheMirrorDeletedTheServiceEntrySaysNoServiceEntry(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.run() // initialises the cycle's state
	lf.clock.Step(loopInterval)
	lf.loop.mu.Lock()
	g, err := lf.loop.dueTargets(context.Background(), lf.clock.Now())
	lf.loop.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var d *dueTarget
	for _, x := range g.due {
		if x.key == lf.key() {
			d = x
		}
	}
	if d == nil {
		t.Fatal("the fixture's AdaptiveLoadBalancer is not due")
	}

	// Meanwhile the Service changes into a shape the mirror cannot serve: it deletes the
	// ServiceEntry and says so.
	svc := &corev1.Service{}
	if err := k8s.Get(lf.ctx, types.NamespacedName{Namespace: lf.ns, Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Selector = nil
	if err := k8s.Update(lf.ctx, svc); err != nil {
		t.Fatal(err)
	}
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)

	lf.loop.mu.Lock()
	lf.loop.writeStatus(context.Background(), d, cycle.Outcome{Action: cycle.ActionWrite, Reason: "weights from the engine"}, lf.clock.Now())
	lf.loop.mu.Unlock()
	lf.settle()
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(lf.ctx, lf.key(), alb); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionWeightsApplied); c == nil || c.Reason != adlbv1.ReasonNoServiceEntry {
		t.Fatalf("WeightsApplied after the ServiceEntry was deleted: %+v", c)
	}
	if alb.Status.LastWeightWrite != nil {
		t.Fatalf("lastWeightWrite %v for a ServiceEntry that is gone", alb.Status.LastWeightWrite)
	}
}
