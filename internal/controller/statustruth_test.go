package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// namespaceRecorder passes on the events of objects in one namespace only: a weight cycle sees
// every AdaptiveLoadBalancer of the shared cluster, other tests' too.
type namespaceRecorder struct {
	record.EventRecorder
	namespace string
}

func (r namespaceRecorder) ours(o runtime.Object) bool {
	m, err := meta.Accessor(o)
	return err == nil && m.GetNamespace() == r.namespace
}

func (r namespaceRecorder) Event(o runtime.Object, eventType, reason, message string) {
	if r.ours(o) {
		r.EventRecorder.Event(o, eventType, reason, message)
	}
}

func (r namespaceRecorder) Eventf(o runtime.Object, eventType, reason, format string, args ...any) {
	if r.ours(o) {
		r.EventRecorder.Eventf(o, eventType, reason, format, args...)
	}
}

func (r namespaceRecorder) AnnotatedEventf(o runtime.Object, annotations map[string]string, eventType, reason, format string, args ...any) {
	if r.ours(o) {
		r.EventRecorder.AnnotatedEventf(o, annotations, eventType, reason, format, args...)
	}
}

// drainEvents returns the events recorded so far.
func (lf *loopFixture) drainEvents() []string {
	var events []string
	for {
		select {
		case ev := <-lf.events.Events:
			events = append(events, ev)
		default:
			return events
		}
	}
}

// Issue 21.8: a new AdaptiveLoadBalancer whose pods have no metrics yet (the TSDB has not scraped
// them) is awaiting its first metrics, not in an outage: no warning, no fallback, and Ready stays
// True, for as long as the hold time after its creation. Past that the outage is reported.
func TestWeightCycle_ANewServiceAwaitsItsFirstMetricsWithoutWarnings(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.loop.Recorder = namespaceRecorder{EventRecorder: lf.events, namespace: lf.ns}
	// No samples at all: the pods have never been scraped.
	rep := lf.run()
	if o := rep.Outcomes[lf.key()]; o.Fallback || lf.wrote(rep) != 0 {
		t.Fatalf("a new Service without metrics yet: %s (fallback %v): %s", o.Action, o.Fallback, o.Reason)
	}
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionUnknown, adlbv1.ReasonAwaitingMetrics)
	c := lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonEqualWeights)
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	for _, ev := range lf.drainEvents() {
		if strings.HasPrefix(ev, "Warning") {
			t.Errorf("a new Service awaiting its first metrics got a warning: %s", ev)
		}
	}
	t.Logf("WeightsApplied: %s", c.Message)

	// The hold time after its creation has passed without a single usable sample: an outage.
	lf.clock.SetTime(lf.get("web").CreationTimestamp.Add(time.Hour))
	rep = lf.run()
	if o := rep.Outcomes[lf.key()]; lf.wrote(rep) != 0 {
		t.Fatalf("nothing to reset, yet the fallback wrote: %s: %s", o.Action, o.Reason)
	}
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)
	events := lf.drainEvents()
	found := false
	for _, ev := range events {
		found = found || strings.HasPrefix(ev, "Warning "+adlbv1.ReasonMetricsFailed)
		if strings.HasPrefix(ev, "Warning "+EventFallback) {
			t.Errorf("a fallback event for weights that were never adapted: %s", ev)
		}
	}
	if !found {
		t.Errorf("events %q: want a %s warning once the hold time has passed", events, adlbv1.ReasonMetricsFailed)
	}
}

// Issue 21.8: a Frozen AdaptiveLoadBalancer fetches no metrics, so it must not keep reporting a
// metrics outage it can no longer see end: MetricsAvailable says metrics are not fetched, and
// Ready is True (Frozen is deliberate).
func TestWeightCycle_FrozenDoesNotKeepAnOldMetricsOutage(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)
	lf.run()
	lf.vm.Stop()
	lf.clock.Step(loopInterval)
	lf.run()
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonMetricsFailed)

	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.Mode = adlbv1.ModeFrozen })
	lf.clock.Step(loopInterval)
	lf.run()
	lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonFrozen)
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionUnknown, adlbv1.ReasonFrozen)
	lf.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// Issue 21.8: the stuck-cycle alert (AdaptiveLBWeightCycleStuck) reads the last completed
// cycle's time; a cycle that finds nothing due has completed too.
func TestWeightCycle_ACycleWithNothingDueCountsAsCompleted(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.load(skewedCores, equalRPS)
	lf.run() // every AdaptiveLoadBalancer of the cluster is due at a new cycle's first run
	lf.clock.Step(time.Second)
	if rep := lf.run(); rep.Due != 0 {
		t.Fatalf("%d due a second after the last cycle: the scenario needs none", rep.Due)
	}
	if got, want := testutil.ToFloat64(lf.loop.Cycle.LastSuccess), float64(lf.clock.Now().Unix()); got != want {
		t.Fatalf("last success %v after a cycle with nothing due at %v", got, want)
	}
}

// Issue 21.9: the endpoint count in status (the ENDPOINTS column) reaches 0 with the write that
// empties the ServiceEntry, not after the endpoint list's status throttle.
func TestStatus_AnEmptyServiceEntryShowsAtOnce(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	var eps, gone []sliceEndpoint
	var ips []string
	for i := 1; i <= 8; i++ {
		name, ip := fmt.Sprintf("web-%d", i), fmt.Sprintf("10.41.0.%d", i)
		f.pod("web", name, ip)
		eps = append(eps, ready(name, ip))
		gone = append(gone, sliceEndpoint{pod: name, ip: ip})
		ips = append(ips, ip)
	}
	f.slice("web", "web-x", eps...)
	f.alb("web", "web")
	f.waitForAddresses("web", ips...)
	count := func() int32 {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, a); err != nil {
			t.Fatal(err)
		}
		return a.Status.EndpointCount
	}
	f.eventually("status counts 8 endpoints", func() error {
		if n := count(); n != 8 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	f.slice("web", "web-x", gone...) // no endpoint is ready any more
	f.waitForAddresses("web")
	// The status write follows the ServiceEntry's in the same reconcile: a few seconds bound a
	// hung test only, far below the 30 s throttle of endpoint-only status writes.
	deadline := time.Now().Add(5 * time.Second)
	for count() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("status.endpointCount is %d while the ServiceEntry lists none", count())
		}
		time.Sleep(25 * time.Millisecond)
	}
}
