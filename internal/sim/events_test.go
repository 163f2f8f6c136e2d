package sim

import (
	"math"
	"math/rand"
	"testing"
)

// TestWakeTree_HeadIsTheEarliestPendingWake moves, drops and adds pods' wakes at random, with
// ties in time broken by sequence, and checks the head against a scan of every pod.
func TestWakeTree_HeadIsTheEarliestPendingWake(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	var w wakeTree
	pending := map[int32]event{}
	var seq uint64
	for step := range 20000 {
		pod := int32(r.Intn(1 + min(step/500, 40))) // pods join over time: the tree grows
		if r.Intn(4) == 0 {
			w.remove(pod)
			delete(pending, pod)
		} else {
			seq++
			e := event{t: float64(r.Intn(50)), key: wakeKey(seq, pod), a: pod}
			w.set(e)
			pending[pod] = e
		}
		var want *event
		for _, e := range pending {
			if want == nil || e.before(want) {
				e := e
				want = &e
			}
		}
		gotT, gotKey := w.head()
		switch {
		case want == nil && gotT != infBits:
			t.Fatalf("step %d: nothing pending, head gives pod %d at %v", step, wakePod(gotKey), math.Float64frombits(gotT))
		case want != nil && (math.Float64frombits(gotT) != want.t || gotKey != want.key || wakePod(gotKey) != want.a):
			t.Fatalf("step %d: head gives pod %d at %v (key %#x), want pod %d at %v (key %#x)", step,
				wakePod(gotKey), math.Float64frombits(gotT), gotKey, want.a, want.t, want.key)
		}
	}
}
