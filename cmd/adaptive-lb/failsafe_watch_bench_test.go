package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
)

// BenchmarkFailsafeWatchMemory measures what the watchdog's watches cost it in memory, over
// ADAPTIVELB_BENCH_FAILSAFE_SERVICES Services (10,000 by default) in 10 namespaces, each with
// the metadata kubectl apply gives it (labels, its last-applied-configuration annotation, the
// API server's managed fields), and one managed ServiceEntry per 20 Services. In-process: the
// live heap the watches hold once synced, per Service, and the peak heap while they sync. The
// watchdog binary, run as its own process as in its Deployment: its anonymous memory (heap and
// stacks, what counts against a memory limit; its binary's mapped pages do not stay) once synced
// and its peak while starting, first watching a namespace without Services, then all of them.
//
//	make envtest-assets && eval "$(make -s test-env)" && \
//	  go test -run '^$' -bench FailsafeWatchMemory -benchtime 1x ./cmd/adaptive-lb/
func BenchmarkFailsafeWatchMemory(b *testing.B) {
	services := scaleSize("ADAPTIVELB_BENCH_FAILSAFE_SERVICES", 10000)
	env, cfg := startAPIServer(b, ownCRDPath, istioCRDPath(b))
	admin := loadGeneratorClient(b, cfg)
	for _, ns := range []string{"team-00", "team-01", "team-02", "team-03", "team-04", "team-05", "team-06", "team-07", "team-08", "team-09", "team-empty"} {
		mustCreate(b, admin, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	fillServices(b, admin, services)
	bin := buildOperator(b, b.TempDir())
	kubeconfig := kubeconfigFile(b, env, "")

	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		watched := newWatchedMetadata(env.Config, nil, logr.Discard())
		var synced time.Duration
		peak, before := benchutil.PeakHeap(func() {
			start := time.Now()
			watched.start(ctx)
			if !watched.waitForSync(ctx, 5*time.Minute) {
				b.Fatal("the watches did not sync in 5 minutes")
			}
			synced = time.Since(start)
		})
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-min(after.HeapAlloc, before))/float64(services), "live_B/service")
		b.ReportMetric(float64(peak)/(1<<20), "peak_heap_MiB")
		b.ReportMetric(synced.Seconds(), "sync_s")
		runtime.KeepAlive(watched)
		cancel()
		<-watched.stopped

		idle, _ := watchdogProcessMemory(b, bin, kubeconfig, "--namespaces=team-empty")
		all, allPeak := watchdogProcessMemory(b, bin, kubeconfig)
		b.ReportMetric(float64(idle)/(1<<20), "anon_no_services_MiB")
		b.ReportMetric(float64(all)/(1<<20), "anon_synced_MiB")
		b.ReportMetric(float64(allPeak)/(1<<20), "anon_peak_MiB")
	}
}

// watchdogProcessMemory runs `adaptive-lb failsafe` (binary bin) with extra flags until its
// watches have synced and it has checked twice, and returns its anonymous memory then and the
// most it held meanwhile (sampled every 10 ms).
func watchdogProcessMemory(b *testing.B, bin, kubeconfig string, extra ...string) (synced, peak uint64) {
	b.Helper()
	logs := &lockedBuffer{}
	wd := exec.Command(bin, append([]string{"failsafe", "--kubeconfig", kubeconfig, "--leader-election-namespace", operatorNamespace,
		"--stale-after", "10m", "--check-interval", "500ms", "--log-level", "debug"}, extra...)...)
	wd.Stderr = logs
	if err := wd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = wd.Process.Signal(os.Interrupt); _ = wd.Wait() }()
	pid := strconv.Itoa(wd.Process.Pid)
	deadline := time.Now().Add(5 * time.Minute)
	for !strings.Contains(logs.String(), "have synced") || strings.Count(logs.String(), "heartbeat fresh") < 2 {
		if time.Now().After(deadline) {
			b.Fatalf("the watchdog did not sync and check in 5 minutes:\n%s", logs)
		}
		peak = max(peak, benchutil.ProcessAnonymousMemory(pid))
		time.Sleep(10 * time.Millisecond)
	}
	synced = benchutil.ProcessAnonymousMemory(pid)
	return synced, max(peak, synced)
}

// fillServices creates n headless Services (no cluster IP to allocate) spread over the
// namespaces team-00 to team-09, with kubectl apply's metadata, and a managed ServiceEntry for
// one in 20.
func fillServices(b *testing.B, c client.Client, n int) {
	b.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	create := func(o client.Object) {
		if err := c.Create(context.Background(), o); err != nil {
			err = fmt.Errorf("create %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
			failed.CompareAndSwap(nil, &err)
		}
	}
	for range 16 {
		wg.Go(func() {
			for i := range work {
				ns, name := fmt.Sprintf("team-%02d", i%10), fmt.Sprintf("svc-%05d", i)
				labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop", "app.kubernetes.io/managed-by": "kubectl"}
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels,
					Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: fmt.Sprintf(
						`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app.kubernetes.io/managed-by":"kubectl","app.kubernetes.io/name":%q,"app.kubernetes.io/part-of":"shop"},"name":%q,"namespace":%q},"spec":{"clusterIP":"None","ports":[{"name":"http","port":80,"targetPort":8080}],"selector":{"app.kubernetes.io/name":%q}}}`,
						name, name, ns, name)}},
					Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app.kubernetes.io/name": name},
						Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
				create(svc)
				if i%20 == 0 {
					create(managedServiceEntry(ns, name))
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}
