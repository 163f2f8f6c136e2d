package controller

import (
	"context"
	"sync"
)

// Activity tracks the reconciles and weight cycles of one manager that are under way. A process
// that replaces its manager after losing the leader lease closes the old manager's Activity and
// waits: controller-runtime's manager returns at once after a lost lease, without waiting for
// its workers, and an old worker's write landing after the new leader's would undo it. After
// Close, no new reconcile or cycle starts. A nil Activity tracks nothing.
type Activity struct {
	mu     sync.Mutex
	closed bool
	active sync.WaitGroup
}

// enter reports whether work may start, and counts it until exit.
func (a *Activity) enter() bool {
	if a == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.active.Add(1)
	return true
}

func (a *Activity) exit() {
	if a != nil {
		a.active.Done()
	}
}

// CloseAndWait refuses new work and waits until the work under way has returned, or ctx ends.
func (a *Activity) CloseAndWait(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.active.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
