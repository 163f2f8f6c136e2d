package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Membership records when each endpoint entered and left each managed ServiceEntry, so that the
// weight cycle counts only the time an endpoint was in the ServiceEntry. A pod whose readiness
// flaps is out of the ServiceEntry for part of the metrics window and serves less than its
// share over the whole window; taken at face value that reads as spare capacity and earns it
// more weight. The mirror records every membership it writes; the cycle asks what share of its
// window each endpoint was in.
//
// Endpoints present at the first record of a ServiceEntry (the operator just started, or the
// record was lost in a failover) count as present since before any window. The records are in
// memory only.
type Membership struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	byKey map[types.NamespacedName]*memberLog
	// plans are the weight cycle's last inputs, for the mirror's re-plan (replan.go).
	plans lastPlans
}

// membershipRetention bounds the history kept per endpoint: the longest metrics window is twice
// the longest interval (10 min).
const membershipRetention = 30 * time.Minute

// membershipSettle is how long after a ServiceEntry's first record joining endpoints still
// count as there from the start: long enough for the caches of a new AdaptiveLoadBalancer's
// first reconciles to agree, far shorter than the shortest metrics window (10 s).
const membershipSettle = 5 * time.Second

type span struct{ from, to time.Time }

type memberLog struct {
	created time.Time            // the first record of this ServiceEntry
	in      map[string]time.Time // endpoint → since when (zero: since before the records)
	out     map[string][]span    // endpoint → past spans in the ServiceEntry
	// weight is each endpoint's weight in the last ServiceEntry that listed it, with its pod;
	// it outlives the endpoint's removal by membershipRetention.
	weight map[string]podWeight
}

type podWeight struct {
	pod    string
	weight uint32
	left   time.Time // zero while listed
}

// NewMembership returns an empty record stamped by c (nil: the real clock).
func NewMembership(c clock.PassiveClock) *Membership {
	if c == nil {
		c = clock.RealClock{}
	}
	return &Membership{clock: c, byKey: map[types.NamespacedName]*memberLog{}}
}

// SetClock replaces the clock that stamps the records (tests whose weight cycle runs on a fake clock).
func (m *Membership) SetClock(c clock.PassiveClock) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clock = c
}

// MemberEndpoint is one endpoint a ServiceEntry lists.
type MemberEndpoint struct {
	IP, Pod string
	Weight  uint32
}

// Observe records that the ServiceEntry key now lists exactly the endpoints eps.
func (m *Membership) Observe(key types.NamespacedName, eps []MemberEndpoint) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	log, known := m.byKey[key]
	if !known {
		log = &memberLog{created: now, in: map[string]time.Time{}, out: map[string][]span{}, weight: map[string]podWeight{}}
		m.byKey[key] = log
	}
	// Endpoints that join a ServiceEntry that listed none (every pod was out at once), or in the
	// first moments of its record (the first reconciles of a new AdaptiveLoadBalancer can run
	// while the Pod and EndpointSlice caches still catch up with each other), all join together:
	// none of them served less than the others, so none is stamped as a newcomer.
	fromEmpty := len(log.in) == 0 || now.Sub(log.created) < membershipSettle
	current := make(map[string]bool, len(eps))
	for _, e := range eps {
		ip := e.IP
		current[ip] = true
		if prev, listed := log.weight[ip]; listed && prev.left.IsZero() && prev.pod != e.Pod {
			// Another pod took the address between two writes: the one listed before left, and
			// this one joins now (it served none of the time before).
			if since, in := log.in[ip]; in {
				log.out[ip] = append(log.out[ip], span{from: since, to: now})
				delete(log.in, ip)
			}
		}
		log.weight[ip] = podWeight{pod: e.Pod, weight: e.Weight}
		if _, in := log.in[ip]; !in {
			since := now
			if !known || fromEmpty {
				since = time.Time{}
			}
			log.in[ip] = since
		}
	}
	for ip, since := range log.in {
		if !current[ip] {
			log.out[ip] = append(log.out[ip], span{from: since, to: now})
			delete(log.in, ip)
			if w, ok := log.weight[ip]; ok {
				w.left = now
				log.weight[ip] = w
			}
		}
	}
	for ip, w := range log.weight {
		if !w.left.IsZero() && now.Sub(w.left) >= membershipRetention {
			delete(log.weight, ip)
		}
	}
	for ip, spans := range log.out {
		kept := spans[:0]
		for _, s := range spans {
			if now.Sub(s.to) < membershipRetention {
				kept = append(kept, s)
			}
		}
		if len(kept) == 0 {
			delete(log.out, ip)
		} else {
			log.out[ip] = kept
		}
	}
}

// Weighted records weights the weight cycle wrote to the ServiceEntry's listed endpoints.
func (m *Membership) Weighted(key types.NamespacedName, weights map[string]int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.byKey[key]
	if !ok {
		return
	}
	for ip, w := range weights {
		if pw, listed := log.weight[ip]; listed && pw.left.IsZero() && w > 0 {
			pw.weight = uint32(w)
			log.weight[ip] = pw
		}
	}
}

// RecentWeight returns the weight a pod had in the ServiceEntry when it last left it, within
// membershipRetention: a pod whose readiness flaps returns at the weight it had, instead of
// at a median that may overload it.
func (m *Membership) RecentWeight(key types.NamespacedName, ip, pod string) (uint32, bool) {
	if m == nil {
		return 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.byKey[key]
	if !ok {
		return 0, false
	}
	w, ok := log.weight[ip]
	if !ok || w.left.IsZero() || w.pod != pod || w.weight == 0 || m.clock.Now().Sub(w.left) >= membershipRetention {
		return 0, false
	}
	return w.weight, true
}

// Forget drops the records of a ServiceEntry that is gone.
func (m *Membership) Forget(key types.NamespacedName) {
	if m == nil {
		return
	}
	m.forgetPlans(func(k types.NamespacedName) bool { return k != key })
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.byKey, key)
}

// Retain drops the records of every ServiceEntry whose AdaptiveLoadBalancer is not in keep.
func (m *Membership) Retain(keep map[types.NamespacedName]bool) {
	if m == nil {
		return
	}
	m.forgetPlans(func(k types.NamespacedName) bool { return keep[k] })
	m.mu.Lock()
	defer m.mu.Unlock()
	for key := range m.byKey {
		if !keep[key] {
			delete(m.byKey, key)
		}
	}
}

// Share returns the fraction of [from, to] during which the endpoint was in the ServiceEntry:
// 1 when nothing is recorded for the ServiceEntry.
func (m *Membership) Share(key types.NamespacedName, ip string, from, to time.Time) float64 {
	if m == nil || !to.After(from) {
		return 1
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.byKey[key]
	if !ok {
		return 1
	}
	spans := append([]span(nil), log.out[ip]...)
	if since, in := log.in[ip]; in {
		spans = append(spans, span{from: since, to: to})
	}
	var inside time.Duration
	for _, s := range spans {
		a, b := s.from, s.to
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			inside += b.Sub(a)
		}
	}
	return min(1, inside.Seconds()/to.Sub(from).Seconds())
}
