package sim

import (
	"cmp"
	"fmt"
	"math"
	"math/rand"
	"slices"
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

// startAfterPicks fills the schedule with the hosts (weights[i] for host i) in the state it
// reaches right after a pick deep into a fresh schedule, as Envoy's createWithPicks does with a
// random pick count. seed fixes the state (Envoy fixes it per load balancer instance).
//
// A random pick, not a random time: the state after a random time is biased toward the hosts
// with the longest gaps (the inspection paradox), so a worker making a dozen picks between two
// rebuilds would over-serve light hosts. So: draw a time U deep in the schedule and the host i
// picked last with probability wᵢ/Σw, move the clock back to that host's last pick at or before
// U, T = ⌊U·wᵢ⌋/wᵢ, and let every host be next due at its first multiple of 1/w after T (a host
// tied with i at T and listed after it is still due at T).
func (s *edfScheduler) startAfterPicks(weights []float64, seed uint64) {
	var total float64
	for _, w := range weights {
		total += w
	}
	u := float64(splitmix64(seed)%maxEDFPicks) / total
	x := float64(splitmix64(seed^0x9e3779b97f4a7c15)>>11) / (1 << 53) * total
	last := len(weights) - 1
	for h, w := range weights {
		if x < w {
			last = h
			break
		}
		x -= w
	}
	t := math.Floor(u*weights[last]) / weights[last]
	s.heap = s.heap[:0]
	s.now = t
	for h, w := range weights {
		next := (math.Floor(t*w) + 1) / w
		if h > last && w == weights[last] {
			next = t // tied with the last pick and after it in order: still due
		}
		s.counter++
		s.heap = append(s.heap, edfEntry{deadline: next, order: s.counter, host: int32(h)})
	}
	slices.SortFunc(s.heap, func(a, b edfEntry) int { // a sorted slice is a valid min-heap; less's order
		return cmp.Or(cmp.Compare(a.deadline, b.deadline), cmp.Compare(a.order, b.order))
	})
}

// splitmix64 is a fixed mixing of a seed into well-spread bits.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// pop removes the host due first and moves the schedule's clock to its deadline.
func (s *edfScheduler) pop() int32 {
	top := s.heap[0]
	last := len(s.heap) - 1
	s.heap[0] = s.heap[last]
	s.heap = s.heap[:last]
	s.down(0)
	s.now = top.deadline
	return top.host
}

// repick takes the host due first and schedules it again with the weight it has now: pop and
// add in one sift. Deadlines with their insertion order are unique keys, so the hosts come out
// in the order pop and add would give.
func (s *edfScheduler) repick(weight func(host int32) float64) int32 {
	top := s.heap[0]
	s.now = top.deadline
	s.counter++
	s.heap[0] = edfEntry{deadline: s.now + 1/weight(top.host), order: s.counter, host: top.host}
	s.down(0)
	return top.host
}

func (s *edfScheduler) down(i int) {
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
}

// balancer is one Envoy worker's load balancer over the current host set. Hosts are pod ids;
// active requests are indexed by pod id.
type balancer struct {
	hosts       []int32
	policy      lbPolicy
	choiceCount int
	bias        float64
	weights     []float64
	equal       bool // Envoy takes its unweighted code path when all weights are equal
	rrIndex     uint64
	edf         edfScheduler
	// edfSeed fixes where in a fresh schedule every rebuild starts, per balancer, as Envoy
	// fixes it per load balancer instance; 0 until first drawn.
	edfSeed uint64
	// hostDraw picks a host at random: r.Intn(len(hosts)) without its divisions.
	hostDraw boundedInt
}

// maxEDFPicks bounds the random pre-pick count, as Envoy's createWithPicks does (UINT32_MAX/10).
const maxEDFPicks = 429496729

// lbPolicy is a client balancer's policy, compared at every pick: an integer, not its name.
type lbPolicy uint8

const (
	lbLeastRequest lbPolicy = iota
	lbRoundRobin
	lbRandom
)

// newBalancer returns a balancer for one of LBRoundRobin, LBRandom and LBLeastRequest; the
// scenario's validation lets no other name through.
func newBalancer(policy string, choiceCount int, bias float64) *balancer {
	b := &balancer{choiceCount: choiceCount, bias: bias}
	switch policy {
	case LBLeastRequest:
		b.policy = lbLeastRequest
	case LBRoundRobin:
		b.policy = lbRoundRobin
	case LBRandom:
		b.policy = lbRandom
	default:
		panic(fmt.Sprintf("sim: client balancer %q is unknown", policy))
	}
	return b
}

// refresh rebuilds the balancer for a new host set or new weights, as Envoy does on an EDS update.
// weights[i] belongs to hosts[i]; active holds the proxy's active requests per pod id.
func (b *balancer) refresh(hosts []int32, weights []float64, active []int32, r *rand.Rand) {
	b.hosts = append(b.hosts[:0], hosts...)
	if len(hosts) > 0 {
		b.hostDraw = newBoundedInt(len(hosts))
	}
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
	if b.equal || b.policy == lbRandom {
		return
	}
	if b.edfSeed == 0 {
		b.edfSeed = 1 + uint64(r.Int63())
	}
	effective := make([]float64, len(weights))
	for h := range weights {
		effective[h] = b.effectiveWeight(h, active)
	}
	// Envoy builds each schedule as it would stand after a large random number of picks from a
	// fresh start, so that workers and proxies do not all begin with the heaviest hosts. A short
	// pre-pick would not do: a worker that makes only a dozen picks between two rebuilds (ORCA
	// weights are rebuilt every second) would then always serve the head of a fresh schedule,
	// which over-serves light hosts.
	b.edf.startAfterPicks(effective, b.edfSeed)
}

// effectiveWeight is the weight a host is re-added to the schedule with: for weighted
// LEAST_REQUEST, weight / (active + 1)^bias, evaluated when the host is (re)scheduled, so a busy
// host's penalty lasts until its next turn.
func (b *balancer) effectiveWeight(h int, active []int32) float64 {
	w := b.weights[h]
	if b.policy != lbLeastRequest || b.bias == 0 {
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
	case b.policy == lbRandom:
		return b.hosts[b.hostDraw.draw(r)]
	case b.equal && b.policy == lbRoundRobin:
		b.rrIndex++
		return b.hosts[b.rrIndex%uint64(n)]
	case b.equal: // unweighted LEAST_REQUEST: power of choice_count choices, with replacement
		best := b.hosts[b.hostDraw.draw(r)]
		for i := 1; i < b.choiceCount; i++ {
			c := b.hosts[b.hostDraw.draw(r)]
			if active[c] < active[best] {
				best = c
			}
		}
		return best
	default: // weighted: earliest deadline first
		h := b.edf.repick(func(h int32) float64 { return b.effectiveWeight(int(h), active) })
		return b.hosts[h]
	}
}
