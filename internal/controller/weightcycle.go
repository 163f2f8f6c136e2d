package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/pushmodel"
)

// WeightCycle is the operator's single weight loop: every Tick it fetches the metrics of every
// due AdaptiveLoadBalancer in one batch, runs the weight engine, and writes the changed weights
// as one burst within the budget. Membership stays with the mirror and never waits for it.
type WeightCycle struct {
	Client client.Client
	// APIReader reads the API server directly, after a status write conflict; nil: Client.
	APIReader client.Reader
	Source    metrics.Source
	Recorder  record.EventRecorder
	Clock     clock.WithTicker
	Metrics   *Metrics
	Cycle     *CycleMetrics
	// Tick is the global cycle; an AdaptiveLoadBalancer's interval is rounded up to a multiple.
	Tick time.Duration
	// Budget bounds the weight writes per cycle across the cluster; 0 is unlimited.
	Budget int
	// HoldIntervals is how many intervals the last weights survive a metrics outage.
	HoldIntervals int
	// Debounce is istiod's debounce setting, for the push estimate.
	Debounce pushmodel.Config
	// Versions are the ServiceEntry versions the operator wrote, shared with the mirror: a
	// weight write based on the cache alone would conflict with the mirror's last write under
	// endpoint churn. Nil: the cycle keeps its own.
	Versions *ServiceEntryVersions
	// Membership is the mirror's record of when each endpoint was in its ServiceEntry; the
	// cycle counts an endpoint's signals over that time only. Nil: the whole window.
	Membership *Membership
	// Warmups finds the DestinationRule warm-up of each Service; nil: warm-ups are not read.
	Warmups *WarmupSource
	// Timeout bounds one cycle: gathering, the metrics fetch and the burst of writes. Writes it
	// leaves out are deferred to the next cycle, and the status is still written (under a
	// timeout of its own). 0: DefaultCycleTimeout.
	Timeout time.Duration
	// Activity, if set, counts cycles under way; once it is closed none starts.
	Activity *Activity
	// AllowQueryOverrides lets spec.metrics.queries replace the operator's queries. Off, they are
	// ignored and MetricsAvailable says so: the queries run with the operator's TSDB
	// credentials, and whoever may create an AdaptiveLoadBalancer could otherwise read any
	// series through status, or slow every Service's cycle with costly queries.
	AllowQueryOverrides bool
	// FastCheckInterval is how often, between two cycles, the check reads every pod's newest
	// signals and relieves a pod whose latency or CPU has jumped since the last cycle
	// (relief.go); 0 turns the check off.
	FastCheckInterval time.Duration
	// FastCheckWindow is the window of the check's rates; 0: DefaultFastCheckWindow.
	FastCheckWindow time.Duration
	// History learns each tail Service's surge bound from its own load history; nil: every
	// Service plans with the default bound (or its spec's).
	History *LoadHistories
	// Status writes the statuses off the cycle's path (status_queue.go); nil: the cycle writes
	// them itself, after its weights, under a timeout of their own.
	Status *StatusQueue

	mu        sync.Mutex
	states    map[types.NamespacedName]cycle.State
	lastRun   map[types.NamespacedName]time.Time
	debouncer *pushmodel.Debouncer
	// known holds, per AdaptiveLoadBalancer, the pods (by name) whose weight came from their own metrics:
	// while their metrics are missing they keep their last weight.
	known map[types.NamespacedName]map[string]bool
	// statusThrottle spaces the status writes that only refresh the per-endpoint signals.
	statusThrottle statusThrottle
	// writtenPeak is the status.recentPeak the cycle last wrote for each AdaptiveLoadBalancer:
	// the API server prunes the field under a CRD older than it (crds/ not applied on upgrade),
	// and comparing with the nil it reads back would write the status every cycle.
	writtenPeak map[types.NamespacedName]*adlbv1.RecentPeak
	// writtenSurge is the status.surgeBound the cycle last wrote, for the same reason.
	writtenSurge map[types.NamespacedName]*adlbv1.SurgeBound
	// writtenMu guards writtenPeak and writtenSurge, which the status queue's writes update
	// while a cycle runs.
	writtenMu sync.Mutex
	// weightsWrittenAt is when the cycle last wrote each Service's weights: the next cycle's
	// window counts from it, also while status.lastWeightWrite waits in the status queue.
	weightsWrittenAt map[types.NamespacedName]time.Time
	// rateHistory holds, per AdaptiveLoadBalancer, the Service's request rate of each cycle
	// within the last peakRateWindow, oldest first: the engine plans for their maximum.
	rateHistory map[types.NamespacedName][]rateObservation
	// reliefs is what the checks between cycles and the cycles remember of each Service
	// (relief_memory.go).
	reliefs map[types.NamespacedName]*reliefMemory
	// reliefWrites counts the ServiceEntry slices the reliefs wrote since the last cycle: urgent
	// writes, they count against its budget.
	reliefWrites int
}

// NeedLeaderElection: only the leader writes weights.
func (w *WeightCycle) NeedLeaderElection() bool { return true }

// Start runs the loop until ctx ends (a manager.Runnable): a cycle every Tick and, between them,
// a check every FastCheckInterval, one at a time on this goroutine.
func (w *WeightCycle) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("weight-cycle")
	ctx = log.IntoContext(ctx, logger)
	ticker := w.Clock.NewTicker(w.Tick)
	defer ticker.Stop()
	var checks <-chan time.Time
	if w.FastCheckInterval > 0 {
		checkTicker := w.Clock.NewTicker(w.FastCheckInterval)
		defer checkTicker.Stop()
		checks = checkTicker.C()
	}
	check := func() {
		if _, err := w.RunCheck(ctx); err != nil {
			logger.Error(err, "check between cycles failed; the next one retries")
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-checks:
			check()
		case <-ticker.C():
			// A check due at the same tick goes first, as in the simulator: a jump is relieved
			// on the short window, and the cycle sees that write and waits for a window that
			// shows it.
			select {
			case <-checks:
				check()
			default:
			}
			if _, err := w.RunOnce(ctx); err != nil {
				logger.Error(err, "weight cycle failed; the next tick retries")
			}
		}
	}
}

// CycleReport summarises one cycle, for tests and logs.
type CycleReport struct {
	Due int
	// Writes are when each weight write of the burst completed; Written names their targets.
	Writes   []time.Time
	Written  []types.NamespacedName
	Outcomes map[types.NamespacedName]cycle.Outcome
	// Inputs are what the planner and the engine were given for each due AdaptiveLoadBalancer.
	Inputs map[types.NamespacedName]cycle.Target
	// Failed are the due AdaptiveLoadBalancers whose inputs could not be read, and why.
	Failed map[types.NamespacedName]error
	Pushes int
}

// DefaultCycleTimeout bounds one weight cycle when WeightCycle.Timeout is zero: long enough for
// the largest burst the operator writes (every Service of 10,000 failing open at once, at the
// client's 200 requests per second: 50 s), short enough that a wedged read cannot hold every
// Service's weights for long.
const DefaultCycleTimeout = 2 * time.Minute

func (w *WeightCycle) timeout() time.Duration {
	if w.Timeout > 0 {
		return w.Timeout
	}
	return DefaultCycleTimeout
}

// RunOnce runs one cycle now: gather, fetch, evaluate and plan, write, then hand every target's
// status to the status queue (or write it, without one), each phase timed in
// adaptivelb_weight_cycle_phase_seconds. It returns an error only when the AdaptiveLoadBalancers
// cannot be listed; one target's failure is that target's status. With a status queue, the
// statuses may still be on their way when it returns.
func (w *WeightCycle) RunOnce(ctx context.Context) (CycleReport, error) {
	if !w.Activity.enter() {
		return CycleReport{}, nil // this manager is being replaced
	}
	defer w.Activity.exit()
	start := w.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.states == nil {
		w.states, w.lastRun = map[types.NamespacedName]cycle.State{}, map[types.NamespacedName]time.Time{}
		w.known = map[types.NamespacedName]map[string]bool{}
		w.debouncer = pushmodel.NewDebouncer(w.Debounce)
	}
	logger := log.FromContext(ctx)
	report := CycleReport{Outcomes: map[types.NamespacedName]cycle.Outcome{}, Inputs: map[types.NamespacedName]cycle.Target{}, Failed: map[types.NamespacedName]error{}}
	// The status says what the cycle did, also when its deadline cut it short: handed to the
	// status queue, or written under a timeout of its own.
	statusCtx, cancelStatus := context.WithTimeout(context.WithoutCancel(ctx), w.timeout())
	defer cancelStatus()
	ctx, cancel := context.WithTimeout(ctx, w.timeout())
	defer cancel()

	phases := newPhaseTimer(w.Clock, start)
	g, err := w.dueTargets(ctx, start)
	if err != nil {
		return report, err
	}
	phases.done(PhaseGather)
	for _, t := range g.idle {
		w.writeIdleStatus(statusCtx, t)
	}
	for _, f := range g.failed {
		key := client.ObjectKeyFromObject(f.alb)
		report.Failed[key] = f.err
		logger.Error(f.err, "cannot read this Service's inputs; its weights are left as they are and the next cycle retries", "adaptiveLoadBalancer", key)
		w.writeFailedStatus(statusCtx, f)
	}
	if len(g.idle)+len(g.failed) > 0 {
		phases.done(PhaseStatus)
	}
	due := g.due
	report.Due = len(due)
	deferred := 0
	if len(due) > 0 {
		batches := w.fetch(ctx, start, due)
		phases.done(PhaseFetch)
		w.evaluate(start, due, batches, &report)
		outcomes, prev, next := w.plan(start, due)
		phases.done(PhaseEvaluate)
		deferred = w.writeBurst(ctx, start, due, outcomes, prev, next, &report)
		phases.done(PhaseWrite)
		for i, d := range due {
			w.writeStatus(statusCtx, d, outcomes[i], start)
		}
		phases.done(PhaseStatus)
		// Close the debounce period the burst opened: its push is due once the quiet time passes.
		if len(report.Writes) > 0 {
			last := report.Writes[len(report.Writes)-1]
			report.Pushes += len(w.debouncer.Advance(last.Add(w.debounceAfter())))
		}
	}
	w.Cycle.EstimatedPushes.Add(float64(report.Pushes))
	w.Cycle.DeferredServices.Set(float64(deferred))
	w.Cycle.CycleDuration.Observe(w.Clock.Since(start).Seconds())
	phases.observe(w.Cycle.PhaseDuration)
	// A cycle with nothing due has completed too: the stuck-cycle alert reads this.
	w.Cycle.LastSuccess.Set(float64(w.Clock.Now().Unix()))
	return report, nil
}

func (w *WeightCycle) debounceAfter() time.Duration {
	if w.Debounce.DebounceAfter > 0 {
		return w.Debounce.DebounceAfter
	}
	return pushmodel.DefaultDebounceAfter
}
