package controller

import (
	"context"
	"testing"
	"time"
)

func TestActivity_CloseWaitsForWorkUnderWayAndRefusesNewWork(t *testing.T) {
	a := &Activity{}
	if !a.enter() {
		t.Fatal("an open Activity refused work")
	}
	closed := make(chan error, 1)
	go func() { closed <- a.CloseAndWait(context.Background()) }()
	// Close has not returned while the work is under way (a bounded wait for a wrong return).
	select {
	case err := <-closed:
		t.Fatalf("CloseAndWait returned (%v) with work under way", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Once closed, no new work starts.
	for !func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.closed }() {
		time.Sleep(time.Millisecond)
	}
	if a.enter() {
		t.Fatal("a closed Activity let new work start")
	}
	a.exit()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	// A caller that cannot wait longer gets its context's error.
	b := &Activity{}
	b.enter()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.CloseAndWait(ctx); err != context.Canceled {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	var none *Activity // a reconciler without one tracks nothing
	if !none.enter() || none.CloseAndWait(context.Background()) != nil {
		t.Fatal("a nil Activity must allow work and close at once")
	}
	none.exit()
}
