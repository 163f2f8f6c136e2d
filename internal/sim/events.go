package sim

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

// eventQueue is a binary min-heap specialised to events; container/heap's interface calls cost
// too much at millions of events per second.
type eventQueue struct {
	items []event
	seq   uint64
}

func (q *eventQueue) len() int { return len(q.items) }

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(t float64, kind eventKind, a int32, b uint32) {
	q.seq++
	q.items = append(q.items, event{t: t, seq: q.seq, kind: kind, a: a, b: b})
	i := len(q.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.items[i], q.items[p] = q.items[p], q.items[i]
		i = p
	}
}

func (q *eventQueue) pop() event {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items = q.items[:last]
	i := 0
	n := len(q.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q.items[i], q.items[m] = q.items[m], q.items[i]
		i = m
	}
	return top
}
