package sim

import (
	"fmt"
	"testing"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

func TestZZDebugSpans(t *testing.T) {
	sc, err := LoadScenarioFile("/tmp/sc/t60-nofast.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration.Duration = 100e9
	sc.Warmup.Duration = 10e9
	var sim *simulation
	_ = sim
	_, err = Run(sc, PolicyTail, Options{seeInput: func(at float64, in weights.Input) {
		if at > 31 {
			return
		}
		for _, ep := range in.Endpoints {
			fmt.Printf("t=%.0f %s cpu=%.3f rps=%.1f has=%v\n", at, ep.ID, ep.CPUCores, ep.RequestRate, ep.HasMetrics)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
}
