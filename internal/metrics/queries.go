package metrics

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/prometheus/common/model"
)

// QueryTemplates holds one Go text/template per signal. It mirrors the CRD fields
// spec.metrics.queries.{cpu,requestRate,errorRate,latencyP99}. An empty field means "use the
// next level's template" (AdaptiveLoadBalancer → cluster configuration → built-in default).
type QueryTemplates struct {
	CPU         string `json:"cpu,omitempty"`
	RequestRate string `json:"requestRate,omitempty"`
	ErrorRate   string `json:"errorRate,omitempty"`
	LatencyP99  string `json:"latencyP99,omitempty"`
}

// For returns the template for a signal.
func (q QueryTemplates) For(s Signal) string {
	switch s {
	case SignalCPU:
		return q.CPU
	case SignalRequestRate:
		return q.RequestRate
	case SignalErrorRate:
		return q.ErrorRate
	case SignalLatencyP99:
		return q.LatencyP99
	}
	return ""
}

// Or returns q with its empty fields taken from fallback.
func (q QueryTemplates) Or(fallback QueryTemplates) QueryTemplates {
	pick := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	return QueryTemplates{
		CPU:         pick(q.CPU, fallback.CPU),
		RequestRate: pick(q.RequestRate, fallback.RequestRate),
		ErrorRate:   pick(q.ErrorRate, fallback.ErrorRate),
		LatencyP99:  pick(q.LatencyP99, fallback.LatencyP99),
	}
}

// Labels are the label names that identify a pod's series. Setups that relabel cAdvisor or Istio
// metrics (e.g. to kubernetes_namespace / kubernetes_pod_name) set them here; both the templates
// and the result mapping use them.
type Labels struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
}

// DefaultLabels are the names used by the kubelet's cAdvisor endpoint and by the usual
// kubernetes-pods scrape job for Istio sidecars.
var DefaultLabels = Labels{Namespace: "namespace", Pod: "pod", Container: "container"}

func (l Labels) withDefaults() Labels {
	if l.Namespace == "" {
		l.Namespace = DefaultLabels.Namespace
	}
	if l.Pod == "" {
		l.Pod = DefaultLabels.Pod
	}
	if l.Container == "" {
		l.Container = DefaultLabels.Container
	}
	return l
}

// TemplateData is what a query template sees.
//
//	{{.Namespaces}}        regex alternation of the namespaces the query covers, each name
//	                       regex-quoted and the whole escaped for a double-quoted PromQL string,
//	                       e.g. shop|pay\\.eu — use it as  namespace=~"{{.Namespaces}}"
//	{{.Pods}}              pod-name regex (".+" unless narrowed), escaped the same way
//	{{.Window}}            the rate window as a PromQL duration, e.g. 1m or 1m30s
//	{{.Labels.Namespace}}  label names (defaults namespace, pod, container)
//	{{.Labels.Pod}}
//	{{.Labels.Container}}
//
// A query must return an instant vector with one series per pod, carrying the namespace and pod
// labels. A reference to any other field fails rendering (missingkey=error).
type TemplateData struct {
	Namespaces string
	Pods       string
	Window     string
	Labels     Labels
}

// The default value queries follow cAdvisor (container_cpu_usage_seconds_total; the "POD" pause
// container, the pod-level cgroup with container="" and the istio-proxy sidecar are excluded so the
// value is the application's own CPU) and Istio's standard metrics as reported by the server-side
// sidecar (reporter="destination"), grouped by the scraped pod's namespace and pod labels.
const (
	DefaultCPUQuery = `sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (rate(container_cpu_usage_seconds_total{` + cpuSelector + `}[{{.Window}}]))`

	DefaultRequestRateQuery = `sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (rate(istio_requests_total{` + istioSelector + `}[{{.Window}}]))`

	// A pod that never answered 5xx has no 5xx series at all; the "or 0 *" arm turns that into an
	// explicit zero for every pod that serves traffic, instead of "no data".
	DefaultErrorRateQuery = `sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (rate(istio_requests_total{` + istioSelector + `, response_code=~"5.."}[{{.Window}}]))` +
		` or (0 * sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (rate(istio_requests_total{` + istioSelector + `}[{{.Window}}])))`

	DefaultLatencyP99Query = `histogram_quantile(0.99, sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}, le) (rate(istio_request_duration_milliseconds_bucket{` + istioSelector + `}[{{.Window}}]))) / 1000`

	// DefaultLatencyHistogramQuery returns each pod's cumulative server-side latency histogram
	// over the window, one series per pod and bucket bound (le, in milliseconds as Istio
	// exports it). It is one query for every pod of the cycle, sent unless the source is
	// configured without it (Config.DisableLatencyHistogram).
	DefaultLatencyHistogramQuery = `sum by ({{.Labels.Namespace}}, {{.Labels.Pod}}, le) (increase(istio_request_duration_milliseconds_bucket{` + istioSelector + `}[{{.Window}}]))`

	// Freshness probes. All Istio signals come from the same sidecar scrape, so they share one
	// probe (identical renders are sent once).
	//
	// The CPU probe is the timestamp of the pod's newest raw sample. cAdvisor stamps each
	// container's samples itself, and a restarted container's old series stays visible for the
	// lookback (5 min) after it ends, so the oldest of them would say little.
	DefaultCPUFreshnessQuery = `max by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (timestamp(container_cpu_usage_seconds_total{` + cpuSelector + `}))`
	// The sidecar probe is the oldest of the pod's request series' newest samples: the time up to
	// which every one of them is visible. One scrape stamps them all alike, so it is the newest
	// sample, except while the TSDB has made only part of a scrape visible (VictoriaMetrics makes
	// rows searchable shard by shard, up to 2 s apart, when read with latency_offset; Mimir and
	// Thanos Receive ingest remote-write batches apart too). A series whose newest sample is not
	// visible yet and has none left in the window drops out of rate(), and the pod's sum reads as
	// quieter than it is; through this probe such a pod is stale instead.
	DefaultIstioFreshnessQuery = `min by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (timestamp(istio_requests_total{` + istioSelector + `}))`

	cpuSelector   = ` {{- .Labels.Namespace}}=~"{{.Namespaces}}", {{.Labels.Pod}}=~"{{.Pods}}", {{.Labels.Container}}!="", {{.Labels.Container}}!="POD", {{.Labels.Container}}!="istio-proxy"`
	istioSelector = `reporter="destination", {{.Labels.Namespace}}=~"{{.Namespaces}}", {{.Labels.Pod}}=~"{{.Pods}}"`
)

// DefaultQueries are the built-in value queries.
var DefaultQueries = QueryTemplates{
	CPU:         DefaultCPUQuery,
	RequestRate: DefaultRequestRateQuery,
	ErrorRate:   DefaultErrorRateQuery,
	LatencyP99:  DefaultLatencyP99Query,
}

// DefaultFreshnessQueries are the built-in freshness probes.
var DefaultFreshnessQueries = QueryTemplates{
	CPU:         DefaultCPUFreshnessQuery,
	RequestRate: DefaultIstioFreshnessQuery,
	ErrorRate:   DefaultIstioFreshnessQuery,
	LatencyP99:  DefaultIstioFreshnessQuery,
}

// parseTemplate parses a query template with missingkey=error.
func parseTemplate(name, text string) (*template.Template, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %s template: %v", ErrTemplate, name, err)
	}
	return t, nil
}

// ValidateTemplate parses a query template and renders it with sample data, so that a typo such
// as {{.Namespace}} is reported when the configuration or the AdaptiveLoadBalancer is loaded rather
// than in the middle of a cycle.
func ValidateTemplate(name, text string) error {
	_, err := RenderQuery(name, text, NewTemplateData([]string{"default"}, "", time.Minute, DefaultLabels))
	return err
}

// RenderQuery renders one query template with the given data.
func RenderQuery(name, text string, data TemplateData) (string, error) {
	t, err := parseTemplate(name, text)
	if err != nil {
		return "", err
	}
	return execute(t, data)
}

func execute(t *template.Template, data TemplateData) (string, error) {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("%w: %s template: %v (available: .Namespaces .Pods .Window .Labels.Namespace .Labels.Pod .Labels.Container)", ErrTemplate, t.Name(), err)
	}
	return b.String(), nil
}

// NewTemplateData builds the data for a query covering the given namespaces. An empty namespace
// list matches every namespace; an empty pod regex matches every pod.
func NewTemplateData(namespaces []string, podRegex string, window time.Duration, labels Labels) TemplateData {
	return TemplateData{
		Namespaces: NamespaceRegex(namespaces),
		Pods:       promQLStringEscape(orDefault(podRegex, ".+")),
		Window:     model.Duration(window).String(),
		Labels:     labels.withDefaults(),
	}
}

// NamespaceRegex returns the sorted, de-duplicated, regex-quoted alternation of the namespaces,
// escaped for use inside a double-quoted PromQL string. No namespaces gives ".+".
func NamespaceRegex(namespaces []string) string {
	if len(namespaces) == 0 {
		return ".+"
	}
	sorted := slices.Clone(namespaces)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	quoted := make([]string, len(sorted))
	for i, ns := range sorted {
		quoted[i] = regexp.QuoteMeta(ns)
	}
	return promQLStringEscape(strings.Join(quoted, "|"))
}

// promQLStringEscape escapes s for a double-quoted PromQL string literal (Go escaping rules).
func promQLStringEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
