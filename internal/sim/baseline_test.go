package sim

import (
	"path/filepath"
	"testing"
	"time"
)

// The published operator writes 1000 for every endpoint before its first cycle; the simulator
// used to start cpu-distance from Envoy's default of 1, which kept pods inside the dead band at
// the minimum while the others went to 350.
func TestRun_PublishedBaselinesStartFromTheWeightTheOperatorWritesFirst(t *testing.T) {
	sc, err := LoadScenarioFile(filepath.Join("..", "..", "bench", "scenarios", "three-gens-60.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration.Duration, sc.Warmup.Duration = 40*time.Second, 10*time.Second
	// The first cycle, at 30 s, must see a window of metrics: without lag it sees the first 30 s.
	sc.Controller.Metrics = NoMetricsLag()
	for _, policy := range []string{PolicyCPUDistance, PolicyCPUShare} {
		t.Run(policy, func(t *testing.T) {
			r, err := Run(sc, policy, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Weights) < 2 {
				t.Fatalf("%d weight writes logged, want the start and the first cycle", len(r.Weights))
			}
			if start := r.Weights[0]; start.TimeS != 0 || len(start.Weights) != 12 {
				t.Fatalf("first write %+v, want all 12 pods at t=0", start)
			}
			for pod, w := range r.Weights[0].Weights {
				if w != 1000 {
					t.Errorf("%s starts at %d, want 1000", pod, w)
				}
			}
			if policy != PolicyCPUDistance {
				return
			}
			for pod, w := range r.Weights[1].Weights {
				if w != 350 {
					t.Errorf("after the first cycle %s is at %d, want 350 like every pod", pod, w)
				}
			}
		})
	}
}
