package sim

import (
	"fmt"
	"math"
	"math/bits"
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
	evFastCheck                    // the controller's check between cycles
)

// event is ordered by (t, seq): seq makes ties deterministic in scheduling order. The sequence
// number and the kind share one word, the sequence number in the high bits, so that an event is
// 24 bytes (every queue moves events by value) and ordering by the word orders by seq. A pod
// wake's key also names its pod, between the two (wakeKey), so that the wake tree need not
// keep anything else.
type event struct {
	t   float64
	key uint64 // seq<<seqShift | pod<<8 (wakes only) | kind
	a   int32
	b   uint32
}

const (
	seqShift = 24 // 2⁴⁰ events per run
	podBits  = seqShift - 8
	// maxPods is how many pods a run can create: a wake's key holds the pod id.
	maxPods = 1 << podBits
)

// wakeKey is the key of a wake of pod with sequence number seq.
func wakeKey(seq uint64, pod int32) uint64 {
	return seq<<seqShift | uint64(pod)<<8 | uint64(evPodWake)
}

// wakePod is the pod whose wake has key.
func wakePod(key uint64) int32 { return int32(key >> 8 & (maxPods - 1)) }

func (e *event) kind() eventKind { return eventKind(e.key) }

func (e *event) before(o *event) bool {
	return precedesBits(math.Float64bits(e.t), e.key, math.Float64bits(o.t), o.key)
}

// precedesBits reports whether an event at time bits tb with key k orders before one at ob
// with key ok, as one 128-bit unsigned subtraction with no branch: event times are never
// negative, and the bits of non-negative floats (+Inf included) order as the floats do. The
// result can feed conditional moves, which pay off where which of two events comes first is a
// coin toss for the branch predictor.
func precedesBits(tb, k, ob, ok uint64) bool {
	_, borrow := bits.Sub64(k, ok, 0)
	_, borrow = bits.Sub64(tb, ob, borrow)
	return borrow != 0
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
// would give. The zero value is not ready: use newScheduler.
type scheduler struct {
	seq     uint64
	arrival event // noEvent when none is pending
	hop     fifo  // delay: half the network round trip
	probe   fifo  // delay: a Prequal probe's round trip
	wakes   wakeTree
	other   eventHeap
	// rareT and rareKey are the order of the earlier of probe's and other's first events,
	// worked out whenever either changes: most runs have no probes, and other's events are a few
	// per simulated second, so earliest compares one source for both.
	rareT, rareKey uint64
}

func newScheduler() scheduler {
	return scheduler{arrival: noEvent, rareT: infBits, rareKey: math.MaxUint64}
}

// refreshRare works out rareT and rareKey.
func (q *scheduler) refreshRare() {
	q.rareT, q.rareKey = timeKey(q.probe.first())
	if t, key := timeKey(q.other.head()); precedesBits(t, key, q.rareT, q.rareKey) {
		q.rareT, q.rareKey = t, key
	}
}

func (q *scheduler) next(t float64, kind eventKind, a int32, b uint32) event {
	q.seq++
	return event{t: t, key: q.seq<<seqShift | uint64(kind), a: a, b: b}
}

// setArrival schedules the next client arrival, which must not be pending already.
func (q *scheduler) setArrival(t float64) {
	q.arrival = q.next(t, evArrival, 0, 0)
}

// pushHop schedules an event half a network round trip from now; t must not be earlier than
// the last one scheduled this way.
func (q *scheduler) pushHop(t float64, kind eventKind, a int32) { q.hop.push(q.next(t, kind, a, 0)) }

// pushProbe schedules a probe's return one probe round trip from now, in time order.
func (q *scheduler) pushProbe(t float64, proxy int32, pod uint32) {
	q.probe.push(q.next(t, evProbe, proxy, pod))
	q.refreshRare()
}

// setWake schedules pod's next wake at t, replacing any pending one.
func (q *scheduler) setWake(pod int32, t float64) {
	q.seq++
	q.wakes.set(event{t: t, key: wakeKey(q.seq, pod), a: pod})
}

// cancelWake drops pod's pending wake, if any.
func (q *scheduler) cancelWake(pod int32) {
	q.wakes.remove(pod)
}

// push schedules any other event. Its time must not be negative (see precedesBits).
func (q *scheduler) push(t float64, kind eventKind, a int32, b uint32) {
	if !(t >= 0) {
		panic(fmt.Sprintf("sim: event of kind %d scheduled at t=%v: event times must not be negative", kind, t))
	}
	q.other.push(q.next(t, kind, a, b))
	q.refreshRare()
}

// noEvent stands for an empty source in earliest: it comes after every event.
var noEvent = event{t: math.Inf(1), key: math.MaxUint64}

// infBits is +Inf's bits: the time of noEvent and of an idle wake.
var infBits = math.Float64bits(math.Inf(1))

// timeKey returns e's order: its time's bits and its key, loaded before they are compared so
// that choosing needs no further load.
func timeKey(e *event) (uint64, uint64) { return math.Float64bits(e.t), e.key }

// source is where the earliest pending event waits.
type source uint8

const (
	srcArrival source = iota
	srcHop
	srcWake
	srcRare // a probe or an event of the general heap
)

// earliest returns where the earliest pending event waits, its time and its key; the time is
// +Inf when nothing is pending. It removes nothing: the caller takes the event from its source
// (dropArrival, takeHop, takeRare), or, for a wake, has the pod move or cancel it. Telling the
// caller the source, not only the event, lets it dispatch once instead of twice.
func (q *scheduler) earliest() (source, float64, uint64) {
	// Every source offers an event, noEvent when it has none. The earliest so far is held as
	// its time's bits and its key, so that each source is one comparison whose outcome the
	// compiler turns into conditional moves, not a branch that guesses which source is next.
	bt, bk, src := math.Float64bits(q.arrival.t), q.arrival.key, srcArrival
	if et, ek := timeKey(q.hop.first()); precedesBits(et, ek, bt, bk) {
		bt, bk, src = et, ek, srcHop
	}
	if et, ek := q.wakes.head(); precedesBits(et, ek, bt, bk) {
		bt, bk, src = et, ek, srcWake
	}
	if precedesBits(q.rareT, q.rareKey, bt, bk) {
		bt, bk, src = q.rareT, q.rareKey, srcRare
	}
	return src, math.Float64frombits(bt), bk
}

// dropArrival removes the pending arrival.
func (q *scheduler) dropArrival() { q.arrival = noEvent }

// takeHop removes and returns the first event half a round trip from its start.
func (q *scheduler) takeHop() event {
	e := *q.hop.first()
	q.hop.drop()
	return e
}

// takeRare removes and returns the earlier of the first probe and the general heap's head.
func (q *scheduler) takeRare() event {
	var e event
	if p := q.probe.first(); p.key == q.rareKey {
		e = *p
		q.probe.drop()
	} else {
		e = q.other.pop()
	}
	q.refreshRare()
	return e
}

// fifo is a queue of events scheduled in time order, in a ring whose length is a power of two:
// pushing and dropping move a counter, with nothing to compact.
type fifo struct {
	ring       []event
	head, tail uint    // pending: ring positions head … tail-1, modulo len(ring)
	last       float64 // the latest time pushed
}

func (f *fifo) push(e event) {
	if e.t < f.last {
		outOfOrder(e.t, f.last)
	}
	f.last = e.t
	if f.tail-f.head == uint(len(f.ring)) {
		f.grow()
	}
	f.ring[f.tail&uint(len(f.ring)-1)] = e
	f.tail++
}

// grow doubles the ring, out of push so that push stays inlinable.
func (f *fifo) grow() {
	ring := make([]event, max(64, 2*len(f.ring)))
	for i := f.head; i != f.tail; i++ {
		ring[i-f.head] = f.ring[i&uint(len(f.ring)-1)]
	}
	f.ring, f.head, f.tail = ring, 0, f.tail-f.head
}

func outOfOrder(t, last float64) {
	panic(fmt.Sprintf("sim: event at t=%v queued after one at t=%v: a constant-delay queue got a variable delay", t, last))
}

// first returns the first event, or noEvent when the queue is empty.
func (f *fifo) first() *event {
	if f.head == f.tail {
		return &noEvent
	}
	return &f.ring[f.head&uint(len(f.ring)-1)]
}

func (f *fifo) drop() { f.head++ }

// wakeTree holds each pod's pending wake in a tournament tree: every inner node holds the
// earliest wake below it, so the earliest is at the root, and moving or dropping a pod's wake
// replays only the log₂(pods) matches on its path, with no positions to keep. Pods wake about
// once per request and a wake moves with almost every arrival. A node is a wake's order alone
// (its time's bits and its key, which names the pod): 16 bytes, and each match keeps the
// earlier of the wake coming up from below, held in registers, and its sibling by conditional
// moves, as which one wins is a coin toss for a branch.
type wakeTree struct {
	// nodes[1] is the root, nodes[n] has children 2n and 2n+1, and nodes[size+i] is pod i's
	// leaf: its pending wake, or idleWake.
	nodes []wakeNode
	size  int // leaves: a power of two, at least 2; 0 before the first pod
}

// wakeNode is a pod wake's order: its time's bits and its key (see wakeKey).
type wakeNode struct{ t, key uint64 }

// idleWake is the leaf of a pod with no wake pending: it orders after every wake.
var idleWake = wakeNode{t: infBits, key: math.MaxUint64}

// head returns the earliest wake's order, which is idleWake's when no pod has one pending.
func (w *wakeTree) head() (t, key uint64) {
	if w.size == 0 {
		return idleWake.t, idleWake.key
	}
	return w.nodes[1].t, w.nodes[1].key
}

// set makes e, a wake of pod e.a keyed by wakeKey, that pod's pending wake.
func (w *wakeTree) set(e event) {
	if int(e.a) >= w.size {
		w.grow(int(e.a) + 1)
	}
	w.replay(w.size+int(e.a), wakeNode{t: math.Float64bits(e.t), key: e.key})
}

func (w *wakeTree) remove(pod int32) {
	if int(pod) >= w.size {
		return
	}
	w.replay(w.size+int(pod), idleWake)
}

// replay puts n at leaf and reruns the matches from there up to the root.
func (w *wakeTree) replay(leaf int, n wakeNode) {
	nodes := w.nodes
	nodes[leaf] = n
	t, key := n.t, n.key
	for node := leaf; node > 1; {
		sibling := nodes[node^1]
		if precedesBits(sibling.t, sibling.key, t, key) {
			t, key = sibling.t, sibling.key
		}
		node >>= 1
		nodes[node] = wakeNode{t: t, key: key}
	}
}

// grow makes room for pods pod ids and replays every match.
func (w *wakeTree) grow(pods int) {
	size := max(2, w.size)
	for size < pods {
		size *= 2
	}
	nodes := make([]wakeNode, 2*size)
	for pod := range size {
		nodes[size+pod] = idleWake
		if pod < w.size {
			nodes[size+pod] = w.nodes[w.size+pod]
		}
	}
	for node := size - 1; node >= 1; node-- {
		l, r := nodes[2*node], nodes[2*node+1]
		nodes[node] = l
		if precedesBits(r.t, r.key, l.t, l.key) {
			nodes[node] = r
		}
	}
	w.nodes, w.size = nodes, size
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
