package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// alertExprs reads the chart's alert expressions by alert name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// histogram renders the cumulative buckets of adaptivelb_endpoint_propagation_seconds growing
// at the given per-second rates (le → rate), sampled every 15 s over the 10 minutes before end.
func histogram(phase string, rates map[string]float64, end time.Time) string {
	var b strings.Builder
	for le, r := range rates {
		b.WriteString(vmtest.Counter(fmt.Sprintf(`adaptivelb_endpoint_propagation_seconds_bucket{phase=%q,le=%q}`, phase, le), r, end.Add(-10*time.Minute), end, 15*time.Second))
	}
	return b.String()
}

// Every alert expression is evaluated by a real VictoriaMetrics over samples shaped like the
// operator's own metrics: each alert must return a series when its condition holds and none
// when the operator is healthy. (The `for` durations are Prometheus's rule evaluation, not
// part of the expression.)
func TestAlerts_FireWhenTheirConditionHoldsAndOnlyThen(t *testing.T) {
	vm := vmtest.Start(t)
	exprs := alertExprs(t)
	base := time.Now().Add(-6 * time.Hour).Truncate(time.Hour)
	healthy, slow, critical := base, base.Add(time.Hour), base.Add(2*time.Hour)

	// 100 propagations/s. Healthy: all within 50 ms. Slow: p99 at 1.75 s (1 + 1.5 × 1/2 inside
	// the (1, 2.5] bucket). Critical: p99 at 3.75 s (inside (2.5, 5]).
	all := func(r float64) map[string]float64 {
		return map[string]float64{"0.05": r, "0.1": r, "0.5": r, "1": r, "2.5": r, "5": r, "+Inf": r}
	}
	vm.ImportText(t, histogram("healthy", all(100), healthy))
	vm.ImportText(t, histogram("slow", map[string]float64{"0.05": 90, "0.1": 95, "0.5": 97, "1": 98, "2.5": 100, "5": 100, "+Inf": 100}, slow))
	vm.ImportText(t, histogram("critical", map[string]float64{"0.05": 90, "0.1": 92, "0.5": 94, "1": 95, "2.5": 96, "5": 100, "+Inf": 100}, critical))

	// Metrics source: errors growing at 0.2/s while failing, flat while healthy.
	vm.ImportText(t, vmtest.Counter(`adaptivelb_metrics_query_errors_total{phase="healthy",query="cpu",reason="timeout"}`, 0, healthy.Add(-10*time.Minute), healthy, 15*time.Second))
	vm.ImportText(t, vmtest.Counter(`adaptivelb_metrics_query_errors_total{phase="failing",query="cpu",reason="timeout"}`, 0.2, slow.Add(-10*time.Minute), slow, 15*time.Second))

	// Weight cycle: last success 10 s before the evaluation when healthy, 10 minutes when stuck.
	var gauge strings.Builder
	for ts := healthy.Add(-10 * time.Minute); !ts.After(healthy); ts = ts.Add(15 * time.Second) {
		fmt.Fprintf(&gauge, "adaptivelb_weight_cycle_last_success_timestamp_seconds{phase=\"healthy\"} %d %d\n", ts.Add(-10*time.Second).Unix(), ts.UnixMilli())
	}
	for ts := slow.Add(-10 * time.Minute); !ts.After(slow); ts = ts.Add(15 * time.Second) {
		fmt.Fprintf(&gauge, "adaptivelb_weight_cycle_last_success_timestamp_seconds{phase=\"stuck\"} %d %d\n", slow.Add(-20*time.Minute).Unix(), ts.UnixMilli())
	}
	vm.ImportText(t, gauge.String())

	client, err := api.NewClient(api.Config{Address: vm.URL})
	if err != nil {
		t.Fatal(err)
	}
	query := func(expr string, at time.Time) model.Vector {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, _, err := promv1.NewAPI(client).Query(ctx, expr, at)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		vec, ok := v.(model.Vector)
		if !ok {
			t.Fatalf("%s: result %T, want a vector", expr, v)
		}
		return vec
	}
	cases := []struct {
		alert     string
		firesAt   []time.Time
		quietAt   []time.Time
		whyFiring string
	}{
		{"AdaptiveLBEndpointPropagationSlow", []time.Time{slow, critical}, []time.Time{healthy}, "p99 above 1 s"},
		{"AdaptiveLBEndpointPropagationCritical", []time.Time{critical}, []time.Time{healthy, slow}, "p99 above 2 s"},
		{"AdaptiveLBMetricsSourceFailing", []time.Time{slow}, []time.Time{healthy}, "query errors growing"},
		{"AdaptiveLBWeightCycleStuck", []time.Time{slow}, []time.Time{healthy}, "no successful cycle for 20 minutes"},
	}
	for _, tc := range cases {
		expr, ok := exprs[tc.alert]
		if !ok {
			t.Errorf("alert %s is missing", tc.alert)
			continue
		}
		for _, at := range tc.firesAt {
			if v := query(expr, at); len(v) == 0 {
				t.Errorf("%s does not fire at %s (%s): %s", tc.alert, at.Sub(base), tc.whyFiring, expr)
			}
		}
		for _, at := range tc.quietAt {
			if v := query(expr, at); len(v) != 0 {
				t.Errorf("%s fires at %s, where the operator is healthy for it: %v", tc.alert, at.Sub(base), v)
			}
		}
	}
}
