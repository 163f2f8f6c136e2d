package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// What the weight path remembers of each Service between its cycles and the checks between them
// (relief.go): the check judges each pod against what the last cycle observed of it, and the
// cycle plans differently for a pod a check has just relieved. Both run on the weight cycle's
// goroutine under its lock, so this memory is theirs alone; the mirror never reads it. It lives
// in memory only: after a leader change the first check waits for a cycle, and a pod relieved
// just before is restored at the cycle's usual pace.

// reliefRestoreWindow is how long after a relief the cycle raises the relieved pod's weight only
// slowly (weights.Endpoint.Relieved): five minutes, the Horizontal Pod Autoscaler's default
// stabilization window for scaling down, its slow direction. The simulator's controller uses the
// same (internal/sim, restoreAfterRelief).
const reliefRestoreWindow = 5 * time.Minute

// reliefMemory is one Service's.
type reliefMemory struct {
	// baseline is what the last cycle observed of each endpoint, by IP.
	baseline map[string]observedEndpoint
	// cuts holds, by IP, the last cuts of an endpoint's weight for a jump or an overload.
	cuts map[string]weightCut
	// wroteAt is when a relief last wrote weights: the cycle counts it as a weight write when it
	// judges how much of its window the weights in force have seen.
	wroteAt time.Time
}

// observedEndpoint is what a cycle observed of an endpoint, and of which pod.
type observedEndpoint struct {
	pod      string
	endpoint weights.Endpoint
}

// weightCut records the cuts of one pod's weight.
type weightCut struct {
	pod string
	// relievedAt is when a relief last cut the weight (zero: never).
	relievedAt time.Time
	// answeredAt is when the last cut for a jump or an overload (a relief's, or the cycle's
	// halving of an overloaded pod) reached the mesh: written, and pushed.
	answeredAt time.Time
}

// memoryOf returns d's memory, created on first use. The weight cycle holds w.mu.
func (w *WeightCycle) memoryOf(d *dueTarget) *reliefMemory {
	if w.reliefs == nil {
		w.reliefs = map[types.NamespacedName]*reliefMemory{}
	}
	m, ok := w.reliefs[d.key]
	if !ok {
		m = &reliefMemory{baseline: map[string]observedEndpoint{}, cuts: map[string]weightCut{}}
		w.reliefs[d.key] = m
	}
	return m
}

// checksServe reports whether the checks between cycles serve d's algorithm and mode.
func checksServe(d *dueTarget) bool {
	a := d.settings.Algorithm
	return d.alb.Spec.Mode != adlbv1.ModeDryRun && (a == weights.AlgorithmCapacity || a == weights.AlgorithmTail)
}

// markRelieved sets, on the endpoints of d's cycle, Relieved for a pod a relief cut within
// reliefRestoreWindow of now, and OverloadAnswered for one whose cut reached the mesh after the
// window (ending at dataEnd) began: the window still shows the jump that cut answered. It
// returns when a relief last wrote weights. The weight cycle holds w.mu.
func (w *WeightCycle) markRelieved(d *dueTarget, now, dataEnd time.Time, window time.Duration) time.Time {
	m, ok := w.reliefs[d.key]
	if !ok {
		return time.Time{}
	}
	m.markEndpoints(d, d.observed.Endpoints, now, dataEnd, window)
	return m.wroteAt
}

// markEndpoints sets Relieved and OverloadAnswered on eps, d's endpoints, as markRelieved says.
func (m *reliefMemory) markEndpoints(d *dueTarget, eps []weights.Endpoint, now, dataEnd time.Time, window time.Duration) {
	for i := range eps {
		e := &eps[i]
		c, ok := m.cuts[e.ID]
		if pod := d.pods[e.ID]; !ok || pod == nil || pod.Name != c.pod {
			continue
		}
		e.Relieved = !c.relievedAt.IsZero() && now.Sub(c.relievedAt) < reliefRestoreWindow
		e.OverloadAnswered = c.answeredAt.After(dataEnd.Add(-window))
	}
}

// rememberCycle keeps what d's cycle at now observed as the next checks' baseline, and the cuts
// of its overload halving once written at wroteAt (zero: nothing written). The weight cycle
// holds w.mu.
func (w *WeightCycle) rememberCycle(d *dueTarget, o cycle.Outcome, now, wroteAt time.Time) {
	if !checksServe(d) {
		delete(w.reliefs, d.key)
		return
	}
	m := w.memoryOf(d)
	m.baseline = make(map[string]observedEndpoint, len(d.observed.Endpoints))
	for _, e := range d.observed.Endpoints {
		if pod, ok := d.pods[e.ID]; ok {
			m.baseline[e.ID] = observedEndpoint{pod: pod.Name, endpoint: e}
		}
	}
	if !wroteAt.IsZero() && len(o.Decision.Endpoints) == len(d.observed.Endpoints) {
		for i, r := range o.Decision.Endpoints {
			if r.Reason == weights.ReasonOverloaded && r.Weight < d.observed.Endpoints[i].CurrentWeight {
				m.noteCut(d, r.ID, time.Time{}, wroteAt.Add(pushDelay))
			}
		}
	}
	m.prune(now)
}

// rememberRelief records a relief written at wroteAt: the pods whose weight it cut (current
// holds the weights before it, by IP), and the write itself. The weight cycle holds w.mu.
func (w *WeightCycle) rememberRelief(d *dueTarget, decision weights.Decision, current map[string]int, wroteAt time.Time) {
	m := w.memoryOf(d)
	m.wroteAt = wroteAt
	for _, r := range decision.Endpoints {
		if r.Weight < current[r.ID] {
			m.noteCut(d, r.ID, wroteAt, wroteAt.Add(pushDelay))
		}
	}
}

// noteCut records a cut of the pod at ip: relieved (when not zero) and answered.
func (m *reliefMemory) noteCut(d *dueTarget, ip string, relievedAt, answeredAt time.Time) {
	pod, ok := d.pods[ip]
	if !ok {
		return
	}
	c := m.cuts[ip]
	if c.pod != pod.Name {
		c = weightCut{pod: pod.Name}
	}
	if !relievedAt.IsZero() {
		c.relievedAt = relievedAt
	}
	c.answeredAt = answeredAt
	m.cuts[ip] = c
}

// prune forgets the cuts no cycle or check reads any more: older than the restore window and the
// longest metrics window.
func (m *reliefMemory) prune(now time.Time) {
	for ip, c := range m.cuts {
		if now.Sub(c.relievedAt) > reliefRestoreWindow+maxWindow && now.Sub(c.answeredAt) > maxWindow {
			delete(m.cuts, ip)
		}
	}
}

// maxWindow is the longest metrics window: twice the longest interval the CRD admits (10m).
const maxWindow = 20 * time.Minute

// baselineFor is the last cycle's observation of each of d's endpoints still held by the same pod.
func (m *reliefMemory) baselineFor(d *dueTarget) map[string]weights.Endpoint {
	out := make(map[string]weights.Endpoint, len(m.baseline))
	for ip, o := range m.baseline {
		if pod, ok := d.pods[ip]; ok && pod.Name == o.pod {
			out[ip] = o.endpoint
		}
	}
	return out
}

// answered marks the endpoints whose cut reached the mesh after the middle of a check's window
// ending at dataEnd: the window still shows mostly the jump that cut answered.
func (m *reliefMemory) answered(d *dueTarget, dataEnd time.Time, window time.Duration) map[string]bool {
	out := map[string]bool{}
	for ip, c := range m.cuts {
		if pod, ok := d.pods[ip]; ok && pod.Name == c.pod && c.answeredAt.After(dataEnd.Add(-window/2)) {
			out[ip] = true
		}
	}
	return out
}
