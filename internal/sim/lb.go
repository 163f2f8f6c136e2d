package sim

import (
	"math"
	"math/rand"
)

// This file models Envoy's client-side load balancers as Envoy implements them (see
// docs/simulator.md, "Envoy fidelity"). Each Envoy worker thread has its own load balancer,
// while active-request counts are per host and shared by all workers of one proxy; the model keeps
// the same split: one balancer per (proxy, worker), active counts per proxy.

// edfEntry is one host in an earliest-deadline-first schedule.
type edfEntry struct {
	deadline float64
	order    uint64 // insertion order breaks deadline ties, as in Envoy's EdfScheduler
	host     int32
}

// edfScheduler is a weighted schedule: each host is due again 1/weight after it was last picked,
// so over many picks each host's share converges to its weight's share.
type edfScheduler struct {
	now     float64
	counter uint64
	heap    []edfEntry
}

func (s *edfScheduler) less(i, j int) bool {
	a, b := s.heap[i], s.heap[j]
	if a.deadline != b.deadline {
		return a.deadline < b.deadline
	}
	return a.order < b.order
}

func (s *edfScheduler) add(host int32, weight float64) {
	s.counter++
	s.heap = append(s.heap, edfEntry{deadline: s.now + 1/weight, order: s.counter, host: host})
	i := len(s.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s.heap[i], s.heap[p] = s.heap[p], s.heap[i]
		i = p
	}
}

// pop removes the host due first and moves the schedule's clock to its deadline.
func (s *edfScheduler) pop() int32 {
	top := s.heap[0]
	last := len(s.heap) - 1
	s.heap[0] = s.heap[last]
	s.heap = s.heap[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s.heap) && s.less(l, m) {
			m = l
		}
		if r < len(s.heap) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s.heap[i], s.heap[m] = s.heap[m], s.heap[i]
		i = m
	}
	s.now = top.deadline
	return top.host
}

// balancer is one Envoy worker's load balancer over the current host set. Hosts are pod ids;
// active requests are indexed by pod id.
type balancer struct {
	hosts       []int32
	policy      string
	choiceCount int
	bias        float64
	weights     []float64
	equal       bool // Envoy takes its unweighted code path when all weights are equal
	rrIndex     uint64
	edf         edfScheduler
}

func newBalancer(policy string, choiceCount int, bias float64) *balancer {
	return &balancer{policy: policy, choiceCount: choiceCount, bias: bias}
}

// refresh rebuilds the balancer for a new host set or new weights, as Envoy does on an EDS update.
// weights[i] belongs to hosts[i]; active holds the proxy's active requests per pod id.
func (b *balancer) refresh(hosts []int32, weights []float64, active []int32, r *rand.Rand) {
	b.hosts = append(b.hosts[:0], hosts...)
	b.weights = append(b.weights[:0], weights...)
	b.equal = true
	for _, w := range weights {
		if w != weights[0] {
			b.equal = false
			break
		}
	}
	// Each worker starts its rotation at a random host so that workers are not in lockstep.
	if len(weights) > 0 {
		b.rrIndex = uint64(r.Intn(len(weights)))
	}
	b.edf = edfScheduler{heap: b.edf.heap[:0]}
	if b.equal || b.policy == LBRandom {
		return
	}
	for h := range weights {
		b.edf.add(int32(h), b.effectiveWeight(h, active))
	}
	// Envoy pre-picks a random number of times after building a schedule so that every worker
	// (and every proxy) does not start with the same host.
	for i := r.Intn(len(weights)); i > 0; i-- {
		h := b.edf.pop()
		b.edf.add(h, b.effectiveWeight(int(h), active))
	}
}

// effectiveWeight is the weight a host is re-added to the schedule with: for weighted
// LEAST_REQUEST, weight / (active + 1)^bias, evaluated when the host is (re)scheduled, so a busy
// host's penalty lasts until its next turn.
func (b *balancer) effectiveWeight(h int, active []int32) float64 {
	w := b.weights[h]
	if b.policy != LBLeastRequest || b.bias == 0 {
		return w
	}
	a := float64(active[b.hosts[h]]) + 1
	if b.bias == 1 {
		return w / a
	}
	return w / math.Pow(a, b.bias)
}

// pick chooses a host and returns its pod id.
func (b *balancer) pick(active []int32, r *rand.Rand) int32 {
	n := len(b.hosts)
	switch {
	case n == 1:
		return b.hosts[0]
	case b.policy == LBRandom:
		return b.hosts[r.Intn(n)]
	case b.equal && b.policy == LBRoundRobin:
		b.rrIndex++
		return b.hosts[b.rrIndex%uint64(n)]
	case b.equal: // unweighted LEAST_REQUEST: power of choice_count choices, with replacement
		best := b.hosts[r.Intn(n)]
		for i := 1; i < b.choiceCount; i++ {
			c := b.hosts[r.Intn(n)]
			if active[c] < active[best] {
				best = c
			}
		}
		return best
	default: // weighted: earliest deadline first
		h := b.edf.pop()
		b.edf.add(h, b.effectiveWeight(int(h), active))
		return b.hosts[h]
	}
}
