package controller

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// The load history in the fixture: three hours of the Service's request rate, scraped every 15 s.
const (
	historySpan   = 3 * time.Hour
	historyScrape = 15 * time.Second
)

// newHistoryFixture is the loop fixture (tail, the default) learning surge bounds from the
// fixture's VictoriaMetrics.
func newHistoryFixture(t *testing.T) *loopFixture {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	lf.loop.History = &LoadHistories{Source: lf.historySource(lf.vm.URL), Clock: lf.clock, Span: historySpan, Refresh: time.Hour,
		ScrapeInterval: historyScrape, DataLag: 4 * time.Second}
	return lf
}

func (lf *loopFixture) historySource(url string) metrics.HistorySource {
	lf.t.Helper()
	src, err := metrics.New(metrics.Config{URL: url}, prometheus.NewRegistry())
	if err != nil {
		lf.t.Fatal(err)
	}
	return src.(metrics.HistorySource)
}

// importHistory writes the Service's request counter, as its pods' sidecars report it by the
// Service's labels, every scrape over the history span before the fixture's now, at rate(t).
// The series carries no pod or namespace label: the per-pod queries do not see it.
func (lf *loopFixture) importHistory(rate func(time.Time) float64) {
	lf.t.Helper()
	now := lf.clock.Now()
	var b strings.Builder
	total := 0.0
	for ts := now.Add(-historySpan - 5*time.Minute); !ts.After(now); ts = ts.Add(historyScrape) {
		fmt.Fprintf(&b, "istio_requests_total{reporter=\"destination\",destination_service_namespace=%q,destination_service_name=\"web\",response_code=\"200\"} %g %d\n", lf.ns, total, ts.UnixMilli())
		total += rate(ts) * historyScrape.Seconds()
	}
	lf.vm.ImportText(lf.t, b.String())
}

// surgeBound waits for status.surgeBound to satisfy ok, and returns it.
func (lf *loopFixture) surgeBound(what string, ok func(*adlbv1.SurgeBound) bool) *adlbv1.SurgeBound {
	lf.t.Helper()
	var sb *adlbv1.SurgeBound
	lf.eventually("status.surgeBound "+what, func() error {
		sb = lf.alb().Status.SurgeBound
		if sb == nil || !ok(sb) {
			return fmt.Errorf("status.surgeBound %+v", sb)
		}
		return nil
	})
	return sb
}

// historyReads reads the queued histories and returns how many of them were the fixture's (the
// cycle sees every AdaptiveLoadBalancer of the shared cluster).
func (lf *loopFixture) historyReads() int {
	lf.t.Helper()
	n := 0
	for _, k := range lf.loop.History.RunPending(lf.ctx) {
		if k == lf.key() {
			n++
		}
	}
	return n
}

// cycleAfter steps the clock by d, loads the fixture's steady signals and runs a cycle.
func (lf *loopFixture) cycleAfter(d time.Duration) CycleReport {
	lf.t.Helper()
	lf.clock.Step(d)
	lf.load(evenCores, equalRPS)
	return lf.run()
}

func factorOf(t *testing.T, sb *adlbv1.SurgeBound) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(string(sb.Factor), 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A Service whose load never rose beyond the planning margin gets no surge bound (1): the model's
// split. Until its history is read it plans with the default, and says so; the history is read
// again when its spec changes, and not before Refresh otherwise.
func TestSurgeBound_AFlatHistoryNeedsNoBound(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.importHistory(func(time.Time) float64 { return 600 })
	lf.load(evenCores, equalRPS)
	rep := lf.run()
	if in := rep.Inputs[lf.key()]; in.SurgeFactor != 0 {
		t.Fatalf("before the history is read the engine gets surge factor %v, want 0 (the default)", in.SurgeFactor)
	}
	lf.surgeBound("the default until the history is read", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "4.00" && sb.Reason == "load history not read yet: the default surge bound 4×" && sb.LearnedAt == nil
	})
	if n := lf.historyReads(); n != 1 {
		t.Fatalf("%d history reads pending after the first cycle, want 1", n)
	}
	rep = lf.cycleAfter(loopInterval)
	in := rep.Inputs[lf.key()]
	if in.SurgeFactor != 1 || !in.LoadHistory.Known() {
		t.Fatalf("with a flat history the engine gets surge factor %v and history %+v; want 1 and a known history", in.SurgeFactor, in.LoadHistory)
	}
	sb := lf.surgeBound("learned: none", func(sb *adlbv1.SurgeBound) bool { return sb.Factor == "1.00" })
	if !strings.Contains(sb.Reason, "never rose more than") || !strings.Contains(sb.Reason, "no surge bound") || sb.LearnedAt == nil || sb.MaxRise == nil {
		t.Fatalf("status.surgeBound %+v: want the reason of a history that never rose, when and how far", sb)
	}
	if sb.HistorySeconds == nil || math.Abs(float64(*sb.HistorySeconds)-historySpan.Seconds()) > 120 {
		t.Fatalf("status.surgeBound.historySeconds %v, want about %v", sb.HistorySeconds, historySpan.Seconds())
	}

	// Within the refresh and with the spec unchanged, no read; a spec change reads again.
	lf.cycleAfter(loopInterval)
	if n := lf.historyReads(); n != 0 {
		t.Fatalf("%d history reads within the refresh of an unchanged Service, want 0", n)
	}
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.MinWeight = ptrTo(int32(2)) })
	lf.cycleAfter(loopInterval)
	if n := lf.historyReads(); n != 1 {
		t.Fatalf("%d history reads after a spec change, want 1", n)
	}
}

// A Service whose load has jumped fourfold for a minute every half hour plans with the bound its
// history needs: twice the largest rise, over the planning margin.
func TestSurgeBound_SurgesInTheHistoryGiveTheBoundTheyNeed(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.importHistory(func(ts time.Time) float64 {
		if ts.Unix()%1800 < 60 {
			return 400
		}
		return 100
	})
	lf.load(evenCores, equalRPS)
	lf.run()
	lf.historyReads()
	rep := lf.cycleAfter(loopInterval)
	in := rep.Inputs[lf.key()]
	// A 15 s rate of a burst to 400 rps less five standard deviations of its counting noise
	// (about 26 rps) over a recent peak of 100 rps.
	if rise := in.LoadHistory.MaxRise; rise < 3.5 || rise > 4 {
		t.Fatalf("the history's largest rise is %.2f; the bursts go from 100 to 400 rps", rise)
	}
	want, why := weights.SurgeBound(weights.DefaultSettings(weights.AlgorithmTail).Tail, in.LoadHistory)
	if in.SurgeFactor != want {
		t.Fatalf("the engine gets surge factor %v, want %v (%s)", in.SurgeFactor, want, why)
	}
	sb := lf.surgeBound("learned from the bursts", func(sb *adlbv1.SurgeBound) bool { return sb.LearnedAt != nil })
	if f := factorOf(t, sb); math.Abs(f-want) > 0.01 || !strings.HasPrefix(sb.Reason, why) || !strings.Contains(sb.Reason, "rose up to") || !strings.Contains(sb.Reason, "; planning margin 1.1× over the recent peak") {
		t.Fatalf("status.surgeBound %+v, want factor %.2f with the reason %q", sb, want, why)
	}
}

// A new Service, without history in the TSDB, plans with today's default bound, and says so.
func TestSurgeBound_AServiceWithoutHistoryGetsTheDefault(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.load(evenCores, equalRPS)
	lf.run()
	if n := lf.historyReads(); n != 1 {
		t.Fatalf("%d reads, want 1", n)
	}
	rep := lf.cycleAfter(loopInterval)
	if in := rep.Inputs[lf.key()]; in.SurgeFactor != 4 || in.LoadHistory.Known() {
		t.Fatalf("without history the engine gets surge factor %v and history %+v; want 4 and none", in.SurgeFactor, in.LoadHistory)
	}
	lf.surgeBound("the default without history", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "4.00" && sb.Reason == "no load history: the default surge bound 4×" && sb.LearnedAt != nil && sb.MaxRise == nil
	})
}

// spec.tail.surgeFactor wins over what the history says.
func TestSurgeBound_TheSpecsSurgeFactorWins(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.importHistory(func(time.Time) float64 { return 600 })
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Tail = &adlbv1.TailParameters{SurgeFactor: ptrTo(adlbv1.Decimal("2.5"))}
	})
	lf.load(evenCores, equalRPS)
	lf.run()
	lf.historyReads()
	rep := lf.cycleAfter(loopInterval)
	in := rep.Inputs[lf.key()]
	if in.SurgeFactor != 0 || in.Settings.Tail.SurgeFactor != 2.5 {
		t.Fatalf("the engine gets surge factor %v over settings' %v; want the spec's 2.5 through the settings", in.SurgeFactor, in.Settings.Tail.SurgeFactor)
	}
	if in.LoadHistory.Known() {
		t.Fatalf("the engine plans with the history %+v although the spec sets the surge factor", in.LoadHistory)
	}
	lf.surgeBound("the spec's", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "2.50" && sb.Reason == ReasonSurgeFromSpec
	})
}

// spec.tail.burstMargin is the user's margin over the recent peak: a flat history still lowers the
// surge bound to 1, but does not lower the margin the user set.
func TestSurgeBound_TheSpecsBurstMarginIsNotLoweredByTheHistory(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.importHistory(func(time.Time) float64 { return 600 })
	lf.updateALB("web", func(a *adlbv1.AdaptiveLoadBalancer) {
		a.Spec.Tail = &adlbv1.TailParameters{BurstMargin: ptrTo(adlbv1.Decimal("1.3"))}
	})
	lf.load(evenCores, equalRPS)
	lf.run()
	lf.historyReads()
	rep := lf.cycleAfter(loopInterval)
	in := rep.Inputs[lf.key()]
	if in.SurgeFactor != 1 || in.Settings.Tail.BurstMargin != 1.3 || in.LoadHistory.Known() {
		t.Fatalf("the engine gets surge factor %v, margin %v and history %+v; want 1 from the flat history, the spec's 1.3 and no history to lower it", in.SurgeFactor, in.Settings.Tail.BurstMargin, in.LoadHistory)
	}
	lf.surgeBound("learned, with the spec's margin", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "1.00" && strings.HasSuffix(sb.Reason, "; planning margin 1.3× over the recent peak, set in spec.tail.burstMargin")
	})
}

// A history the TSDB cannot serve never stops the cycle: it plans with the default until a read
// succeeds, then with the bound learned, which stays when a later read fails; the status says
// which, and why.
func TestSurgeBound_AFailingHistoryReadLeavesTheCycleRunningAndSaysWhy(t *testing.T) {
	lf := newHistoryFixture(t)
	lf.importHistory(func(time.Time) float64 { return 600 })
	working := lf.loop.History.Source
	refused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"status":"error","errorType":"internal","error":"storage unavailable"}`, http.StatusServiceUnavailable)
	}))
	defer refused.Close()
	lf.loop.History.Source = lf.historySource(refused.URL)
	lf.loop.History.Refresh = 6 * time.Minute // retries after 5 minutes

	lf.load(evenCores, equalRPS)
	lf.run()
	lf.historyReads()
	rep := lf.cycleAfter(loopInterval)
	if o := rep.Outcomes[lf.key()]; o.Err != nil || rep.Inputs[lf.key()].SurgeFactor != 0 {
		t.Fatalf("with the history unreadable the cycle: %+v, surge factor %v; want it planned with the default", o, rep.Inputs[lf.key()].SurgeFactor)
	}
	lf.surgeBound("the default, the history unreadable", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "4.00" && strings.HasPrefix(sb.Reason, "load history unreadable (") && strings.Contains(sb.Reason, "storage unavailable") &&
			strings.HasSuffix(sb.Reason, "the default surge bound 4× until a read succeeds")
	})
	lf.waitForCondition("web", adlbv1.ConditionMetricsAvailable, metav1.ConditionTrue, adlbv1.ReasonMetricsOK)

	// The TSDB serves it again after the retry delay: the bound is learned.
	lf.loop.History.Source = working
	lf.cycleAfter(historyRetry)
	if n := lf.historyReads(); n != 1 {
		t.Fatalf("%d reads after the retry delay, want 1", n)
	}
	lf.cycleAfter(loopInterval)
	lf.surgeBound("learned", func(sb *adlbv1.SurgeBound) bool { return sb.Factor == "1.00" && !strings.Contains(sb.Reason, "failed") })

	// A refresh fails: the bound learned stays, and says the last read failed.
	lf.loop.History.Source = lf.historySource(refused.URL)
	lf.cycleAfter(lf.loop.History.Refresh)
	lf.historyReads()
	rep = lf.cycleAfter(loopInterval)
	if in := rep.Inputs[lf.key()]; in.SurgeFactor != 1 {
		t.Fatalf("after a failed refresh the engine gets surge factor %v, want the 1 learned before", in.SurgeFactor)
	}
	lf.surgeBound("kept after a failed refresh", func(sb *adlbv1.SurgeBound) bool {
		return sb.Factor == "1.00" && strings.Contains(sb.Reason, "the last read of the history since failed (") && strings.Contains(sb.Reason, "storage unavailable")
	})
}

// A read that hangs never holds a cycle: the cycle runs, with the default, while the read waits.
func TestSurgeBound_AHangingHistoryReadNeverHoldsTheCycle(t *testing.T) {
	lf := newHistoryFixture(t)
	asked, release := make(chan struct{}, 1), make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		<-release
	}))
	defer hanging.Close()
	defer close(release)
	src, err := metrics.New(metrics.Config{URL: hanging.URL, Timeout: time.Hour}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lf.loop.History.Source = src.(metrics.HistorySource)
	lf.load(evenCores, equalRPS)
	lf.run()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lf.loop.History.RunPending(ctx)
	}()
	defer func() { cancel(); <-done }()
	<-asked // the read is under way, and hangs
	rep := lf.cycleAfter(loopInterval)
	select {
	case <-done:
		t.Fatal("the history read ended before the cycle did: the cycle waited for it")
	default:
	}
	if _, ok := rep.Outcomes[lf.key()]; !ok || rep.Inputs[lf.key()].SurgeFactor != 0 {
		t.Fatalf("the cycle while the history read hangs: %+v; want it planned with the default", rep.Outcomes[lf.key()])
	}
}
