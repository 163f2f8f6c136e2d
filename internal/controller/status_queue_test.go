package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
)

// heldStatusWrites is the operator's client whose status patches wait until released (an API
// server slow to answer them), counted as they go through to the real API server.
type heldStatusWrites struct {
	client.Client
	release chan struct{}
	patches atomic.Int32
	// refuse answers that many status patches with an API error before letting them through.
	refuse atomic.Int32
}

func newHeldStatusWrites() *heldStatusWrites {
	return &heldStatusWrites{Client: operatorClient, release: make(chan struct{})}
}

func (h *heldStatusWrites) Status() client.SubResourceWriter {
	return heldStatusWriter{SubResourceWriter: h.Client.Status(), h: h}
}

type heldStatusWriter struct {
	client.SubResourceWriter
	h *heldStatusWrites
}

func (w heldStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	select {
	case <-w.h.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if w.h.refuse.Add(-1) >= 0 {
		return apierrors.NewInternalError(errors.New("injected: etcdserver: leader changed"))
	}
	err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if err == nil {
		w.h.patches.Add(1) // a write that landed; a conflict's retry is the same write
	}
	return err
}

// startQueue runs q until the test ends.
func startQueue(t *testing.T, q *StatusQueue) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = q.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Issue 31: the cycle decides and writes weights, and never waits for the status: with every
// status write held by the API server, two cycles run to the end, the first writes the weights,
// and the status says nothing of them until its write goes through; then it says what the last
// cycle did. Meanwhile the second cycle's metrics window counts from the first one's write, as it
// would from status.lastWeightWrite.
func TestStatusQueue_TheCycleWritesWeightsWithoutWaitingForItsStatus(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	held := newHeldStatusWrites()
	metrics := NewStatusQueueMetrics(prometheus.NewRegistry())
	lf.loop.Status = &StatusQueue{Client: held, Reader: k8s, Metrics: metrics}
	startQueue(t, lf.loop.Status)
	released := false
	release := func() {
		if !released {
			released = true
			close(held.release)
		}
	}
	t.Cleanup(release)

	lf.load(skewedCores, equalRPS)
	rep := lf.runWithinAMinute() // fails the test if the cycle waits for the held status write
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		t.Fatalf("first cycle: %s, %d writes (%s)", o.Action, lf.wrote(rep), o.Reason)
	}
	written := lf.weights()
	if written[lf.ips[0]] == written[lf.ips[5]] {
		t.Fatalf("the first cycle returned without writing the weights: %v", written)
	}
	alb := lf.liveALB()
	if alb.Status.LastWeightWrite != nil {
		t.Fatalf("status.lastWeightWrite %v while every status write is held: the status claims a write it has not written", alb.Status.LastWeightWrite)
	}

	lf.clock.Step(loopInterval)
	lf.load(skewedCores, equalRPS)
	rep = lf.runWithinAMinute()
	if coverage := rep.Inputs[lf.key()].WindowCoverage; coverage >= 1 {
		t.Fatalf("second cycle's window coverage %v: it must count from the first cycle's write, whose status is still held", coverage)
	}
	// The first change is in flight, held; the second waits behind it (with any other
	// Service's the cycle saw: it sees every AdaptiveLoadBalancer of the suite).
	if depth := testutil.ToFloat64(metrics.Depth); depth < 1 {
		t.Fatalf("adaptivelb_status_queue_depth %v with the first status write held, want at least 1 (the second cycle's change waits)", depth)
	}

	release()
	lf.settle()
	alb = lf.liveALB()
	if alb.Status.LastWeightWrite == nil {
		t.Fatal("status.lastWeightWrite still unset after the held status writes went through")
	}
	if c := meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionWeightsApplied); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("WeightsApplied after the status writes went through: %+v", c)
	}
	if held.patches.Load() == 0 {
		t.Fatal("no status patch went through the status queue's client")
	}
}

// Changes to one object that wait together are applied in order and written as one patch: an
// API server slow to answer costs one status write per object, not one per cycle.
func TestStatusQueue_ChangesWaitingTogetherAreWrittenInOrderAsOnePatch(t *testing.T) {
	_, key := newMirroredALB(t)
	held := newHeldStatusWrites()
	q := &StatusQueue{Client: held, Reader: k8s, Workers: 1}
	startQueue(t, q)

	var calls atomic.Int32
	appendReason := func(mark string) statusChange {
		return statusChange{
			mutate: func(alb *adlbv1.AdaptiveLoadBalancer) bool {
				if alb.Status.LastRelief == nil {
					alb.Status.LastRelief = &adlbv1.Relief{Time: metav1.Now()}
				}
				alb.Status.LastRelief.Reason += mark
				return true
			},
			done: func(_ *adlbv1.AdaptiveLoadBalancer, wrote bool, err error) {
				if err != nil || !wrote {
					t.Errorf("change %s: wrote %v, error %v", mark, wrote, err)
				}
				calls.Add(1)
			},
		}
	}
	q.enqueue(key, appendReason("1"))
	// Wait until the first change is in flight (its patch held), then queue three more.
	deadline := time.Now().Add(30 * time.Second)
	for {
		q.mu.Lock()
		busy := len(q.writing)
		q.mu.Unlock()
		if busy == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first status change never went in flight")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, mark := range []string{"2", "3", "4"} {
		q.enqueue(key, appendReason(mark))
	}
	close(held.release)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(ctx, key, alb); err != nil {
		t.Fatal(err)
	}
	if alb.Status.LastRelief == nil || alb.Status.LastRelief.Reason != "1234" {
		t.Fatalf("status.lastRelief %+v, want the four changes applied in order (reason 1234)", alb.Status.LastRelief)
	}
	if n := held.patches.Load(); n != 2 {
		t.Fatalf("%d status patches landed, want 2: the first change, then the three that waited together", n)
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d changes told of their write, want 4", n)
	}
}

// liveALB reads the fixture's AdaptiveLoadBalancer from the API server.
func (lf *loopFixture) liveALB() *adlbv1.AdaptiveLoadBalancer {
	lf.t.Helper()
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(context.Background(), lf.key(), alb); err != nil {
		lf.t.Fatal(err)
	}
	return alb
}

// A status write the API server refuses is retried with back-off: a brief refusal loses nothing.
// The weight path's that keeps failing is given up after statusWriteRetries retries, said to the
// change, and the queue goes on (the next cycle writes that status again); the mirror's is
// retried until it is written.
func TestStatusQueue_ARefusedWriteIsRetriedThenGivenUp(t *testing.T) {
	f, key := newMirroredALB(t)
	held := newHeldStatusWrites()
	close(held.release)
	q := &StatusQueue{Client: held, Reader: k8s, Workers: 1}
	startQueue(t, q)
	change := func(reason string, outcome chan<- error) statusChange {
		return statusChange{
			mutate: func(alb *adlbv1.AdaptiveLoadBalancer) bool {
				alb.Status.LastRelief = &adlbv1.Relief{Time: metav1.Now(), Reason: reason}
				return true
			},
			done: func(_ *adlbv1.AdaptiveLoadBalancer, wrote bool, err error) {
				if wrote && err == nil {
					outcome <- nil
					return
				}
				outcome <- fmt.Errorf("wrote %v: %w", wrote, err)
			},
		}
	}
	wait := func(outcome <-chan error) error {
		t.Helper()
		select {
		case err := <-outcome:
			return err
		case <-time.After(time.Minute):
			t.Fatal("the change was never told of its write")
			return nil
		}
	}

	held.refuse.Store(2)
	outcome := make(chan error, 1)
	q.enqueue(key, change("after two refusals", outcome))
	if err := wait(outcome); err != nil {
		t.Fatalf("a write refused twice: %v, want it written on a retry", err)
	}
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := k8s.Get(f.ctx, key, alb); err != nil {
		t.Fatal(err)
	}
	if alb.Status.LastRelief == nil || alb.Status.LastRelief.Reason != "after two refusals" {
		t.Fatalf("status.lastRelief %+v after the retries", alb.Status.LastRelief)
	}

	held.refuse.Store(1000)
	outcome = make(chan error, 1)
	q.enqueue(key, change("never", outcome))
	if err := wait(outcome); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("a write refused every time: %v, want the API server's error", err)
	}
	if refused := 1000 - held.refuse.Load(); refused != statusWriteRetries+1 {
		t.Fatalf("%d attempts of a write refused every time, want %d (the first and %d retries)", refused, statusWriteRetries+1, statusWriteRetries)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatalf("the queue kept a change it gave up: %v", err)
	}

	// The mirror's changes are never given up: nothing else would write them again.
	held.refuse.Store(statusWriteRetries + 2)
	outcome = make(chan error, 1)
	mirrorChange := change("the mirror's, refused past the retries", outcome)
	mirrorChange.persist = true
	q.enqueue(key, mirrorChange)
	if err := wait(outcome); err != nil {
		t.Fatalf("a mirror status refused %d times: %v, want it written in the end", statusWriteRetries+2, err)
	}
}

// newMirroredALB is a fixture with an AdaptiveLoadBalancer web whose first status the mirror has
// written, so that a test's own status queue does not race it.
func newMirroredALB(t *testing.T) (*fixture, types.NamespacedName) {
	t.Helper()
	f := newFixture(t)
	f.service("web")
	f.alb("web", "web")
	key := types.NamespacedName{Namespace: f.ns, Name: "web"}
	f.eventually("the mirror's first status", func() error {
		alb := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, key, alb); err != nil {
			return err
		}
		if meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored) == nil {
			return errNotYet
		}
		return nil
	})
	return f, key
}
