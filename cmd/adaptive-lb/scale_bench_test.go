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
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// cpuSeconds is CPU time by process name.
type cpuSeconds map[string]float64

func (c cpuSeconds) minus(o cpuSeconds) cpuSeconds {
	out := cpuSeconds{}
	for k, v := range c {
		out[k] = v - o[k]
	}
	return out
}

// childCPU reads the CPU time so far of the operator, the API server and etcd, children of the
// benchmark's process.
func childCPU() cpuSeconds {
	out := cpuSeconds{}
	for _, p := range []string{"adaptive-lb", "kube-apiserver", "etcd"} {
		out[p] = benchutil.ChildCPUSeconds(p)
	}
	return out
}

// mirrorQueue selects the endpoint mirror's work queue in controller-runtime's workqueue metrics.
const mirrorQueue = `controller="adaptiveloadbalancer",name="adaptiveloadbalancer"`

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
// endpoint churn afterwards (where no list call may appear); and the weight cycle's mean
// duration, with the mean of each of its phases (adaptivelb_weight_cycle_phase_seconds).
//
//	make envtest-assets && eval "$(make -s test-env)" && \
//	  go test -run '^$' -bench Scale_20kPods -benchtime 1x -timeout 30m ./cmd/adaptive-lb/
//
// ADAPTIVELB_BENCH_SCALE_SERVICES and ADAPTIVELB_BENCH_SCALE_OPTED change the counts (OPTED at
// least 10, one Service in SERVICES/OPTED opted in). ADAPTIVELB_BENCH_SCALE_BIG=<pods> adds one
// more opted-in Service, big in team-00, of that many pods in EndpointSlices of 100 (the
// operator mirrors it into ServiceEntry slices): big_startup_s is when the union of its slices
// first lists every pod (startup_s is the 20-pod Services'; the start-up is the later of the
// two), and one change in ten of the churn flips one of its endpoints. The 200,000-pod run
// with a 10,000-pod Service is SERVICES=9500 BIG=10000.
// ADAPTIVELB_BENCH_SCALE_HEAPPROFILE=<file> saves the operator's heap profile after sync, and
// reports the live heap then (after a collection).
func BenchmarkScale_20kPods(b *testing.B) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		b.Skip("KUBEBUILDER_ASSETS is not set: run `make envtest-assets`")
	}
	services, opted := scaleSize("ADAPTIVELB_BENCH_SCALE_SERVICES", 1000), scaleSize("ADAPTIVELB_BENCH_SCALE_OPTED", 200)
	big := scaleSize("ADAPTIVELB_BENCH_SCALE_BIG", 0)
	const perService, namespaces, nodes = 20, 10, 100
	if err := checkScaleSizes(services, opted, big); err != nil {
		b.Fatal(err)
	}
	step := services / opted // Service i*step is the i-th opted in, for i < opted
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
	admin := loadGeneratorClient(b, cfg)
	ctx := context.Background()

	// The cluster: nodes, namespaces, and per Service its pods (with IPs), its EndpointSlice and,
	// for one in step up to `opted` of them, an AdaptiveLoadBalancer; then the big Service.
	fillStart := time.Now()
	for n := range nodes {
		mustCreate(b, admin, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: scaleNode(n), Labels: map[string]string{
			"topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": fmt.Sprintf("eu-west-1%c", 'a'+n%3), "node.kubernetes.io/instance-type": []string{"m7i.2xlarge", "m5.2xlarge"}[n%2]}}})
	}
	for ns := range namespaces {
		mustCreate(b, admin, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%02d", ns)}})
	}
	err = inParallel(services, func(s int) error {
		return createScaleService(ctx, admin, s, namespaces, perService, nodes, s%step == 0 && s/step < opted)
	})
	if err != nil {
		b.Fatal(err)
	}
	if big > 0 {
		if err := createBigService(ctx, admin, big, nodes); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("created %d pods in %d Services (%d opted in) and %d pods in the big Service in %s", services*perService, services, opted, big, time.Since(fillStart).Round(time.Second))

	// The operator, built and run as its own process under its own identity.
	bin := buildOperator(b, dir)
	kubeconfig := userKubeconfigFile(b, env, operatorUser, "")
	// The TSDB: CPU and request rates for every opted-in pod, from two minutes ago to ten minutes
	// ahead, so that every weight cycle of the run finds a full window.
	vm := vmtest.Start(b)
	now := time.Now()
	for i := range opted {
		var sig strings.Builder
		ns, name := scaleNames(i*step, namespaces)
		for p := range perService {
			writeScaleSignals(&sig, ns, fmt.Sprintf("%s-%02d", name, p), p, now)
		}
		vm.ImportText(b, sig.String())
	}
	for from := 0; from < big; from += 1000 {
		var sig strings.Builder
		for p := from; p < min(from+1000, big); p++ {
			writeScaleSignals(&sig, bigNamespace, bigPodName(p), p, now)
		}
		vm.ImportText(b, sig.String())
	}
	for b.Loop() {
		auditBefore := auditCounts(b, auditLog, operatorUser)
		start := time.Now()
		metricsAddr := freeLoopbackAddr(b)
		// ADAPTIVELB_BENCH_SCALE_HEAPPROFILE=<file>: the operator's heap profile after sync.
		heapProfile, pprofAddr := os.Getenv("ADAPTIVELB_BENCH_SCALE_HEAPPROFILE"), "0"
		if heapProfile != "" {
			pprofAddr = freeLoopbackAddr(b)
		}
		op := exec.Command(bin, "run", "--kubeconfig", kubeconfig, "--metrics-bind-address", metricsAddr, "--metrics-secure=false",
			"--health-probe-bind-address", "0", "--pprof-bind-address", pprofAddr, "--log-level", "error", "--tsdb-url", vm.URL,
			"--mesh-multi-cluster=false") // the benchmark's TSDB has no istiod series
		op.Stderr = os.Stderr
		if limit := os.Getenv("ADAPTIVELB_BENCH_SCALE_GOMEMLIMIT"); limit != "" {
			op.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
		}
		if err := op.Start(); err != nil {
			b.Fatal(err)
		}
		stop := func() { _ = op.Process.Signal(os.Interrupt); _ = op.Wait() }
		startup, bigStartup := waitFullMirror(b, admin, start, opted, perService, big, 10*time.Minute)
		atStartup := auditCounts(b, auditLog, operatorUser).minus(auditBefore)
		rssStartup, _ := benchutil.ProcessMemory(strconv.Itoa(op.Process.Pid))
		heapStartup := scrapeGauge(b, metricsAddr, "go_memstats_heap_inuse_bytes")
		if heapProfile != "" {
			saveHeapProfile(b, pprofAddr, heapProfile) // after a collection: the live heap
			b.ReportMetric(scrapeGauge(b, metricsAddr, "go_memstats_heap_alloc_bytes")/1e6, "live_heap_after_sync_MB")
		}

		// A minute of churn on opted-in Services (ADAPTIVELB_BENCH_SCALE_RATE changes/s, 20 by
		// default; 200 is the propagation target's rate).
		rate := scaleSize("ADAPTIVELB_BENCH_SCALE_RATE", 20)
		churnStart := auditCounts(b, auditLog, operatorUser)
		propagationBefore := scrapeHistogram(b, metricsAddr, "adaptivelb_endpoint_propagation_seconds", "")
		// The propagation's two parts: the mirror's ServiceEntry writes (the API server's time and
		// the client's rate limit), and the reconcile's wait in the operator's own work queue.
		writesBefore := scrapeHistogram(b, metricsAddr, "adaptivelb_serviceentry_write_duration_seconds", "")
		queueBefore := scrapeHistogram(b, metricsAddr, "workqueue_queue_duration_seconds", mirrorQueue)
		cpuBefore := childCPU()
		churned, bigChurned := churn(b, admin, namespaces, step, opted, perService, bigSlices(big), rate, time.Minute)
		cpu := childCPU().minus(cpuBefore)
		time.Sleep(5 * time.Second) // let the last changes through
		afterStartup := auditCounts(b, auditLog, operatorUser).minus(churnStart)
		propagation := scrapeHistogram(b, metricsAddr, "adaptivelb_endpoint_propagation_seconds", "").minus(propagationBefore)
		mirrorWrites := scrapeHistogram(b, metricsAddr, "adaptivelb_serviceentry_write_duration_seconds", "").minus(writesBefore)
		queueWait := scrapeHistogram(b, metricsAddr, "workqueue_queue_duration_seconds", mirrorQueue).minus(queueBefore)
		statusLag := scrapeHistogram(b, metricsAddr, "adaptivelb_status_write_lag_seconds", "")
		cycle := scrapeHistogram(b, metricsAddr, "adaptivelb_weight_cycle_duration_seconds", "")
		phases := map[string]histogram{}
		for _, phase := range []string{"gather", "fetch", "evaluate", "write", "status"} {
			phases[phase] = scrapeHistogram(b, metricsAddr, "adaptivelb_weight_cycle_phase_seconds", fmt.Sprintf("phase=%q", phase))
		}
		b.ReportMetric(float64(churned)/time.Minute.Seconds(), "changes/s")
		// Whose CPU the churn minute cost: the operator's own, and the API server's and etcd's.
		for _, p := range []string{"adaptive-lb", "kube-apiserver", "etcd"} {
			b.ReportMetric(cpu[p], "churn_cpu_s_"+p)
		}
		if churned > 0 {
			b.ReportMetric(cpu["adaptive-lb"]*1000/float64(churned), "operator_cpu_ms_per_change")
		}
		if big > 0 {
			b.ReportMetric(float64(bigChurned)/time.Minute.Seconds(), "big_changes/s")
		}
		b.ReportMetric(propagation.quantile(0.5)*1000, "propagation_p50_ms")
		b.ReportMetric(propagation.quantile(0.99)*1000, "propagation_p99_ms")
		b.ReportMetric(mirrorWrites.quantile(0.5)*1000, "mirror_write_p50_ms")
		b.ReportMetric(mirrorWrites.quantile(0.99)*1000, "mirror_write_p99_ms")
		b.ReportMetric(queueWait.quantile(0.99)*1000, "mirror_queue_wait_p99_ms")
		if statusLag.count > 0 {
			b.ReportMetric(statusLag.quantile(0.99)*1000, "status_lag_p99_ms")
		}
		b.ReportMetric(cycle.count, "weight_cycles")
		if cycle.count > 0 {
			b.ReportMetric(cycle.sum/cycle.count*1000, "weight_cycle_mean_ms")
		}
		// Each phase's mean over the cycles that went through it: gather over every cycle, the
		// others over the cycles with a Service due.
		for phase, h := range phases {
			if h.count > 0 {
				b.ReportMetric(h.sum/h.count*1000, "cycle_"+phase+"_ms")
			}
		}
		rss, hwm := benchutil.ProcessMemory(strconv.Itoa(op.Process.Pid))
		heap := scrapeGauge(b, metricsAddr, "go_memstats_heap_inuse_bytes")
		stop()
		b.ReportMetric(heapStartup/1e6, "heap_inuse_after_sync_MB")
		b.ReportMetric(heap/1e6, "heap_inuse_after_churn_MB")

		b.ReportMetric(startup.Seconds(), "startup_s")
		if big > 0 {
			b.ReportMetric(bigStartup.Seconds(), "big_startup_s")
		}
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

// loadGeneratorClient is an admin client of cfg that fills a cluster fast: its rate limit is far
// above any the operator uses.
func loadGeneratorClient(b *testing.B, cfg *rest.Config) client.Client {
	b.Helper()
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
	return admin
}

// buildOperator builds the adaptive-lb binary into dir, to run as its own process.
func buildOperator(b *testing.B, dir string) string {
	b.Helper()
	bin := filepath.Join(dir, "adaptive-lb")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("build adaptive-lb: %v\n%s", err, out)
	}
	return bin
}

func mustCreate(b *testing.B, c client.Client, o client.Object) {
	b.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		b.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// waitFullMirror polls until `opted` ServiceEntries of the 20-pod Services list `perService`
// endpoints each and, when big > 0, the ServiceEntry slices of the big Service list its `big`
// addresses between them. It returns when each was first complete, counted from start.
func waitFullMirror(b *testing.B, c client.Client, start time.Time, opted, perService, big int, timeout time.Duration) (services, bigService time.Duration) {
	b.Helper()
	deadline := start.Add(timeout)
	for {
		var list networkingv1.ServiceEntryList
		if err := c.List(context.Background(), &list); err != nil {
			b.Fatal(err)
		}
		full := 0
		bigAddresses := map[string]bool{}
		for _, se := range list.Items {
			if isBigServiceSlice(se) {
				for _, e := range se.Spec.Endpoints {
					bigAddresses[e.Address] = true
				}
				continue
			}
			if len(se.Spec.Endpoints) == perService {
				full++
			}
		}
		if full == opted && services == 0 {
			services = time.Since(start)
		}
		if len(bigAddresses) == big && bigService == 0 {
			bigService = time.Since(start)
		}
		if services > 0 && bigService > 0 {
			return services, bigService
		}
		if time.Now().After(deadline) {
			b.Fatalf("after %s, %d of %d ServiceEntries complete, and the big Service's slices list %d of its %d pods", timeout, full, opted, len(bigAddresses), big)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verbCounts counts a user's requests by verb, with a verb/resource breakdown.
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

// auditCounts reads the audit log and counts the completed requests of user, whether it made
// them as itself or an admin made them impersonating it.
func auditCounts(tb testing.TB, path, user string) verbCounts {
	tb.Helper()
	out := verbCounts{byVerb: map[string]int{}, detail: map[string]int{}}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct {
			Verb             string                    `json:"verb"`
			Stage            string                    `json:"stage"`
			User             struct{ Username string } `json:"user"`
			ImpersonatedUser struct{ Username string } `json:"impersonatedUser"`
			ObjectRef        struct{ Resource string } `json:"objectRef"`
			UserAgent        string                    `json:"userAgent"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || (ev.User.Username != user && ev.ImpersonatedUser.Username != user) {
			continue
		}
		if ev.Stage != "ResponseComplete" && !(ev.Verb == "watch" && ev.Stage == "ResponseStarted") {
			continue
		}
		out.byVerb[ev.Verb]++
		key := ev.Verb + " " + ev.ObjectRef.Resource
		// The operator's weight and status clients name their budget in their user agent.
		if i := strings.LastIndex(ev.UserAgent, "("); i >= 0 && strings.HasSuffix(ev.UserAgent, ")") {
			key += " " + ev.UserAgent[i:]
		}
		out.detail[key]++
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

// scrapeHistogram reads a histogram from the operator's metrics endpoint: the series whose labels
// (other than le) are exactly labels, as exposed (`phase="fetch"`), or the unlabelled one.
func scrapeHistogram(b *testing.B, addr, name, labels string) histogram {
	b.Helper()
	var h histogram
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Logf("scrape %s: %v", addr, err)
		return h
	}
	defer resp.Body.Close()
	// The exposition puts le after the series' own labels.
	bucket, sum, count := name+"_bucket{le=\"", name+"_sum ", name+"_count "
	if labels != "" {
		bucket, sum, count = name+"_bucket{"+labels+",le=\"", name+"_sum{"+labels+"} ", name+"_count{"+labels+"} "
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, bucket):
			le, value, ok := strings.Cut(strings.TrimPrefix(line, bucket), "\"} ")
			if !ok {
				continue
			}
			bound, _ := strconv.ParseFloat(le, 64)
			c, _ := strconv.ParseFloat(value, 64)
			h.bounds, h.cumulative = append(h.bounds, bound), append(h.cumulative, c)
		case strings.HasPrefix(line, sum):
			h.sum, _ = strconv.ParseFloat(strings.TrimPrefix(line, sum), 64)
		case strings.HasPrefix(line, count):
			h.count, _ = strconv.ParseFloat(strings.TrimPrefix(line, count), 64)
		}
	}
	return h
}
