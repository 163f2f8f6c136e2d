package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// operatorUser is the identity the operator runs as in the scale benchmark, so that the API
// server's audit log tells its requests from the load generator's.
const operatorUser = "adaptive-lb-operator"

// scaleSize reads a size knob from the environment.
func scaleSize(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkScale_20kPods creates 20,000 pods with their EndpointSlices in 1,000 Services (20 each)
// on a real API server, 200 of the Services with an AdaptiveLoadBalancer, then starts the
// operator binary as its own process and measures: the time to the first full mirror (every
// opted-in Service's ServiceEntry listing its 20 endpoints), the operator's RSS, and the requests
// it made by verb, from the API server's audit log, during start-up and during a minute of
// endpoint churn afterwards (where no list call may appear).
//
//	make envtest-assets && KUBEBUILDER_ASSETS=$PWD/.cache/tools/k8s \
//	  go test -run '^$' -bench Scale_20kPods -benchtime 1x -timeout 30m ./cmd/adaptive-lb/
//
// ADAPTIVELB_BENCH_SCALE_SERVICES and ADAPTIVELB_BENCH_SCALE_OPTED change the counts;
// ADAPTIVELB_BENCH_SCALE_HEAPPROFILE=<file> saves the operator's heap profile after sync, and
// reports the live heap then (after a collection).
func BenchmarkScale_20kPods(b *testing.B) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		b.Skip("KUBEBUILDER_ASSETS is not set: run `make envtest-assets`")
	}
	services, opted := scaleSize("ADAPTIVELB_BENCH_SCALE_SERVICES", 1000), scaleSize("ADAPTIVELB_BENCH_SCALE_OPTED", 200)
	const perService, namespaces, nodes = 20, 10, 100
	dir := b.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	auditLog := filepath.Join(dir, "audit.log")
	env := &envtest.Environment{CRDDirectoryPaths: []string{ownCRDPath, istioCRDPath(b)}, ErrorIfCRDPathMissing: true}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: b.TempDir()}
	env.ControlPlane.APIServer.Configure().
		Set("audit-policy-file", policy).
		Set("audit-log-path", auditLog).
		Set("audit-log-format", "json").
		Set("service-cluster-ip-range", "10.96.0.0/16") // envtest's default holds only a few hundred Services
	cfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Stop() })
	load := rest.CopyConfig(cfg)
	load.QPS, load.Burst = 5000, 10000
	scheme, err := operatorScheme()
	if err != nil {
		b.Fatal(err)
	}
	admin, err := client.New(load, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	// The cluster: nodes, namespaces, and per Service its pods (with IPs), its EndpointSlice and,
	// for the first `opted`, an AdaptiveLoadBalancer.
	fillStart := time.Now()
	for n := range nodes {
		mustCreate(b, admin, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%03d", n), Labels: map[string]string{
			"topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": fmt.Sprintf("eu-west-1%c", 'a'+n%3), "node.kubernetes.io/instance-type": []string{"m7i.2xlarge", "m5.2xlarge"}[n%2]}}})
	}
	for ns := range namespaces {
		mustCreate(b, admin, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%02d", ns)}})
	}
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				if err := createScaleService(ctx, admin, s, namespaces, perService, nodes, s%(services/opted) == 0); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for s := range services {
		work <- s
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.Logf("created %d pods in %d Services (%d opted in) in %s", services*perService, services, opted, time.Since(fillStart).Round(time.Second))

	// The operator, built and run as its own process under its own identity.
	bin := filepath.Join(dir, "adaptive-lb")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("build the operator: %v\n%s", err, out)
	}
	kubeconfig := userKubeconfigFile(b, env, operatorUser, "")
	// The TSDB: CPU and request rates for every opted-in pod, from two minutes ago to ten minutes
	// ahead, so that every weight cycle of the run finds a full window.
	vm := vmtest.Start(b)
	now := time.Now()
	for s := 0; s < services; s += services / opted {
		var sig strings.Builder
		ns, name := scaleNames(s, namespaces)
		for p := range perService {
			pod := fmt.Sprintf("%s-%02d", name, p)
			cores := 0.2 + 0.4*float64(p%2) // two hardware speeds
			sig.WriteString(vmtest.Counter(fmt.Sprintf(`container_cpu_usage_seconds_total{namespace=%q,pod=%q,container="app"}`, ns, pod), cores, now.Add(-2*time.Minute), now.Add(10*time.Minute), 15*time.Second))
			sig.WriteString(vmtest.Counter(fmt.Sprintf(`istio_requests_total{reporter="destination",namespace=%q,pod=%q,response_code="200"}`, ns, pod), 20, now.Add(-2*time.Minute), now.Add(10*time.Minute), 15*time.Second))
		}
		vm.ImportText(b, sig.String())
	}
	for b.Loop() {
		auditBefore := auditCounts(b, auditLog)
		start := time.Now()
		metricsAddr := freeLoopbackAddr(b)
		// ADAPTIVELB_BENCH_SCALE_HEAPPROFILE=<file>: the operator's heap profile after sync.
		heapProfile, pprofAddr := os.Getenv("ADAPTIVELB_BENCH_SCALE_HEAPPROFILE"), "0"
		if heapProfile != "" {
			pprofAddr = freeLoopbackAddr(b)
		}
		op := exec.Command(bin, "run", "--kubeconfig", kubeconfig, "--metrics-bind-address", metricsAddr, "--metrics-secure=false",
			"--health-probe-bind-address", "0", "--pprof-bind-address", pprofAddr, "--log-level", "error", "--tsdb-url", vm.URL)
		op.Stderr = os.Stderr
		if limit := os.Getenv("ADAPTIVELB_BENCH_SCALE_GOMEMLIMIT"); limit != "" {
			op.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
		}
		if err := op.Start(); err != nil {
			b.Fatal(err)
		}
		stop := func() { _ = op.Process.Signal(os.Interrupt); _ = op.Wait() }
		waitFullMirror(b, admin, opted, perService, 10*time.Minute)
		startup := time.Since(start)
		atStartup := auditCounts(b, auditLog).minus(auditBefore)
		rssStartup, _ := benchutil.ProcessMemory(strconv.Itoa(op.Process.Pid))
		heapStartup := scrapeGauge(b, metricsAddr, "go_memstats_heap_inuse_bytes")
		if heapProfile != "" {
			saveHeapProfile(b, pprofAddr, heapProfile) // after a collection: the live heap
			b.ReportMetric(scrapeGauge(b, metricsAddr, "go_memstats_heap_alloc_bytes")/1e6, "live_heap_after_sync_MB")
		}

		// A minute of churn on opted-in Services (ADAPTIVELB_BENCH_SCALE_RATE changes/s, 20 by
		// default; 200 is the propagation target's rate).
		rate := scaleSize("ADAPTIVELB_BENCH_SCALE_RATE", 20)
		churnStart := auditCounts(b, auditLog)
		propagationBefore := scrapeHistogram(b, metricsAddr, "adaptivelb_endpoint_propagation_seconds")
		churned := churn(b, admin, namespaces, services, opted, perService, rate, time.Minute)
		time.Sleep(5 * time.Second) // let the last changes through
		afterStartup := auditCounts(b, auditLog).minus(churnStart)
		propagation := scrapeHistogram(b, metricsAddr, "adaptivelb_endpoint_propagation_seconds").minus(propagationBefore)
		cycle := scrapeHistogram(b, metricsAddr, "adaptivelb_weight_cycle_duration_seconds")
		b.ReportMetric(float64(churned)/time.Minute.Seconds(), "changes/s")
		b.ReportMetric(propagation.quantile(0.5)*1000, "propagation_p50_ms")
		b.ReportMetric(propagation.quantile(0.99)*1000, "propagation_p99_ms")
		b.ReportMetric(cycle.count, "weight_cycles")
		if cycle.count > 0 {
			b.ReportMetric(cycle.sum/cycle.count*1000, "weight_cycle_mean_ms")
		}
		rss, hwm := benchutil.ProcessMemory(strconv.Itoa(op.Process.Pid))
		heap := scrapeGauge(b, metricsAddr, "go_memstats_heap_inuse_bytes")
		stop()
		b.ReportMetric(heapStartup/1e6, "heap_inuse_after_sync_MB")
		b.ReportMetric(heap/1e6, "heap_inuse_after_churn_MB")

		b.ReportMetric(startup.Seconds(), "startup_s")
		b.ReportMetric(float64(rssStartup)/1e6, "rss_after_sync_MB")
		b.ReportMetric(float64(rss)/1e6, "rss_after_churn_MB")
		b.ReportMetric(float64(hwm)/1e6, "rss_peak_MB")
		for _, verb := range []string{"list", "watch", "get", "create", "update", "patch"} {
			b.ReportMetric(float64(atStartup.get(verb)), "startup_"+verb)
			b.ReportMetric(float64(afterStartup.get(verb)), "churn_"+verb)
		}
		b.Logf("requests at start-up by verb and resource: %v", atStartup.detail)
		b.Logf("requests during churn by verb and resource: %v", afterStartup.detail)
	}
}

func mustCreate(b *testing.B, c client.Client, o client.Object) {
	b.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		b.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

func scaleIP(s, p int) string { return fmt.Sprintf("10.%d.%d.%d", 100+s/250, s%250, p+1) }

func scaleNames(s, namespaces int) (ns, svc string) {
	return fmt.Sprintf("team-%02d", s%namespaces), fmt.Sprintf("svc-%04d", s)
}

// createScaleService creates one Service with its pods (IPs set in status), EndpointSlice and,
// when opted, its AdaptiveLoadBalancer.
func createScaleService(ctx context.Context, c client.Client, s, namespaces, perService, nodes int, opted bool) error {
	ns, name := scaleNames(s, namespaces)
	if err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": name},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}); err != nil {
		return err
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
	for p := range perService {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%02d", name, p), Namespace: ns,
				Labels:      map[string]string{"app": name, "version": "v1"},
				Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%03d", (s*perService+p)%nodes), ServiceAccountName: name, Containers: []corev1.Container{
				{Name: "app", Image: "registry.example.com/app:1.0", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}},
				{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.31.1"},
			}},
		}
		if err := c.Create(ctx, pod); err != nil {
			return err
		}
		pod.Status = corev1.PodStatus{PodIP: scaleIP(s, p), PodIPs: []corev1.PodIP{{IP: scaleIP(s, p)}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if err := c.Status().Update(ctx, pod); err != nil {
			return err
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{scaleIP(s, p)}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To(pod.Spec.NodeName), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name}})
	}
	if err := c.Create(ctx, slice); err != nil {
		return err
	}
	if opted {
		return c.Create(ctx, &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: name}}})
	}
	return nil
}

// waitFullMirror polls until `opted` ServiceEntries list `perService` endpoints each.
func waitFullMirror(b *testing.B, c client.Client, opted, perService int, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var list networkingv1.ServiceEntryList
		if err := c.List(context.Background(), &list); err != nil {
			b.Fatal(err)
		}
		full := 0
		for _, se := range list.Items {
			if len(se.Spec.Endpoints) == perService {
				full++
			}
		}
		if full == opted {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d ServiceEntries complete after %s", full, opted, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// churn flips the readiness of endpoints of opted-in Services at rate per second for d, from
// 10 writers that own disjoint Services (so a Service's changes stay ordered), and returns how
// many changes it made.
func churn(b *testing.B, c client.Client, namespaces, services, opted, perService, rate int, d time.Duration) int {
	b.Helper()
	const writers = 10
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second * writers / time.Duration(rate))
			defer tick.Stop()
			for i := 0; time.Now().Before(deadline); i++ {
				<-tick.C
				s := (w + writers*(i%(opted/writers))) * (services / opted)
				ns, name := scaleNames(s, namespaces)
				slice := &discoveryv1.EndpointSlice{}
				if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name + "-x"}, slice); err != nil {
					b.Error(err)
					return
				}
				e := (i / (opted / writers)) % perService
				slice.Endpoints[e].Conditions.Ready = ptr.To(!ptr.Deref(slice.Endpoints[e].Conditions.Ready, true))
				if err := c.Update(context.Background(), slice); err != nil {
					b.Error(err)
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(total.Load())
}

// verbCounts counts the operator's requests by verb, with a verb/resource breakdown.
type verbCounts struct {
	byVerb map[string]int
	detail map[string]int
}

func (v verbCounts) minus(o verbCounts) verbCounts {
	out := verbCounts{byVerb: map[string]int{}, detail: map[string]int{}}
	for k, n := range v.byVerb {
		if d := n - o.byVerb[k]; d != 0 {
			out.byVerb[k] = d
		}
	}
	for k, n := range v.detail {
		if d := n - o.detail[k]; d != 0 {
			out.detail[k] = d
		}
	}
	return out
}

func (v verbCounts) get(verb string) int { return v.byVerb[verb] }

// auditCounts reads the audit log and counts the operator user's completed requests.
func auditCounts(b *testing.B, path string) verbCounts {
	b.Helper()
	out := verbCounts{byVerb: map[string]int{}, detail: map[string]int{}}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct {
			Verb      string                    `json:"verb"`
			Stage     string                    `json:"stage"`
			User      struct{ Username string } `json:"user"`
			ObjectRef struct{ Resource string } `json:"objectRef"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.User.Username != operatorUser {
			continue
		}
		if ev.Stage != "ResponseComplete" && !(ev.Verb == "watch" && ev.Stage == "ResponseStarted") {
			continue
		}
		out.byVerb[ev.Verb]++
		out.detail[ev.Verb+" "+ev.ObjectRef.Resource]++
	}
	return out
}

func freeLoopbackAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// saveHeapProfile writes the operator's heap profile (after a collection, so in-use figures
// are the live heap) to path.
func saveHeapProfile(b *testing.B, addr, path string) {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatalf("fetch the operator's heap profile: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("fetch the operator's heap profile: %s, %v", resp.Status, err)
	}
	if err := os.WriteFile(path, body, 0o644); err != nil {
		b.Fatal(err)
	}
}

// scrapeGauge reads one unlabelled sample from the operator's metrics endpoint (0 if absent).
func scrapeGauge(b *testing.B, addr, name string) float64 {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Logf("scrape %s: %v", addr, err)
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// histogram is a scraped Prometheus histogram: cumulative counts by upper bound.
type histogram struct {
	bounds     []float64
	cumulative []float64
	sum, count float64
}

func (h histogram) minus(o histogram) histogram {
	out := histogram{bounds: h.bounds, sum: h.sum - o.sum, count: h.count - o.count}
	for i, c := range h.cumulative {
		if i < len(o.cumulative) {
			c -= o.cumulative[i]
		}
		out.cumulative = append(out.cumulative, c)
	}
	return out
}

// quantile interpolates inside the bucket, as histogram_quantile does.
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 {
		return 0
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, c := range h.cumulative {
		if c >= rank {
			if math.IsInf(h.bounds[i], 1) {
				return lower
			}
			return lower + (h.bounds[i]-lower)*(rank-below)/math.Max(c-below, 1)
		}
		lower, below = h.bounds[i], c
	}
	return lower
}

// scrapeHistogram reads an unlabelled histogram from the operator's metrics endpoint.
func scrapeHistogram(b *testing.B, addr, name string) histogram {
	b.Helper()
	var h histogram
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Logf("scrape %s: %v", addr, err)
		return h
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, name+"_bucket{le=\""):
			rest := strings.TrimPrefix(line, name+"_bucket{le=\"")
			le, value, ok := strings.Cut(rest, "\"} ")
			if !ok {
				continue
			}
			bound, _ := strconv.ParseFloat(le, 64)
			c, _ := strconv.ParseFloat(value, 64)
			h.bounds, h.cumulative = append(h.bounds, bound), append(h.cumulative, c)
		case strings.HasPrefix(line, name+"_sum "):
			h.sum, _ = strconv.ParseFloat(strings.TrimPrefix(line, name+"_sum "), 64)
		case strings.HasPrefix(line, name+"_count "):
			h.count, _ = strconv.ParseFloat(strings.TrimPrefix(line, name+"_count "), 64)
		}
	}
	return h
}
