package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// StatusQueue writes the AdaptiveLoadBalancer statuses off the paths that decide them: the
// mirror writes a ServiceEntry, the cycle and the checks between cycles write weights, each
// hands its status change to the queue and goes on. At 200,000 pods a cycle with 200 Services
// due spent 4.9 s writing their statuses one after another (docs/scaling.md) while its weights
// waited for the next tick, and a reconcile's status write held its worker from the next
// endpoint change.
//
// Changes to one object that wait together are applied in the order they came and written as
// one patch (coalesced per object): an object whose write lags writes once, not once per cycle.
// A change is handed over only after the write it reports has returned, so a status written
// from the queue never claims what did not happen; it may say it later. A write that fails is
// retried with back-off (up to 10 s): the weight path's changes statusWriteRetries times, then
// dropped with an error in the log (its next cycle writes them again), the mirror's until they
// are written (nothing else would). Writes go through
// Client, which has its own client-side rate limit (and, with the chart's FlowSchema, its own
// API Priority and Fairness level): they never take the mirror's budget.
//
// A queue handed to the reconciler or the weight cycle must be started (a manager.Runnable):
// one that is not writes nothing. Without a queue, they write their statuses themselves. The queue runs on the leader only, as they do;
// what is still queued when it stops is dropped, and the next leader's first cycle writes every
// status afresh.
type StatusQueue struct {
	// Client writes the statuses and reads the object to change (from the cache).
	Client client.Client
	// Reader reads the object from the API server after a write conflict; nil: Client.
	Reader client.Reader
	// Workers writes at once; 0: DefaultStatusWorkers.
	Workers int
	Clock   clock.PassiveClock
	// Metrics, if set, receives the queue's depth and each write's lag.
	Metrics *StatusQueueMetrics
	// Activity, if set, counts writes under way, so that a replaced manager's writes finish
	// before the next one's start.
	Activity *Activity

	mu      sync.Mutex
	pending map[types.NamespacedName]*pendingStatus
	// writing holds the objects whose changes are being written (the work queue hands one
	// object to one worker at a time).
	writing map[types.NamespacedName]bool
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]
	idle    *sync.Cond
}

// DefaultStatusWorkers is how many status writes the queue has in flight at once: enough to
// keep up with a cycle's 200 changes in a few seconds at 25 ms a write, few enough that the
// status writes never crowd the API server (they have their own, lower, APF level as well).
const DefaultStatusWorkers = 4

// statusWriteTimeout bounds one status write from the queue.
const statusWriteTimeout = 30 * time.Second

// statusWriteRetries is how many times the queue retries a failed write of one object's
// changes, with back-off (0.1 s doubling), before it drops them, unless one of them persists
// (the mirror's): the weight cycle writes its statuses again at its next interval.
const statusWriteRetries = 5

// statusChange is one change of an AdaptiveLoadBalancer's status: mutate changes the object as
// updateStatus's does (false: nothing of its own to write), and done, if set, is called once
// the change is written, found unnecessary, or failed.
type statusChange struct {
	mutate func(*adlbv1.AdaptiveLoadBalancer) bool
	done   func(alb *adlbv1.AdaptiveLoadBalancer, wrote bool, err error)
	// persist: the change is retried until it is written or the queue stops, never given up.
	// The mirror's are: nothing else would write them again (a status change starts no
	// reconcile), where the weight cycle writes its statuses again every interval.
	persist bool
}

// pendingStatus is what waits for one object: its changes in order, and when the first came.
type pendingStatus struct {
	changes []statusChange
	since   time.Time
}

// NeedLeaderElection: only the leader's mirror and weight cycle hand changes over.
func (q *StatusQueue) NeedLeaderElection() bool { return true }

func (q *StatusQueue) init() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queue == nil {
		q.pending = map[types.NamespacedName]*pendingStatus{}
		q.writing = map[types.NamespacedName]bool{}
		q.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 10*time.Second))
		q.idle = sync.NewCond(&q.mu)
		if q.Clock == nil {
			q.Clock = clock.RealClock{}
		}
	}
}

// Start writes queued changes until ctx ends (a manager.Runnable).
func (q *StatusQueue) Start(ctx context.Context) error {
	q.init()
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithName("status-queue"))
	workers := q.Workers
	if workers <= 0 {
		workers = DefaultStatusWorkers
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q.writeNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	q.queue.ShutDown()
	wg.Wait()
	q.mu.Lock()
	clear(q.pending) // dropped: the next leader writes every status afresh
	q.setDepth()
	q.idle.Broadcast()
	q.mu.Unlock()
	return nil
}

// enqueue hands a status change of key over to the queue.
func (q *StatusQueue) enqueue(key types.NamespacedName, c statusChange) {
	q.init()
	q.mu.Lock()
	p := q.pending[key]
	if p == nil {
		p = &pendingStatus{since: q.Clock.Now()}
		q.pending[key] = p
	}
	p.changes = append(p.changes, c)
	q.setDepth()
	q.mu.Unlock()
	q.queue.Add(key)
}

// writeNext writes the changes waiting for the next object in the queue; false once the queue
// is shut down.
func (q *StatusQueue) writeNext(ctx context.Context) bool {
	key, shutdown := q.queue.Get()
	if shutdown {
		return false
	}
	defer q.queue.Done(key)
	q.mu.Lock()
	p := q.pending[key]
	delete(q.pending, key)
	q.setDepth()
	q.writing[key] = true
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.writing, key)
		q.idle.Broadcast()
		q.mu.Unlock()
	}()
	if p == nil || !q.Activity.enter() {
		return true
	}
	defer q.Activity.exit()
	writeCtx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	alb, wrote, err := writeStatusChanges(writeCtx, q.Client, q.Reader, key, p.changes)
	if err != nil && ctx.Err() == nil && (q.queue.NumRequeues(key) < statusWriteRetries || persistent(p.changes)) {
		// Retried with back-off, before whatever came since, which was decided later.
		q.mu.Lock()
		if later := q.pending[key]; later != nil {
			p.changes = append(p.changes, later.changes...)
		}
		q.pending[key] = p
		q.setDepth()
		q.mu.Unlock()
		if q.queue.NumRequeues(key) >= statusWriteRetries {
			log.FromContext(ctx).Error(err, "status write keeps failing; the endpoint mirror's status is retried until it is written", "adaptiveLoadBalancer", key, "attempts", q.queue.NumRequeues(key)+1)
		}
		q.queue.AddRateLimited(key)
		return true
	}
	q.queue.Forget(key)
	if err != nil {
		log.FromContext(ctx).Error(err, "status write failed after retries; the next weight cycle writes this AdaptiveLoadBalancer's status again", "adaptiveLoadBalancer", key)
	}
	if q.Metrics != nil && wrote {
		q.Metrics.Lag.Observe(q.Clock.Since(p.since).Seconds())
	}
	for _, c := range p.changes {
		if c.done != nil {
			c.done(alb, wrote, err)
		}
	}
	return true
}

// writeStatusChanges applies changes in order to key's object as c reads it (the cache) and
// writes them as one status patch (updateStatus: under an optimistic lock, re-read from reader
// and re-applied on a conflict). It returns the object as written or last read; nil when it no
// longer exists.
func writeStatusChanges(ctx context.Context, c client.Client, reader client.Reader, key types.NamespacedName, changes []statusChange) (*adlbv1.AdaptiveLoadBalancer, bool, error) {
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := c.Get(ctx, key, alb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("read AdaptiveLoadBalancer %s to write its status: %w", key, err)
	}
	wrote, err := updateStatus(ctx, c, reader, alb, applyInOrder(changes))
	return alb, wrote, err
}

// persistent reports whether any of changes must never be given up.
func persistent(changes []statusChange) bool {
	for _, c := range changes {
		if c.persist {
			return true
		}
	}
	return false
}

// holds reports whether a change of key waits in the queue or is being written: the cached
// object does not show it yet, so a status equal to the cache's may still differ from what the
// queue is about to write.
func (q *StatusQueue) holds(key types.NamespacedName) bool {
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[key] != nil || q.writing[key]
}

// applyInOrder is one mutate that applies every change in order; it asks for a write when any
// change does. A change that declines (returns false) may still have changed the object: those
// edits ride along with another change's write, which only makes the status more current.
func applyInOrder(changes []statusChange) func(*adlbv1.AdaptiveLoadBalancer) bool {
	return func(alb *adlbv1.AdaptiveLoadBalancer) bool {
		write := false
		for _, c := range changes {
			if c.mutate(alb) {
				write = true
			}
		}
		return write
	}
}

// setDepth publishes how many objects wait; q.mu is held.
func (q *StatusQueue) setDepth() {
	if q.Metrics != nil {
		q.Metrics.Depth.Set(float64(len(q.pending)))
	}
}

// WaitIdle waits until nothing is queued or being written, or ctx ends.
func (q *StatusQueue) WaitIdle(ctx context.Context) error {
	q.init()
	stop := context.AfterFunc(ctx, func() {
		q.mu.Lock()
		q.idle.Broadcast()
		q.mu.Unlock()
	})
	defer stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.pending) > 0 || len(q.writing) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		q.idle.Wait()
	}
	return nil
}
