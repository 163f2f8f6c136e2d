package sim

import "fmt"

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

// event is ordered by (t, seq): seq makes ties deterministic in scheduling order.
type event struct {
	t    float64
	seq  uint64
	kind eventKind
	a    int32
	b    uint32
}

func (e *event) before(o *event) bool {
	if e.t != o.t {
		return e.t < o.t
	}
	return e.seq < o.seq
}

// scheduler hands out events in (t, seq) order. Almost every event is one of three kinds, each
// kept where it costs least instead of in one heap of millions of pushes:
//   - the next client arrival: there is only ever one;
//   - events a constant delay after now (a network hop, a probe's round trip): scheduled in time
//     order, so a FIFO per delay is already sorted;
//   - pod wakes: at most one pending per pod, in a small heap indexed by pod that is updated in
//     place when a pod's wake moves (a plain heap would pile up stale wakes).
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
	wakes      wakeHeap
	other      eventHeap
	// fired is the pod whose wake pop handed out last, left in place for the pod to reschedule
	// (setWake moves it, cancelWake drops it), while hasFired.
	fired    int32
	hasFired bool
}

func (q *scheduler) next(t float64, kind eventKind, a int32, b uint32) event {
	q.seq++
	return event{t: t, seq: q.seq, kind: kind, a: a, b: b}
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

// pop removes and returns the earliest event; false when none is left.
func (q *scheduler) pop() (event, bool) {
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
	src := none
	var best *event
	if q.hasArrival {
		best, src = &q.arrival, arrival
	}
	if e := q.hop.peek(); e != nil && (best == nil || e.before(best)) {
		best, src = e, hop
	}
	if e := q.probe.peek(); e != nil && (best == nil || e.before(best)) {
		best, src = e, probe
	}
	if e := q.wakes.peek(); e != nil && (best == nil || e.before(best)) {
		best, src = e, wake
	}
	if e := q.other.peek(); e != nil && (best == nil || e.before(best)) {
		best, src = e, other
	}
	if best == nil {
		return event{}, false
	}
	ev := *best
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
	return ev, true
}

// fifo is a queue of events scheduled in time order.
type fifo struct {
	items []event
	head  int
}

func (f *fifo) push(e event) {
	if n := len(f.items); n > f.head && e.t < f.items[n-1].t {
		panic(fmt.Sprintf("sim: event at t=%v queued after one at t=%v: a constant-delay queue got a variable delay", e.t, f.items[n-1].t))
	}
	if f.head > 1024 && f.head*2 > len(f.items) {
		f.items = append(f.items[:0], f.items[f.head:]...)
		f.head = 0
	}
	f.items = append(f.items, e)
}

func (f *fifo) peek() *event {
	if f.head == len(f.items) {
		return nil
	}
	return &f.items[f.head]
}

func (f *fifo) drop() {
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	}
}

// wakeHeap is a binary min-heap of pods' pending wakes with each pod's position, so that a wake
// can be moved or dropped where it is.
type wakeHeap struct {
	items []event // items[i].a is the pod id
	pos   []int   // by pod id: index in items, or -1
}

func (h *wakeHeap) peek() *event {
	if len(h.items) == 0 {
		return nil
	}
	return &h.items[0]
}

func (h *wakeHeap) set(e event) {
	for int(e.a) >= len(h.pos) {
		h.pos = append(h.pos, -1)
	}
	i := h.pos[e.a]
	if i < 0 {
		h.items = append(h.items, e)
		i = len(h.items) - 1
		h.pos[e.a] = i
		h.up(i)
		return
	}
	h.items[i] = e
	h.down(h.up(i))
}

func (h *wakeHeap) remove(pod int32) {
	if int(pod) >= len(h.pos) || h.pos[pod] < 0 {
		return
	}
	i, last := h.pos[pod], len(h.items)-1
	h.pos[pod] = -1
	if i != last {
		h.items[i] = h.items[last]
		h.pos[h.items[i].a] = i
	}
	h.items = h.items[:last]
	if i < last {
		h.down(h.up(i))
	}
}

func (h *wakeHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.pos[h.items[i].a], h.pos[h.items[j].a] = i, j
}

func (h *wakeHeap) up(i int) int {
	for i > 0 {
		p := (i - 1) / 2
		if !h.items[i].before(&h.items[p]) {
			break
		}
		h.swap(i, p)
		i = p
	}
	return i
}

func (h *wakeHeap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.items[r].before(&h.items[l]) {
			m = r
		}
		if !h.items[m].before(&h.items[i]) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// eventHeap is a binary min-heap of events; container/heap's interface calls are not needed for
// one element type.
type eventHeap struct{ items []event }

func (q *eventHeap) peek() *event {
	if len(q.items) == 0 {
		return nil
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
