package sim

import (
	"strconv"
	"testing"
	"time"
)

// singlePod builds a one-pod, one-proxy scenario for queueing-theory checks.
func singlePod(t *testing.T, yamlPods string, rps float64, dur time.Duration) *Scenario {
	t.Helper()
	src := []byte(`
name: single
duration: ` + dur.String() + `
warmup: 20s
seed: 42
load: {rps: ` + ftoa(rps) + `, arrival: poisson}
clients: {proxies: 1, workers: 1, lb: least_request}
pods:
` + yamlPods)
	sc, err := ParseScenario(src, "test")
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
