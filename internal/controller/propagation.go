package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// propagationTracker remembers, per AdaptiveLoadBalancer, when the oldest EndpointSlice change
// not yet reflected in its ServiceEntry reached the operator.
type propagationTracker struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]time.Time
}

func newPropagationTracker() *propagationTracker {
	return &propagationTracker{pending: map[types.NamespacedName]time.Time{}}
}

// observed records an event at t; the oldest pending event is kept, so the measure is the worst
// case for a burst of changes.
func (p *propagationTracker) observed(key types.NamespacedName, t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[key]; !ok {
		p.pending[key] = t
	}
}

// begin returns and clears the pending event time, if any. A reconcile calls it before it reads
// the cache, so an event that arrives later stays pending for the next reconcile.
func (p *propagationTracker) begin(key types.NamespacedName) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.pending[key]
	delete(p.pending, key)
	return t, ok
}

// restore puts back an event time after a failed reconcile, keeping the older of the two.
func (p *propagationTracker) restore(key types.NamespacedName, t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.pending[key]; !ok || t.Before(cur) {
		p.pending[key] = t
	}
}
