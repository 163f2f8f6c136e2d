package sim

import (
	"fmt"
	"math"
	"os"
	"sort"
	"testing"
	"time"
)

// TestCalibrationGrid scores a grid of seed-fib variants under least_request against the
// published "before" figures and prints the best fifteen. It is how seed-fib was calibrated.
func TestCalibrationGrid(t *testing.T) {
	if os.Getenv("CALIBRATE") == "" {
		t.Skip("a measurement, not a test: CALIBRATE=1 go test -run TestCalibrationGrid -v ./internal/sim/ (docs/simulator.md)")
	}
	type res struct {
		desc  string
		score float64
	}
	var out []res
	phi := (1 + math.Sqrt(5)) / 2
	for _, cv := range []float64{0.2, 0.6, 1.0} {
		for _, base := range []float64{2.7, 3.0} {
			for _, limit := range []float64{2, 2.5, 3} {
				for _, nl := range []float64{4, 8} {
					for _, wk := range []int{4, 8} {
						sc, _ := Builtin("seed-fib")
						sc.Duration.Duration = 300 * time.Second
						sc.Warmup.Duration = 60 * time.Second
						sc.Clients.NetworkLatency.Duration = time.Duration(nl * float64(time.Millisecond))
						for i := range sc.Pods {
							n := []float64{25, 26, 27, 29}[i]
							sc.Pods[i].Cost.CV = cv
							sc.Pods[i].Cost.Mean.Duration = time.Duration(base * math.Pow(phi, n-25) * float64(time.Millisecond))
							sc.Pods[i].CPULimit = limit
							sc.Pods[i].Workers = wk
							sc.Pods[i].Cores = float64(wk)
						}
						r, err := Run(sc, PolicyLeastRequest, Options{})
						if err != nil {
							t.Fatal(err)
						}
						lo, hi := 99.0, 0.0
						for _, p := range r.Pods {
							lo, hi = math.Min(lo, p.CPU), math.Max(hi, p.CPU)
						}
						l := r.Latency
						sq := func(a, b float64) float64 { d := math.Log(a / b); return d * d }
						score := sq(l.P50, 14) + sq(l.P90, 38) + sq(l.P95, 47) + sq(l.P99, 93) + sq(r.TotalCPU, 10) + sq(hi, 2.2)
						out = append(out, res{fmt.Sprintf("cv %.1f base %.1f limit %.1f nl %.0f wk %d | p50 %.1f p90 %.1f p95 %.1f p99 %.1f cpu %.2f range %.2f-%.2f", cv, base, limit, nl, wk, l.P50, l.P90, l.P95, l.P99, r.TotalCPU, lo, hi), score})
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].score < out[j].score })
	for _, o := range out[:15] {
		fmt.Printf("%.3f %s\n", o.score, o.desc)
	}
}
