package sim

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkWeightsToShares measures how Envoy's weighted LEAST_REQUEST turns written weights into
// traffic shares: two identical pod groups, weights 1 and 4, at 60% load. Reported metric:
// share_ratio, the fast group's per-pod rps over the slow group's. With many proxies each sees
// few of its own requests in flight and shares follow weights; with one proxy the active-request
// divisor flattens them.
//
//	go test -run '^$' -bench WeightsToShares -benchtime 1x ./internal/sim/
func BenchmarkWeightsToShares(b *testing.B) {
	for _, proxies := range []int{1, 4, 30} {
		for _, ratio := range []int{2, 4} {
			b.Run(fmt.Sprintf("proxies=%d/weights=1:%d", proxies, ratio), func(b *testing.B) {
				src := fmt.Sprintf(`
name: shares
duration: 200s
warmup: 20s
seed: 5
load: {rps: 960}
clients: {proxies: %d, workers: 2, lb: least_request}
pods:
  - {name: low, replicas: 4, workers: 8, cpu_limit: 2, cost: {mean: 5ms, dist: exponential}}
  - {name: high, replicas: 4, workers: 8, cpu_limit: 2, cost: {mean: 5ms, dist: exponential}}
`, proxies)
				sc, err := ParseScenario([]byte(src), "shares")
				if err != nil {
					b.Fatal(err)
				}
				var share float64
				for b.Loop() {
					r, err := Run(sc, PolicyLeastRequest, Options{StaticWeights: map[string]int{"low": 100, "high": 100 * ratio}})
					if err != nil {
						b.Fatal(err)
					}
					var low, high float64
					for _, p := range r.Pods {
						if p.Name[:3] == "low" {
							low += p.RPS
						} else {
							high += p.RPS
						}
					}
					share = high / low
				}
				b.ReportMetric(share, "share_ratio")
				b.ReportMetric(float64(ratio), "weight_ratio")
			})
		}
	}
}

// BenchmarkSimulateSeedFib is the simulator's speed on its default scenario, one policy per
// iteration. Reported metrics: simulated requests (those counted in the result, sent after
// warm-up) per wall-clock second, and per second of this process's CPU time, which a machine
// shared with other work does not distort.
//
//	go test -run '^$' -bench SimulateSeedFib -benchtime 3x ./internal/sim/
func BenchmarkSimulateSeedFib(b *testing.B) {
	sc, err := Builtin(DefaultScenario)
	if err != nil {
		b.Fatal(err)
	}
	for _, policy := range DefaultPolicies {
		b.Run(policy, func(b *testing.B) {
			var reqs int64
			cpu0 := processCPUSeconds(b)
			for b.Loop() {
				r, err := Run(sc, policy, Options{})
				if err != nil {
					b.Fatal(err)
				}
				reqs += r.Requests
			}
			b.ReportMetric(float64(reqs)/b.Elapsed().Seconds(), "sim_req/s")
			b.ReportMetric(float64(reqs)/(processCPUSeconds(b)-cpu0), "sim_req/cpu_s")
		})
	}
}

// processCPUSeconds is the CPU time (user and system) this process has used so far.
func processCPUSeconds(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
