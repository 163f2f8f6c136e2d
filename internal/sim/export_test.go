package sim

import (
	"bufio"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// exportScenario is two pod groups behind five client proxies, 60 s, with no warm-up so that the
// run's own per-pod figures cover the same stretch as the series.
func exportScenario(t *testing.T) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(`
name: export
duration: 60s
warmup: 0s
seed: 3
load: {rps: 300}
clients: {proxies: 5, workers: 2, network_latency: 4ms}
# Searchable at once, so that the one cycle of the minute sees every pod's two scrapes.
controller: {metrics: {ingestion_delay: 0s}}
pods:
  - {name: fast, replicas: 2, workers: 4, cores: 4, cpu_limit: 1, cost: {mean: 5ms, dist: lognormal, cv: 0.6}}
  - {name: slow, replicas: 1, workers: 4, cores: 8, cpu_limit: 2, speed: 0.5, cost: {mean: 5ms, dist: lognormal, cv: 0.6}}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestMetricsRecorder_DoesNotChangeTheRun(t *testing.T) {
	for _, policy := range []string{PolicyLeastRequest, PolicyTail} {
		sc := exportScenario(t)
		plain, err := Run(sc, policy, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := NewMetricsRecorder(MeshLabels{})
		if err != nil {
			t.Fatal(err)
		}
		recorded, err := Run(sc, policy, Options{Metrics: rec})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plain, recorded) {
			t.Fatalf("%s: recording the series changed the run's result", policy)
		}
	}
}

func TestMetricsRecorder_SummaryAgreesWithTheRun(t *testing.T) {
	sc := exportScenario(t)
	rec, err := NewMetricsRecorder(MeshLabels{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(sc, PolicyLeastRequest, Options{Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := rec.Summary(0, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Pods) != len(r.Pods) {
		t.Fatalf("summary has %d pods, the run %d", len(sum.Pods), len(r.Pods))
	}
	for i, p := range sum.Pods {
		want := r.Pods[i]
		if p.Name != want.Name || math.Abs(p.CPUCores-want.CPU) > 1e-9 || math.Abs(p.RequestRate-want.RPS) > 1e-9 {
			t.Errorf("pod %s: series give %.6f cores and %.4f rps, the run %s %.6f cores and %.4f rps", p.Name, p.CPUCores, p.RequestRate, want.Name, want.CPU, want.RPS)
		}
		if got := p.Latency.Count(); got != p.RequestRate*60 {
			t.Errorf("pod %s: histogram counts %v requests, the request counter %v", p.Name, got, p.RequestRate*60)
		}
	}
	if got := sum.Clients.Count(); got != float64(r.Requests) {
		t.Errorf("client histograms count %v responses, the run %d", got, r.Requests)
	}
	if got := sum.Clients.SumMS / sum.Clients.Count(); math.Abs(got-r.Latency.Mean) > 0.01 {
		t.Errorf("client-side mean %.3f ms from the series, the run's mean %.3f ms", got, r.Latency.Mean)
	}
	var podSum, podCount float64
	for _, p := range sum.Pods {
		podSum += p.Latency.SumMS
		podCount += p.Latency.Count()
	}
	// The client sees the pod's latency plus the network both ways (4 ms).
	if net := sum.Clients.SumMS/sum.Clients.Count() - podSum/podCount; math.Abs(net-4) > 0.05 {
		t.Errorf("client mean − pod mean = %.3f ms, want the network latency 4 ms", net)
	}
	if _, err := rec.Summary(0, 7*time.Second); err == nil {
		t.Error("a stretch ending between two scrapes was accepted")
	}
}

func TestMetricsRecorder_WriteTextHasTheOperatorsSeries(t *testing.T) {
	sc := exportScenario(t)
	rec, err := NewMetricsRecorder(MeshLabels{Namespace: "shop", Service: "web"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(sc, PolicyCapacity, Options{Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	var b strings.Builder
	if err := rec.WriteText(&b, start); err != nil {
		t.Fatal(err)
	}
	last := map[string]float64{} // series → last value
	lastTS := map[string]int64{}
	count := map[string]int{}
	sc2 := bufio.NewScanner(strings.NewReader(b.String()))
	for sc2.Scan() {
		line := sc2.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("line %q: want series, value and timestamp", line)
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		ts, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if ts <= lastTS[fields[0]] {
			t.Fatalf("series %s: timestamp %d does not follow %d", fields[0], ts, lastTS[fields[0]])
		}
		last[fields[0]], lastTS[fields[0]] = v, ts
		count[fields[0]]++
	}
	pod := `namespace="shop",pod="fast-0"`
	dest := `istio_requests_total{reporter="destination",` + pod + `,source_workload="client",source_workload_namespace="shop",destination_service="web.shop.svc.cluster.local",destination_service_name="web",destination_service_namespace="shop",destination_workload="web",destination_workload_namespace="shop",request_protocol="http",response_code="200"}`
	if got, want := last[dest], r.Pods[0].RPS*60; got != want {
		t.Errorf("%s ends at %v, the pod served %v", dest, got, want)
	}
	if n := count[dest]; n != 5 { // t = 0, 15, 30, 45, 60 s
		t.Errorf("%s has %d samples, want 5 (every 15 s from 0 to 60 s)", dest, n)
	}
	if got := lastTS[dest]; got != start.Add(time.Minute).UnixMilli() {
		t.Errorf("last sample at %d, want the run's end %d", got, start.Add(time.Minute).UnixMilli())
	}
	cpu := `container_cpu_usage_seconds_total{` + pod + `,container="app",cpu="total",node="node-shop-fast-0"}`
	if got, want := last[cpu], r.Pods[0].CPU*60; math.Abs(got-want) > 1e-9 {
		t.Errorf("%s ends at %v, the pod used %v CPU-seconds", cpu, got, want)
	}
	for _, series := range []string{
		`kube_pod_container_resource_limits{` + pod + `,container="app",node="node-shop-fast-0",resource="cpu",unit="core"}`,
		`kube_node_status_capacity{node="node-shop-slow-0",resource="cpu",unit="core"}`,
		`kube_node_labels{node="node-shop-slow-0",label_node_kubernetes_io_instance_type="slow"}`,
		`kube_pod_container_info{` + pod + `,container="istio-proxy"}`,
		`istio_request_duration_milliseconds_bucket{reporter="source",namespace="shop",pod="client-4",source_workload="client",source_workload_namespace="shop",destination_service="web.shop.svc.cluster.local",destination_service_name="web",destination_service_namespace="shop",destination_workload="web",destination_workload_namespace="shop",request_protocol="http",response_code="200",le="+Inf"}`,
	} {
		if _, ok := last[series]; !ok {
			t.Errorf("no series %s", series)
		}
	}
	if got := last[`kube_node_status_capacity{node="node-shop-slow-0",resource="cpu",unit="core"}`]; got != 8 {
		t.Errorf("slow pod's node has %v CPUs, want the group's 8 cores", got)
	}
	weight := `adaptivelb_endpoint_weight{namespace="shop",adaptiveloadbalancer="web",pod="fast-0",ip="10.1.0.1"}`
	if got := last[weight]; got != float64(r.Pods[0].FinalWeight) {
		t.Errorf("%s ends at %v, the pod's final weight is %d", weight, got, r.Pods[0].FinalWeight)
	}
}

func TestMetricsRecorder_RecordsOneRun(t *testing.T) {
	sc := exportScenario(t)
	rec, err := NewMetricsRecorder(MeshLabels{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(sc, PolicyLeastRequest, Options{Metrics: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(sc, PolicyLeastRequest, Options{Metrics: rec}); err == nil || !strings.Contains(err.Error(), "one run") {
		t.Fatalf("a recorder reused for a second run: got %v, want an error saying it records one run", err)
	}
	if _, err := NewMetricsRecorder(MeshLabels{ScrapeInterval: 1500 * time.Millisecond}); err == nil {
		t.Fatal("a scrape interval of 1.5 s was accepted")
	}
}
