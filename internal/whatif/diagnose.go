package whatif

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// The Service's series can be missing for several reasons, and each has its own remedy: these
// tell them apart.

// diagnoseMissing explains why the Service has no request series in the window.
func (q *queries) diagnoseMissing(start time.Time, w Window) error {
	span := fmt.Sprintf("between %s and %s", stamp(start), stamp(w.End))
	rng := promDuration(w.Length)
	if c := w.Cluster; c != nil && len(c.Pods) > 0 {
		var without []string
		for name, p := range c.Pods {
			if !p.Sidecar {
				without = append(without, name)
			}
		}
		if len(without) == len(c.Pods) {
			return fmt.Errorf("%w: Service %s/%s: none of its %d pods runs an istio-proxy sidecar (the cluster says so) and no Istio request metrics name it %s. adaptive-lb weights endpoints in the client sidecars, so without a mesh it would change nothing: enable sidecar injection (kubectl label namespace %s istio-injection=enabled), restart the pods, then measure again",
				ErrNoMesh, q.ns, q.svc, len(c.Pods), span, q.ns)
		}
	}
	l := q.r.Labels
	nsSel := l.Namespace + `="` + quote(q.ns) + `"`
	containers, err := q.instant(fmt.Sprintf(`count by (%s) (last_over_time(container_cpu_usage_seconds_total{%s, %s!=""}[%s]))`, l.Container, nsSel, l.Container, rng), w.End)
	if err != nil {
		return err
	}
	services, err := q.instant(fmt.Sprintf(`count by (destination_service_name) (last_over_time(istio_requests_total{reporter="destination", destination_service_namespace="%s"}[%s]))`, quote(q.ns), rng), w.End)
	if err != nil {
		return err
	}
	sidecars, err := q.instant(fmt.Sprintf(`count(last_over_time(kube_pod_container_info{namespace="%s", container="istio-proxy"}[%s]))`, quote(q.ns), rng), w.End)
	if err != nil {
		return err
	}
	meshed := len(sidecars) > 0 || len(services) > 0
	for _, s := range containers {
		if string(s.Metric[model.LabelName(l.Container)]) == "istio-proxy" {
			meshed = true
		}
	}
	switch {
	case len(services) > 0:
		var names []string
		for _, s := range services {
			names = append(names, string(s.Metric["destination_service_name"]))
		}
		sort.Strings(names)
		return fmt.Errorf("%w: no Istio request metrics name Service %s/%s %s, though the sidecars of namespace %s report requests to %s; check the Service's name, or the window (--window, --at)",
			ErrNoMetrics, q.ns, q.svc, span, q.ns, strings.Join(names, ", "))
	case len(containers) > 0 && !meshed:
		return fmt.Errorf("%w: Service %s/%s: pods of namespace %s report CPU %s, but none runs an istio-proxy sidecar and no Istio request metrics name the Service. adaptive-lb weights endpoints in the client sidecars, so without a mesh it would change nothing: enable sidecar injection (kubectl label namespace %s istio-injection=enabled), restart the pods, then measure again",
			ErrNoMesh, q.ns, q.svc, q.ns, span, q.ns)
	case len(containers) > 0:
		return fmt.Errorf("%w: no Istio request metrics name Service %s/%s %s, though pods of namespace %s run sidecars and report CPU; check the Service's name, that the sidecars' metrics are scraped (adaptive-lb metrics check --namespace %s), or the window (--window, --at)",
			ErrNoMetrics, q.ns, q.svc, span, q.ns, q.ns)
	}
	return fmt.Errorf("%w: the TSDB at %s has no series for Service %s/%s %s: no Istio request metrics name it and no pod of namespace %s reports CPU. Check the namespace and the name, the window (--window, --at), and that the TSDB scrapes the sidecars and cAdvisor (adaptive-lb metrics check --namespace %s)",
		ErrNoMetrics, q.r.Address, q.ns, q.svc, span, q.ns, q.ns)
}

// checkIstioNames refuses pods whose sidecars report the latency histogram under the seconds
// name of Istio before 1.5 (Mixer) while the operator reads the milliseconds one.
func (q *queries) checkIstioNames(m *Measurements, names, noHistogram []string) error {
	old, err := q.instant(fmt.Sprintf(`count by (%s) (last_over_time(istio_request_duration_seconds_bucket{%s}[%s]))`, q.r.Labels.Pod, q.dest(), promDuration(m.To.Sub(m.From))), m.To)
	if err != nil {
		return err
	}
	var seconds []string
	for _, s := range old {
		seconds = append(seconds, string(s.Metric[model.LabelName(q.r.Labels.Pod)]))
	}
	sort.Strings(seconds)
	withMS := len(names) - len(noHistogram)
	if len(seconds) > 0 {
		return fmt.Errorf("%w: the sidecars of %s report istio_request_duration_seconds (Istio before 1.5) while %d other pod(s) of Service %s/%s report istio_request_duration_milliseconds, which the operator reads; a latency model cannot be fitted across both. Upgrade those sidecars (restart the pods after the control plane upgrade) and measure again",
			ErrIstioMetricNames, strings.Join(seconds, ", "), withMS, m.Namespace, m.Service)
	}
	if withMS == 0 {
		return fmt.Errorf("%w: no pod of Service %s/%s has an istio_request_duration_milliseconds histogram between %s and %s; the fit needs the server-side latency histogram: check the Istio telemetry configuration (the histogram may be disabled) and the scrape of the sidecars",
			ErrNoMetrics, m.Namespace, m.Service, stamp(m.From), stamp(m.To))
	}
	if len(noHistogram) > 0 {
		m.Notes = append(m.Notes, fmt.Sprintf("no latency histogram for %s: they count in the load but not in the latency fit", strings.Join(noHistogram, ", ")))
	}
	return nil
}
