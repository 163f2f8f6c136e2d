package sim

import (
	"math"
	"testing"
)

// Past 2048 s of simulated time a float64 second has a resolution of 4.5e-13 s, so the last bit
// of a pod's CPU quota spread over 8 busy cores (1e-12 / 8) no longer moves the clock: the pod
// woke at the same instant forever (docs/examples/what-if-web.yaml hung at 2049 s).
func TestPod_NextWakeMovesTheClockLateInALongRun(t *testing.T) {
	p := &pod{cores: 8, workers: 8, limit: 2, quota: 2 * cfsPeriod, speed: 1, lastT: 2048.5, periodEnd: 2048.55, vwork: 1500, minFinish: math.Inf(1)}
	for i := range 8 {
		p.start(int32(i), 1)
	}
	p.used = p.quota - 1.2e-12 // not yet counted as spent (1e-12), but nearly
	p.advance(p.lastT)
	if p.throttled {
		t.Fatal("the pod is throttled before its quota is spent; the case is not set up")
	}
	w := p.nextWake()
	if !(w > p.lastT) {
		t.Fatalf("next wake %.17g is not after now %.17g: the pod would wake at the same instant forever", w, p.lastT)
	}
	p.advance(w)
	if !p.throttled {
		t.Fatalf("after waking at %.17g the pod has spent %.3g of %.3g s of quota and is not throttled", w, p.used, p.quota)
	}
	if next := p.nextWake(); next != p.periodEnd || math.IsInf(next, 0) {
		t.Fatalf("a throttled pod wakes at %v, want its period end %v", next, p.periodEnd)
	}
}
