package metrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

func TestRenderQuery_RemoteClusters(t *testing.T) {
	for name, tc := range map[string]struct {
		labels Labels
		want   string
	}{
		"default labels": {Labels{}, `max by (namespace, pod) (istiod_managed_clusters{cluster_type="remote", namespace=~"istio-system"})`},
		"a relabelled scrape": {Labels{Namespace: "kubernetes_namespace", Pod: "kubernetes_pod_name"},
			`max by (kubernetes_namespace, kubernetes_pod_name) (istiod_managed_clusters{cluster_type="remote", kubernetes_namespace=~"istio-system"})`},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := RenderQuery("remoteClusters", DefaultRemoteClustersQuery, NewTemplateData([]string{"istio-system"}, "", time.Minute, tc.labels))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

// istiodGauge is istiod_managed_clusters as a kubernetes-pods scrape of istiod exports it:
// the local cluster and the remote ones, per istiod pod, sampled every 15 s up to at.
func istiodGauge(namespace, pod string, remote float64, at time.Time) string {
	var b strings.Builder
	for ts := at.Add(-2 * time.Minute); !ts.After(at); ts = ts.Add(15 * time.Second) {
		fmt.Fprintf(&b, "istiod_managed_clusters{cluster_type=\"local\",app=\"istiod\",namespace=%q,pod=%q} 1 %d\n", namespace, pod, ts.UnixMilli())
		fmt.Fprintf(&b, "istiod_managed_clusters{cluster_type=\"remote\",app=\"istiod\",namespace=%q,pod=%q} %g %d\n", namespace, pod, remote, ts.UnixMilli())
	}
	return b.String()
}

func TestPrometheusSource_RemoteClusters_VictoriaMetrics(t *testing.T) {
	vm := vmtest.Start(t)
	// An hour back: VictoriaMetrics answers the last 30 s as of 30 s ago (-search.latencyOffset).
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	vm.ImportText(t, istiodGauge("istio-system", "istiod-7d9f", 0, at)+istiodGauge("istio-system", "istiod-canary-5c2b", 2, at)+
		istiodGauge("istio-other", "istiod-1", 5, at))
	src, _ := newTestSource(t, Config{URL: vm.URL})

	got, err := src.RemoteClusters(context.Background(), at, "istio-system")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"istio-system/istiod-7d9f": 0, "istio-system/istiod-canary-5c2b": 2}
	if !maps.Equal(got.ByIstiod, want) {
		t.Errorf("RemoteClusters = %v, want %v (only istiod's namespace, the remote count of each pod)", got.ByIstiod, want)
	}
	if got.Query != `max by (namespace, pod) (istiod_managed_clusters{cluster_type="remote", namespace=~"istio-system"})` {
		t.Errorf("query %s", got.Query)
	}

	// A TSDB that does not scrape istiod cannot say.
	if _, err := src.RemoteClusters(context.Background(), at, "istio-elsewhere"); !errors.Is(err, ErrNoData) {
		t.Errorf("no istiod series: err = %v, want ErrNoData", err)
	}

	// A query override, e.g. for a TSDB that holds several clusters' series.
	vm.ImportText(t, strings.ReplaceAll(istiodGauge("istio-system", "istiod-7d9f", 3, at), "app=", `cluster="east",app=`))
	east, _ := newTestSource(t, Config{URL: vm.URL, RemoteClustersQuery: `max by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (istiod_managed_clusters{cluster="east", cluster_type="remote", {{.Labels.Namespace}}=~"{{.Namespaces}}"})`})
	got, err = east.RemoteClusters(context.Background(), at, "istio-system")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"istio-system/istiod-7d9f": 3}; !maps.Equal(got.ByIstiod, want) {
		t.Errorf("with the override: %v, want %v", got.ByIstiod, want)
	}
}

func TestPrometheusSource_RemoteClusters_Faults(t *testing.T) {
	if _, err := New(Config{URL: "http://vm", RemoteClustersQuery: "{{.Cluster}}"}, nil); !errors.Is(err, ErrTemplate) {
		t.Errorf("a broken override: err = %v, want ErrTemplate at configuration", err)
	}
	src, _ := newTestSource(t, Config{URL: "http://127.0.0.1:1", Timeout: time.Second})
	if _, err := src.RemoteClusters(context.Background(), time.Now(), "istio-system"); !errors.Is(err, ErrUnreachable) {
		t.Errorf("an unreachable TSDB: err = %v, want ErrUnreachable", err)
	}
}
