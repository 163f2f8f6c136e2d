package metrics

import (
	"errors"
	"testing"
	"time"
)

func TestRenderQuery_DefaultQueries(t *testing.T) {
	data := NewTemplateData([]string{"shop", "pay.eu", "shop"}, "", time.Minute, Labels{})
	cases := map[string]struct {
		template string
		want     string
	}{
		"cpu excludes the pause container, the pod cgroup and the sidecar": {
			DefaultCPUQuery,
			`sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{namespace=~"pay\\.eu|shop", pod=~".+", container!="", container!="POD", container!="istio-proxy"}[1m]))`,
		},
		"request rate counts the server side of Istio": {
			DefaultRequestRateQuery,
			`sum by (namespace, pod) (rate(istio_requests_total{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+"}[1m]))`,
		},
		"error rate is 5xx, with zero for pods that never failed": {
			DefaultErrorRateQuery,
			`sum by (namespace, pod) (rate(istio_requests_total{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+", response_code=~"5.."}[1m])) or (0 * sum by (namespace, pod) (rate(istio_requests_total{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+"}[1m])))`,
		},
		"p99 latency is converted from milliseconds to seconds": {
			DefaultLatencyP99Query,
			`histogram_quantile(0.99, sum by (namespace, pod, le) (rate(istio_request_duration_milliseconds_bucket{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+"}[1m]))) / 1000`,
		},
		"latency histogram keeps each pod's buckets over the window": {
			DefaultLatencyHistogramQuery,
			`sum by (namespace, pod, le) (increase(istio_request_duration_milliseconds_bucket{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+"}[1m]))`,
		},
		"cpu freshness probe takes the newest raw sample": {
			DefaultCPUFreshnessQuery,
			`max by (namespace, pod) (timestamp(container_cpu_usage_seconds_total{namespace=~"pay\\.eu|shop", pod=~".+", container!="", container!="POD", container!="istio-proxy"}))`,
		},
		"istio freshness probe takes the oldest of the pod's series' newest samples": {
			DefaultIstioFreshnessQuery,
			`min by (namespace, pod) (timestamp(istio_requests_total{reporter="destination", namespace=~"pay\\.eu|shop", pod=~".+"}))`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := RenderQuery("test", tc.template, data)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func TestRenderQuery_RelabelledSetup(t *testing.T) {
	data := NewTemplateData([]string{"shop"}, `api-.*`, 90*time.Second, Labels{Namespace: "kubernetes_namespace", Pod: "kubernetes_pod_name"})
	got, err := RenderQuery("cpu", DefaultCPUQuery, data)
	if err != nil {
		t.Fatal(err)
	}
	want := `sum by (kubernetes_namespace, kubernetes_pod_name) (rate(container_cpu_usage_seconds_total{kubernetes_namespace=~"shop", kubernetes_pod_name=~"api-.*", container!="", container!="POD", container!="istio-proxy"}[1m30s]))`
	if got != want {
		t.Errorf("rendered\n got: %s\nwant: %s", got, want)
	}
}

func TestRenderQuery_Errors(t *testing.T) {
	data := NewTemplateData([]string{"shop"}, "", time.Minute, Labels{})
	for name, text := range map[string]string{
		"an unknown field fails instead of rendering <no value>": `rate(x{ns="{{.Namespace}}"}[{{.Window}}])`,
		"a syntax error names the template":                      `rate(x[{{.Window}]`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := RenderQuery("cpu", text, data)
			if !errors.Is(err, ErrTemplate) {
				t.Fatalf("got %v, want ErrTemplate", err)
			}
			if Reason(err) != "template" {
				t.Errorf("reason %q", Reason(err))
			}
		})
	}
}

func TestNamespaceRegex(t *testing.T) {
	cases := map[string]struct {
		in   []string
		want string
	}{
		"no namespaces match all":                  {nil, ".+"},
		"names are sorted and de-duplicated":       {[]string{"b", "a", "b"}, "a|b"},
		"dots are regex-quoted and PromQL-escaped": {[]string{"a.b"}, `a\\.b`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := NamespaceRegex(tc.in); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestQueryTemplates_Or(t *testing.T) {
	got := QueryTemplates{CPU: "mine"}.Or(DefaultQueries)
	if got.CPU != "mine" || got.RequestRate != DefaultRequestRateQuery || got.LatencyP99 != DefaultLatencyP99Query {
		t.Errorf("override merge wrong: %+v", got)
	}
}
