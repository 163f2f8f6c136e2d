package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// LoadHistories learns how fast each tail Service's load has risen before, from its request rate
// over the last days in the TSDB (weights.LearnLoadHistory), for the surge bound it plans with
// (surgebound.go). The reads are slow next to a cycle (two range queries of thousands of points
// per Service) and their answer changes over hours, so they run on a goroutine of their own,
// refreshed at most every Refresh per Service and when its spec changes: the cycle asks for the
// last history learned and never waits for one, nor for a query that fails or hangs.
type LoadHistories struct {
	Source metrics.HistorySource
	Clock  clock.PassiveClock
	// Span is how much history is read; 0 turns learning off.
	Span time.Duration
	// Refresh is how often a Service's history is read again.
	Refresh time.Duration
	// ScrapeInterval is how often the TSDB samples the sidecars: the step of the short rates,
	// and the shortest window in which a burst shows.
	ScrapeInterval time.Duration
	// DataLag is how old the newest data the cycle reads is: the TSDB's latency offset, or the
	// delay from a scrape to its visibility when that is longer.
	DataLag time.Duration

	mu      sync.Mutex
	learned map[types.NamespacedName]*learnedHistory
	queue   []historyJob
	wake    chan struct{}
}

// historyJob is one Service's history to read, and what it is read for.
type historyJob struct {
	key        types.NamespacedName
	uid        types.UID
	service    string
	interval   time.Duration
	generation int64
}

// learnedHistory is what the last reads of one Service's history gave.
type learnedHistory struct {
	// job is what the history was learned for; at is when (zero: never).
	job     historyJob
	history weights.LoadHistory
	at      time.Time
	// err is the last read's failure, at failedAt; nil once a read succeeds.
	err      error
	failedAt time.Time
	// tried is the job of the last read, whether it failed or not.
	tried historyJob
	// queued is set while a read is pending.
	queued bool
	// asked is the job the cycle last asked for.
	asked historyJob
}

// historyState is what the cycle gets: the last history learned for the Service in its current
// shape, and the last failure to read it since.
type historyState struct {
	history   weights.LoadHistory
	learnedAt time.Time
	err       error
}

// historyRetry is how soon a failed read is tried again (at most Refresh).
const historyRetry = 5 * time.Minute

// historyTimeout bounds one Service's reads (two queries, each in chunks).
const historyTimeout = time.Minute

// peakHorizon is the recent peak the weight cycle plans for (peakRateWindow): a rise above the
// highest rate of the horizon before it is what the planning load did not cover.
var peakHorizon = peakRateWindow

// NeedLeaderElection: only the leader's cycles plan from it.
func (h *LoadHistories) NeedLeaderElection() bool { return true }

// Start reads the queued histories until ctx ends (a manager.Runnable).
func (h *LoadHistories) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("load-history")
	ctx = log.IntoContext(ctx, logger)
	for {
		h.RunPending(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-h.wakeup():
		}
	}
}

func (h *LoadHistories) wakeup() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wake == nil {
		h.wake = make(chan struct{}, 1)
	}
	return h.wake
}

// On reports whether histories are learned at all.
func (h *LoadHistories) On() bool { return h != nil && h.Span > 0 && h.Source != nil }

// State returns what is known of alb's history for a cycle at now with interval, and queues a
// read when none was made for its current shape, the last is older than Refresh, or the last
// failed more than historyRetry ago. It never waits for a read.
func (h *LoadHistories) State(alb *adlbv1.AdaptiveLoadBalancer, interval time.Duration, now time.Time) historyState {
	if !h.On() {
		return historyState{}
	}
	job := historyJob{key: types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}, uid: alb.UID, service: alb.Spec.TargetRef.Name, interval: interval, generation: alb.Generation}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.learned == nil {
		h.learned = map[types.NamespacedName]*learnedHistory{}
	}
	l, ok := h.learned[job.key]
	if !ok || l.asked.uid != job.uid || l.asked.service != job.service {
		// Another Service's history (a new object of the same name, another target) says
		// nothing of this one.
		l = &learnedHistory{}
		h.learned[job.key] = l
	}
	l.asked = job
	due := l.tried != job || // never read, or read for another spec
		l.err == nil && now.Sub(l.at) >= h.Refresh ||
		l.err != nil && now.Sub(l.failedAt) >= min(h.Refresh, historyRetry)
	if due && !l.queued {
		l.queued = true
		h.queue = append(h.queue, job)
		if h.wake == nil {
			h.wake = make(chan struct{}, 1)
		}
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return historyState{history: l.history, learnedAt: l.at, err: l.err}
}

// RunPending reads every queued history, one after the other, and returns whose it read.
func (h *LoadHistories) RunPending(ctx context.Context) []types.NamespacedName {
	var read []types.NamespacedName
	for ctx.Err() == nil {
		h.mu.Lock()
		if len(h.queue) == 0 {
			h.mu.Unlock()
			return read
		}
		job := h.queue[0]
		h.queue = h.queue[1:]
		h.mu.Unlock()
		history, err := h.read(ctx, job)
		read = append(read, job.key)
		h.mu.Lock()
		if l, ok := h.learned[job.key]; ok && l.asked.uid == job.uid && l.asked.service == job.service {
			l.queued, l.tried = false, job
			if err != nil {
				l.err, l.failedAt = err, h.Clock.Now()
			} else {
				l.job, l.history, l.at, l.err, l.failedAt = job, history, h.Clock.Now(), nil, time.Time{}
			}
		}
		h.mu.Unlock()
		if err != nil {
			log.FromContext(ctx).Error(err, "cannot read the load history; the surge bound stays the last learned or the default, and the read is retried", "adaptiveLoadBalancer", job.key, "retryAfter", min(h.Refresh, historyRetry).String())
		}
	}
	return read
}

// read learns one Service's history: its rate over the cycles' window at every interval (what
// the cycles plan with) and over one scrape at every scrape (how high a short burst went).
func (h *LoadHistories) read(ctx context.Context, job historyJob) (weights.LoadHistory, error) {
	ctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	end := h.Clock.Now()
	window := 2 * job.interval
	req := metrics.HistoryRequest{Namespace: job.key.Namespace, Service: job.service, Start: end.Add(-h.Span), End: end, Step: job.interval, Window: window}
	planned, err := h.Source.RateHistory(ctx, req)
	if err != nil {
		return weights.LoadHistory{}, fmt.Errorf("read the load history of Service %s/%s: %w", job.key.Namespace, job.service, err)
	}
	// irate takes the last two samples of its window: four scrapes hold two on any TSDB.
	req.Step, req.Window, req.Instant = h.ScrapeInterval, max(window, 4*h.ScrapeInterval), true
	short, err := h.Source.RateHistory(ctx, req)
	if err != nil {
		return weights.LoadHistory{}, fmt.Errorf("read the load history of Service %s/%s: %w", job.key.Namespace, job.service, err)
	}
	series := weights.HistorySeries{Planned: rateSamples(planned), Short: rateSamples(short), ShortSeconds: h.ScrapeInterval.Seconds()}
	return weights.LearnLoadHistory(series, h.reaction(job.interval).Seconds(), peakHorizon.Seconds(), weights.MinHistorySeconds(h.Span.Seconds())), nil
}

// reaction is how long the weights a cycle decides must carry the load before the next cycle's
// replace them: half a window (a window's average lags its end), the data's lag, the next cycle
// and the push. The rate projection looks as far ahead (projectedRate), and the simulator's
// controller measures rises over the same (internal/sim, reactionSeconds).
func (h *LoadHistories) reaction(interval time.Duration) time.Duration {
	return interval + h.DataLag + interval + pushDelay
}

func rateSamples(points []metrics.RatePoint) []weights.RateSample {
	out := make([]weights.RateSample, len(points))
	for i, p := range points {
		out[i] = weights.RateSample{EndSeconds: float64(p.Time.UnixMilli()) / 1000, Rate: p.Rate}
	}
	return out
}

// retain forgets the histories of AdaptiveLoadBalancers not live.
func (h *LoadHistories) retain(live map[types.NamespacedName]bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for key := range h.learned {
		if !live[key] {
			delete(h.learned, key)
		}
	}
}
