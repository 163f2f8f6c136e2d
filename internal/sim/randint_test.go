package sim

import (
	"math/rand"
	"testing"
)

// TestBoundedInt_DrawsWhatIntnDraws checks that boundedInt gives the results of rand.Intn and
// leaves the generator in the same state, for powers of two, small and large bounds, and bounds
// whose rejection region is large.
func TestBoundedInt_DrawsWhatIntnDraws(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 8, 15, 30, 100, 1000, 1<<30 + 1, 1<<31 - 1, 3 << 29} {
		want, got := rand.New(rand.NewSource(int64(n))), rand.New(rand.NewSource(int64(n)))
		b := newBoundedInt(n)
		for i := range 20000 {
			if w, g := want.Intn(n), b.draw(got); w != g {
				t.Fatalf("n=%d, draw %d: got %d, rand.Intn gives %d", n, i, g, w)
			}
		}
		if w, g := want.Int63(), got.Int63(); w != g {
			t.Fatalf("n=%d: the generators drifted apart (next Int63 %d vs %d)", n, g, w)
		}
	}
}
