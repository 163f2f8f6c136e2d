package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var metricName = regexp.MustCompile(`adaptivelb_[a-z_]+`)

// definedMetrics collects every adaptivelb_* name the operator's code registers.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	err := filepath.Walk("../../internal", func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`Name:\s+"(adaptivelb_[a-z_]+)"`).FindAllStringSubmatch(string(data), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defined
}

// checkNames fails for a referenced adaptivelb_* series that no code defines.
func checkNames(t *testing.T, where, text string, defined map[string]bool) {
	t.Helper()
	for _, n := range metricName.FindAllString(text, -1) {
		base := n
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !defined[base] {
			t.Errorf("%s uses %s, which the operator does not export", where, n)
		}
	}
}

func TestDashboardAndAlertsUseOnlyExportedMetrics(t *testing.T) {
	defined := definedMetrics(t)
	if len(defined) < 8 {
		t.Fatalf("found only %v: the metric definitions moved?", defined)
	}
	raw, err := os.ReadFile("../../deploy/grafana/adaptive-lb.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if len(dash.Templating.List) == 0 || dash.Templating.List[0].Name != "datasource" {
		t.Fatal("dashboard lacks the datasource variable")
	}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			checkNames(t, "panel "+p.Title, target.Expr, defined)
			if strings.Count(target.Expr, "(") != strings.Count(target.Expr, ")") {
				t.Errorf("panel %s: unbalanced parentheses in %s", p.Title, target.Expr)
			}
		}
	}
	alerts, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(alerts, &rules); err != nil {
		t.Fatalf("alerts are not valid: %v", err)
	}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			seen[r.Alert] = true
			checkNames(t, "alert "+r.Alert, r.Expr, defined)
		}
	}
	for _, want := range []string{"AdaptiveLBEndpointPropagationSlow", "AdaptiveLBEndpointPropagationCritical", "AdaptiveLBMetricsSourceFailing", "AdaptiveLBWeightCycleStuck"} {
		if !seen[want] {
			t.Errorf("alert %s missing", want)
		}
	}
	copyInConfig, _ := os.ReadFile("../../config/prometheus/alerts.yaml")
	if string(copyInConfig) != string(alerts) {
		t.Error("config/prometheus/alerts.yaml differs from the chart's: run make manifests")
	}
}
