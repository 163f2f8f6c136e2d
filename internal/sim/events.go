package sim

import (
	"fmt"
	"math"
)

// eventKind enumerates what can happen in the simulation.
type eventKind uint8

const (
	evArrival     eventKind = iota // the next client request is issued
	evPodArrive                    // a request reaches its pod
	evPodWake                      // a pod's next completion, quota exhaustion or CFS period end
	evResponse                     // a response reaches its client proxy
	evControl                      // the controller's cycle
	evApply                        // written weights reach the clients
	evPodEvent                     // a scenario event on a pod group
	evPhase                        // the offered load changes
	evSnapshot                     // once a simulated second: counters for windows and timelines
	evRestartStep                  // one step of a rolling restart
	evProbe                        // a Prequal probe comes back to its client
)

// event is ordered by (t, seq): seq makes ties deterministic in scheduling order. The sequence
// number and the kind share one word, the sequence number in the high bits, so that an event is
// 24 bytes (every queue moves events by value) and ordering by the word orders by seq.
type event struct {
	t   float64
	key uint64 // seq<<8 | kind
	a   int32
	b   uint32
}

func (e *event) kind() eventKind { return eventKind(e.key) }

func (e *event) before(o *event) bool {
	if e.t != o.t {
		return e.t < o.t
	}
	return e.key < o.key
}

// scheduler hands out events in (t, seq) order. Almost every event is one of three kinds, each
// kept where it costs least instead of in one heap of millions of pushes:
//   - the next client arrival: there is only ever one;
//   - events a constant delay after now (a network hop, a probe's round trip): scheduled in time
//     order, so a FIFO per delay is already sorted;
//   - pod wakes: at most one pending per pod, in a tournament tree over the pods that is updated
//     in place when a pod's wake moves (a plain heap would pile up stale wakes).
//
// Everything else (snapshots, controller cycles, scenario events) goes to a general heap. Every
// event gets its seq from one counter, so the order, ties included, is the one a single heap
// would give.
type scheduler struct {
	seq        uint64
	arrival    event
	hasArrival bool
	hop        fifo // delay: half the network round trip
	probe      fifo // delay: a Prequal probe's round trip
	wakes      wakeTree
	other      eventHeap
	// fired is the pod whose wake pop handed out last, left in place for the pod to reschedule
	// (setWake moves it, cancelWake drops it), while hasFired.
	fired    int32
	hasFired bool
}

func (q *scheduler) next(t float64, kind eventKind, a int32, b uint32) event {
	q.seq++
	return event{t: t, key: q.seq<<8 | uint64(kind), a: a, b: b}
}

// setArrival schedules the next client arrival, which must not be pending already.
func (q *scheduler) setArrival(t float64) {
	q.arrival, q.hasArrival = q.next(t, evArrival, 0, 0), true
}

// pushHop schedules an event half a network round trip from now; t must not be earlier than
// the last one scheduled this way.
func (q *scheduler) pushHop(t float64, kind eventKind, a int32) { q.hop.push(q.next(t, kind, a, 0)) }

// pushProbe schedules a probe's return one probe round trip from now, in time order.
func (q *scheduler) pushProbe(t float64, proxy int32, pod uint32) {
	q.probe.push(q.next(t, evProbe, proxy, pod))
}

// setWake schedules pod's next wake at t, replacing any pending one.
func (q *scheduler) setWake(pod int32, t float64, version uint32) {
	if q.hasFired && pod == q.fired {
		q.hasFired = false
	}
	q.wakes.set(q.next(t, evPodWake, pod, version))
}

// cancelWake drops pod's pending wake, if any.
func (q *scheduler) cancelWake(pod int32) {
	if q.hasFired && pod == q.fired {
		q.hasFired = false
	}
	q.wakes.remove(pod)
}

// push schedules any other event.
func (q *scheduler) push(t float64, kind eventKind, a int32, b uint32) {
	q.other.push(q.next(t, kind, a, b))
}

// noEvent stands for an empty source in pop: it comes after every event. Never written.
var noEvent = event{t: math.Inf(1), key: math.MaxUint64}

// pop removes the earliest event and copies it to ev; false when none is left.
func (q *scheduler) pop(ev *event) bool {
	const (
		none = iota
		arrival
		hop
		probe
		wake
		other
	)
	if q.hasFired { // the woken pod did not reschedule: its wake is spent
		q.wakes.remove(q.fired)
		q.hasFired = false
	}
	// Every source offers an event, noEvent when it has none, so each is one comparison.
	src, best := none, &noEvent
	if q.hasArrival {
		best, src = &q.arrival, arrival
	}
	if e := q.hop.first(); e.before(best) {
		best, src = e, hop
	}
	if e := q.probe.first(); e.before(best) {
		best, src = e, probe
	}
	if e := q.wakes.head(); e.before(best) {
		best, src = e, wake
	}
	if e := q.other.head(); e.before(best) {
		best, src = e, other
	}
	if math.IsInf(best.t, 1) { // nothing pending (an idle wake tree's root is at +Inf)
		return false
	}
	*ev = *best
	switch src {
	case arrival:
		q.hasArrival = false
	case hop:
		q.hop.drop()
	case probe:
		q.probe.drop()
	case wake:
		// Left in the heap: the pod almost always schedules its next wake at once, which then
		// moves this entry instead of removing it and adding another.
		q.fired, q.hasFired = ev.a, true
	case other:
		q.other.pop()
	}
	return true
}

// fifo is a queue of events scheduled in time order.
type fifo struct {
	items []event
	head  int
}

func (f *fifo) push(e event) {
	if n := len(f.items); n > f.head && e.t < f.items[n-1].t {
		outOfOrder(e.t, f.items[n-1].t)
	}
	if f.head > 1024 && f.head*2 > len(f.items) {
		f.compact()
	}
	f.items = append(f.items, e)
}

// compact moves the pending events to the front, out of push so that push stays inlinable.
func (f *fifo) compact() {
	f.items = append(f.items[:0], f.items[f.head:]...)
	f.head = 0
}

func outOfOrder(t, last float64) {
	panic(fmt.Sprintf("sim: event at t=%v queued after one at t=%v: a constant-delay queue got a variable delay", t, last))
}

// first returns the first event, or noEvent when the queue is empty.
func (f *fifo) first() *event {
	if f.head == len(f.items) {
		return &noEvent
	}
	return &f.items[f.head]
}

func (f *fifo) drop() {
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	}
}

// wakeTree holds each pod's pending wake in a tournament tree: every inner node names the pod
// with the earliest wake below it, so the earliest is at the root, and moving or dropping a
// pod's wake replays only the log₂(pods) matches on its path, with no positions to keep. Pods
// wake about once per request and a wake moves with almost every arrival.
type wakeTree struct {
	wakes  []event // by pod id; t is +Inf when none is pending
	winner []int32 // inner nodes 1..size-1; node size+i is the leaf of pod i
	size   int     // leaves: a power of two, at least 2
}

// head returns the earliest wake, which is at +Inf when no pod has one pending, or noEvent
// before the first pod.
func (w *wakeTree) head() *event {
	if w.size == 0 {
		return &noEvent
	}
	return &w.wakes[w.winner[1]]
}

func (w *wakeTree) set(e event) {
	if int(e.a) >= w.size {
		w.grow(int(e.a) + 1)
	}
	w.wakes[e.a] = e
	w.replay(int(e.a))
}

func (w *wakeTree) remove(pod int32) {
	if int(pod) >= w.size {
		return
	}
	w.wakes[pod].t = math.Inf(1)
	w.replay(int(pod))
}

// replay reruns the matches from pod's leaf up to the root: first pod against its sibling leaf,
// then between inner nodes' winners.
func (w *wakeTree) replay(pod int) {
	wakes, winner := w.wakes, w.winner
	node := (w.size + pod) >> 1
	winner[node] = earlier(wakes, int32(pod&^1), int32(pod|1))
	for node >>= 1; node >= 1; node >>= 1 {
		winner[node] = earlier(wakes, winner[2*node], winner[2*node+1])
	}
}

// earlier returns whichever of pods l and r wakes first.
func earlier(wakes []event, l, r int32) int32 {
	if wakes[r].before(&wakes[l]) {
		return r
	}
	return l
}

// match returns the pod with the earlier wake of the two nodes' winners.
func (w *wakeTree) match(left, right int) int32 {
	return earlier(w.wakes, w.leader(left), w.leader(right))
}

func (w *wakeTree) leader(node int) int32 {
	if node >= w.size {
		return int32(node - w.size)
	}
	return w.winner[node]
}

// grow makes room for pods pod ids and replays every match.
func (w *wakeTree) grow(pods int) {
	size := max(2, w.size)
	for size < pods {
		size *= 2
	}
	for len(w.wakes) < size {
		w.wakes = append(w.wakes, event{t: math.Inf(1), a: int32(len(w.wakes))})
	}
	w.size = size
	w.winner = make([]int32, size)
	for node := size - 1; node >= 1; node-- {
		w.winner[node] = w.match(2*node, 2*node+1)
	}
}

// eventHeap is a binary min-heap of events; container/heap's interface calls are not needed for
// one element type.
type eventHeap struct{ items []event }

// head returns the earliest event, or noEvent when the heap is empty.
func (q *eventHeap) head() *event {
	if len(q.items) == 0 {
		return &noEvent
	}
	return &q.items[0]
}

func (q *eventHeap) push(e event) {
	q.items = append(q.items, e)
	i := len(q.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.items[i].before(&q.items[p]) {
			break
		}
		q.items[i], q.items[p] = q.items[p], q.items[i]
		i = p
	}
}

func (q *eventHeap) pop() event {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items = q.items[:last]
	i, n := 0, len(q.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.items[r].before(&q.items[l]) {
			m = r
		}
		if !q.items[m].before(&q.items[i]) {
			break
		}
		q.items[i], q.items[m] = q.items[m], q.items[i]
		i = m
	}
	return top
}
