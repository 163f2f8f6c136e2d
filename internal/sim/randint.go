package sim

import (
	"math/bits"
	"math/rand"
)

// boundedInt draws integers in [0, n) from a *rand.Rand with exactly the draws and results of
// r.Intn(n) (math/rand keeps its stream fixed for a seed, and the simulator's outputs rest on
// it), for a small n fixed in advance. Intn divides twice per call, once for its rejection bound
// and once for the remainder; here the bound is worked out once and the remainder is taken by
// multiplication (Lemire's exact remainder for 32-bit operands). The simulator draws a proxy
// and two hosts per request.
type boundedInt struct {
	n     uint32
	mask  int32  // n-1 when n is a power of two, else -1
	bound int32  // the largest 31-bit draw accepted: draws above it would bias the remainder
	recip uint64 // ⌊(2⁶⁴-1)/n⌋+1
}

func newBoundedInt(n int) boundedInt {
	if n <= 0 || n > 1<<31-1 {
		panic("sim: boundedInt needs 0 < n < 2³¹")
	}
	b := boundedInt{n: uint32(n), mask: -1}
	if n&(n-1) == 0 {
		b.mask = int32(n - 1)
		return b
	}
	b.bound = int32((1 << 31) - 1 - (1<<31)%uint32(n))
	b.recip = ^uint64(0)/uint64(n) + 1
	return b
}

// draw returns what r.Intn(n) would.
func (b *boundedInt) draw(r *rand.Rand) int {
	v := int32(r.Int63() >> 32)
	if b.mask >= 0 {
		return int(v & b.mask)
	}
	for v > b.bound {
		v = int32(r.Int63() >> 32)
	}
	hi, _ := bits.Mul64(b.recip*uint64(v), uint64(b.n))
	return int(hi)
}
