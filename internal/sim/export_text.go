package sim

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// WriteText writes the recorded series in the Prometheus text format, each sample with its
// timestamp in milliseconds, simulated time 0 being start: what VictoriaMetrics imports through
// /api/v1/import/prometheus. Metric and label names are those of a real mesh, so the operator's
// default queries (docs/metrics.md) and the project's Grafana dashboard read them unchanged:
//
//   - cAdvisor: container_cpu_usage_seconds_total of each pod's "app" container;
//   - Istio: istio_requests_total and istio_request_duration_milliseconds (bucket, sum, count) as
//     each pod's sidecar reports them (reporter="destination") and as each client proxy reports
//     them (reporter="source"), every response a 200;
//   - kube-state-metrics: kube_pod_info, kube_pod_container_info (the app and istio-proxy
//     containers), kube_pod_container_resource_limits (CPU, when the pod has a limit),
//     kube_node_status_capacity and kube_node_status_allocatable (CPU), and kube_node_labels with
//     the node's instance type (the pod group's name, as the simulator's mirror uses it);
//   - the operator: adaptivelb_endpoint_weight, when the policy writes weights.
//
// Every pod runs on a node of its own, named after it and the namespace (node-NAMESPACE-POD). The simulator has no sidecar CPU, no
// errors and no request sizes, so those series are not written.
func (r *MetricsRecorder) WriteText(w io.Writer, start time.Time) error {
	if !r.started {
		return fmt.Errorf("the recorder has not recorded a run; pass it to sim.Run through Options.Metrics first")
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	tw := &textWriter{w: bw, start: start, times: r.times}
	l := r.labels
	svcFQDN := l.Service + "." + l.Namespace + ".svc.cluster.local"
	podLabels := func(p *recordedPod) string {
		return labelSet("namespace", l.Namespace, "pod", p.name)
	}
	istio := func(reporter, pod string) string {
		return labelSet("reporter", reporter, "namespace", l.Namespace, "pod", pod,
			"source_workload", l.ClientWorkload, "source_workload_namespace", l.Namespace,
			"destination_service", svcFQDN, "destination_service_name", l.Service, "destination_service_namespace", l.Namespace,
			"destination_workload", l.Service, "destination_workload_namespace", l.Namespace,
			"request_protocol", "http", "response_code", "200")
	}
	clientName := func(q int) string { return fmt.Sprintf("%s-%d", l.ClientWorkload, q) }
	each := func(f func(p *recordedPod)) {
		for i := range r.pods {
			f(&r.pods[i])
		}
	}

	tw.family("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds (cAdvisor).")
	each(func(p *recordedPod) {
		tw.pod(p, "container_cpu_usage_seconds_total", podLabels(p)+`,container="app",cpu="total",node="`+p.node+`"`, func(s *podSample) float64 { return s.cpu })
	})

	tw.family("istio_requests_total", "counter", "Total requests (Istio standard metrics).")
	each(func(p *recordedPod) {
		tw.pod(p, "istio_requests_total", istio("destination", p.name), func(s *podSample) float64 { return float64(s.served) })
	})
	for q := 0; q < r.proxies; q++ {
		tw.client(r, q, "istio_requests_total", istio("source", clientName(q)), func(c *clientCounters) float64 { return float64(c.count) })
	}

	tw.family("istio_request_duration_milliseconds", "histogram", "Request duration in milliseconds (Istio standard metrics).")
	for b := 0; b <= len(istioBucketsMS); b++ {
		le := "+Inf"
		if b < len(istioBucketsMS) {
			le = strconv.FormatFloat(istioBucketsMS[b], 'f', -1, 64)
		}
		each(func(p *recordedPod) {
			tw.pod(p, "istio_request_duration_milliseconds_bucket", istio("destination", p.name)+`,le="`+le+`"`, func(s *podSample) float64 { return cumulativeAt(&s.buckets, b) })
		})
		for q := 0; q < r.proxies; q++ {
			tw.client(r, q, "istio_request_duration_milliseconds_bucket", istio("source", clientName(q))+`,le="`+le+`"`, func(c *clientCounters) float64 { return cumulativeAt(&c.buckets, b) })
		}
	}
	each(func(p *recordedPod) {
		tw.pod(p, "istio_request_duration_milliseconds_sum", istio("destination", p.name), func(s *podSample) float64 { return s.sumMS })
		tw.pod(p, "istio_request_duration_milliseconds_count", istio("destination", p.name), func(s *podSample) float64 { return float64(s.served) })
	})
	for q := 0; q < r.proxies; q++ {
		tw.client(r, q, "istio_request_duration_milliseconds_sum", istio("source", clientName(q)), func(c *clientCounters) float64 { return c.sumMS })
		tw.client(r, q, "istio_request_duration_milliseconds_count", istio("source", clientName(q)), func(c *clientCounters) float64 { return float64(c.count) })
	}

	one := func(*podSample) float64 { return 1 }
	tw.family("kube_pod_info", "gauge", "Information about pod (kube-state-metrics).")
	each(func(p *recordedPod) {
		tw.pod(p, "kube_pod_info", podLabels(p)+`,node="`+p.node+`",pod_ip="`+p.ip+`",created_by_kind="ReplicaSet",created_by_name="`+l.Service+`"`, one)
	})
	tw.family("kube_pod_container_info", "gauge", "Information about a container in a pod (kube-state-metrics).")
	each(func(p *recordedPod) {
		tw.pod(p, "kube_pod_container_info", podLabels(p)+`,container="app"`, one)
		tw.pod(p, "kube_pod_container_info", podLabels(p)+`,container="istio-proxy"`, one)
	})
	tw.family("kube_pod_container_resource_limits", "gauge", "The number of requested limit resource by a container (kube-state-metrics).")
	each(func(p *recordedPod) {
		if p.limit > 0 {
			tw.pod(p, "kube_pod_container_resource_limits", podLabels(p)+`,container="app",node="`+p.node+`",resource="cpu",unit="core"`, func(*podSample) float64 { return p.limit })
		}
	})
	for _, name := range []string{"kube_node_status_capacity", "kube_node_status_allocatable"} {
		tw.family(name, "gauge", "The CPU of a node (kube-state-metrics).")
		each(func(p *recordedPod) {
			tw.pod(p, name, labelSet("node", p.node, "resource", "cpu", "unit", "core"), func(*podSample) float64 { return p.cores })
		})
	}
	tw.family("kube_node_labels", "gauge", "Kubernetes labels converted to Prometheus labels (kube-state-metrics).")
	each(func(p *recordedPod) {
		tw.pod(p, "kube_node_labels", labelSet("node", p.node, "label_node_kubernetes_io_instance_type", p.group), one)
	})

	if r.weighted {
		tw.family("adaptivelb_endpoint_weight", "gauge", "Weight of each endpoint in its ServiceEntry.")
		each(func(p *recordedPod) {
			tw.podIf(p, "adaptivelb_endpoint_weight", labelSet("namespace", l.Namespace, "adaptiveloadbalancer", l.Service, "pod", p.name, "ip", p.ip),
				func(s *podSample) (float64, bool) { return float64(s.weight), s.weight > 0 })
		})
	}
	if tw.err != nil {
		return tw.err
	}
	return bw.Flush()
}

// cumulativeAt is the cumulative count up to and including bucket b.
func cumulativeAt(h *latencyHistogram, b int) float64 {
	var c uint64
	for i := 0; i <= b; i++ {
		c += h[i]
	}
	return float64(c)
}

// labelSet renders name/value pairs as the inside of a label set, values escaped.
func labelSet(pairs ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(pairs[i])
		b.WriteString(`="`)
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(pairs[i+1]))
		b.WriteByte('"')
	}
	return b.String()
}

// textWriter writes series sample by sample and keeps the first error.
type textWriter struct {
	w     *bufio.Writer
	start time.Time
	times []float64
	err   error
}

func (t *textWriter) family(name, kind, help string) {
	t.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
}

func (t *textWriter) pod(p *recordedPod, name, labels string, value func(*podSample) float64) {
	t.podIf(p, name, labels, func(s *podSample) (float64, bool) { return value(s), true })
}

func (t *textWriter) podIf(p *recordedPod, name, labels string, value func(*podSample) (float64, bool)) {
	for i := range p.samples {
		if v, ok := value(&p.samples[i]); ok {
			t.sample(name, labels, v, t.times[p.first+i])
		}
	}
}

func (t *textWriter) client(r *MetricsRecorder, q int, name, labels string, value func(*clientCounters) float64) {
	for i := range r.clientSamples {
		t.sample(name, labels, value(&r.clientSamples[i][q]), t.times[i])
	}
}

func (t *textWriter) sample(name, labels string, v, at float64) {
	ms := t.start.Add(time.Duration(at * float64(time.Second))).UnixMilli()
	t.printf("%s{%s} %s %d\n", name, labels, strconv.FormatFloat(v, 'g', -1, 64), ms)
}

func (t *textWriter) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format, args...)
	}
}
