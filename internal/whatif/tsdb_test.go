package whatif

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// Prometheus's rate() needs two samples inside its range: with sidecars scraped every minute, a
// 30 s step would read no load at all there. The step follows the scrape interval the series show.
func TestRead_StepIsAtLeastTwiceTheScrapeInterval(t *testing.T) {
	vm := vmtest.Start(t)
	sc, err := sim.ParseScenario([]byte(`
name: scrape
duration: 600s
warmup: 0s
seed: 1
load: {rps: 200}
clients: {proxies: 5, workers: 2}
pods:
  - {name: a, replicas: 2, workers: 4, cores: 4, cpu_limit: 1, cost: {mean: 5ms, dist: lognormal, cv: 0.5}}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: "slow", Service: "web", ScrapeInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Run(sc, sim.PolicyLeastRequest, sim.Options{Metrics: rec}); err != nil {
		t.Fatal(err)
	}
	start := pastStart()
	var b strings.Builder
	if err := rec.WriteText(&b, start); err != nil {
		t.Fatal(err)
	}
	vm.ImportText(t, b.String())
	m, err := newReader(t, vm.URL).Read(context.Background(), Window{Namespace: "slow", Service: "web", End: start.Add(10 * time.Minute), Length: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if m.Step != 2*time.Minute {
		t.Errorf("step %v with a scrape every minute, want 2m0s", m.Step)
	}
	if !strings.Contains(strings.Join(m.Notes, "\n"), "scraped about every 1m0s, so the load is read in steps of 2m0s") {
		t.Errorf("notes do not say why the step grew: %q", m.Notes)
	}
	for k, r := range m.Load {
		if r < 180 || r > 220 {
			t.Errorf("step %d: %.1f rps, want about 200", k, r)
		}
	}
}
