package controller

import (
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
)

// BenchmarkEndpointPropagation drives 100 Services × 20 endpoints on the real API server with 200
// endpoint readiness flips per second for 60 s. It reports the delay from each EndpointSlice
// event reaching the operator to the ServiceEntry reflecting it (the measure behind
// adaptivelb_endpoint_propagation_seconds), and the endpoints still missing or stale at the end.
//
//	make envtest-assets && eval "$(make -s test-env)" && \
//	  go test -run '^$' -bench EndpointPropagation -benchtime 1x -timeout 20m ./internal/controller/
//
// ADAPTIVELB_BENCH_RATE sets another rate of changes per second.
func BenchmarkEndpointPropagation(b *testing.B) {
	const services, perService, duration = 100, 20, 60 * time.Second
	rate := 200
	if v, err := strconv.Atoi(os.Getenv("ADAPTIVELB_BENCH_RATE")); err == nil && v > 0 {
		rate = v // a lower rate separates the operator's own latency from a saturated API server
	}
	f := newFixture(b)
	f.node("node-a", "eu-west", "eu-west-1a")
	ip := func(s, e int) string { return fmt.Sprintf("10.%d.%d.%d", 100+s/250, s%250, e+1) }
	podName := func(s, e int) string { return fmt.Sprintf("svc-%03d-%02d", s, e) }
	svcName := func(s int) string { return fmt.Sprintf("svc-%03d", s) }
	state := make([][]bool, services)
	writeSlice := func(s int) {
		var eps []sliceEndpoint
		for e := 0; e < perService; e++ {
			eps = append(eps, sliceEndpoint{pod: podName(s, e), ip: ip(s, e), ready: state[s][e], serving: state[s][e]})
		}
		f.slice(svcName(s), svcName(s)+"-x", eps...)
	}
	for s := 0; s < services; s++ {
		f.service(svcName(s))
		state[s] = make([]bool, perService)
		for e := 0; e < perService; e++ {
			f.pod(svcName(s), podName(s, e), ip(s, e))
			state[s][e] = true
		}
		writeSlice(s)
		f.alb(svcName(s), svcName(s))
	}
	for s := 0; s < services; s++ {
		var want []string
		for e := 0; e < perService; e++ {
			want = append(want, ip(s, e))
		}
		f.waitForAddresses(svcName(s), want...)
	}

	// The endpointslice controller's view: one slice object per Service, updated in place.
	slices := make([]*discoveryv1.EndpointSlice, services)
	for s := range slices {
		slices[s] = &discoveryv1.EndpointSlice{}
		if err := k8s.Get(b.Context(), types.NamespacedName{Namespace: f.ns, Name: svcName(s) + "-x"}, slices[s]); err != nil {
			b.Fatal(err)
		}
	}
	// Writers own disjoint Services, so a Service's changes stay ordered; together they sustain
	// the rate the API server would see from the endpointslice controller. 25 of them keep up
	// with 200 changes/s even while each update takes ~100 ms on a saturated API server.
	const writers = 25
	for b.Loop() {
		propagationSamples.start()
		apiserverCPU := benchutil.ChildCPUSeconds("kube-apiserver")
		profileDone := profileAPIServer(b, os.Getenv("ADAPTIVELB_BENCH_APISERVER_PROFILE"), 30*time.Second)
		var wg sync.WaitGroup
		var changes atomic.Int64
		errs := make(chan error, writers)
		deadline := time.Now().Add(duration)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewSource(int64(w)))
				// Staggered starts spread the changes evenly instead of in bursts of 25.
				interval := time.Second * writers / time.Duration(rate)
				time.Sleep(interval * time.Duration(w) / writers)
				tick := time.NewTicker(interval)
				defer tick.Stop()
				for time.Now().Before(deadline) {
					<-tick.C
					s, e := w+writers*r.Intn(services/writers), r.Intn(perService)
					state[s][e] = !state[s][e]
					slices[s].Endpoints[e].Conditions.Ready = ptr.To(state[s][e])
					slices[s].Endpoints[e].Conditions.Serving = ptr.To(state[s][e])
					if err := k8s.Update(b.Context(), slices[s]); err != nil {
						errs <- fmt.Errorf("update slice of %s: %w", svcName(s), err)
						return
					}
					changes.Add(1)
				}
			}()
		}
		wg.Wait()
		apiserverCores := (benchutil.ChildCPUSeconds("kube-apiserver") - apiserverCPU) / duration.Seconds()
		<-profileDone
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		stale := waitConverged(f, services, func(s int) []string {
			var want []string
			for e := 0; e < perService; e++ {
				if state[s][e] {
					want = append(want, ip(s, e))
				}
			}
			return want
		}, svcName)
		samples := propagationSamples.stop()
		sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
		q := func(p float64) float64 {
			if len(samples) == 0 {
				return 0
			}
			return float64(samples[int(p*float64(len(samples)-1))].Microseconds()) / 1000
		}
		b.ReportMetric(float64(changes.Load())/duration.Seconds(), "changes/s")
		b.ReportMetric(float64(len(samples)), "propagations")
		b.ReportMetric(q(0.5), "p50_ms")
		b.ReportMetric(q(0.99), "p99_ms")
		b.ReportMetric(q(1), "max_ms")
		b.ReportMetric(float64(stale), "stale_endpoints")
		b.ReportMetric(apiserverCores, "apiserver_cores")
		queue, work := workqueueMeans(b)
		b.ReportMetric(queue*1000, "queue_wait_mean_ms")
		b.ReportMetric(work*1000, "reconcile_mean_ms")
	}
}

// waitConverged waits until every ServiceEntry lists exactly its ready endpoints and returns how
// many endpoints are still missing or stale after 30 s.
func waitConverged(f *fixture, services int, want func(int) []string, name func(int) string) int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		wrong := 0
		for s := 0; s < services; s++ {
			w := want(s)
			sort.Strings(w)
			se, err := f.serviceEntry(name(s))
			if err != nil {
				wrong += len(w)
				continue
			}
			if got := addresses(se); strings.Join(got, ",") != strings.Join(w, ",") {
				wrong += symmetricDifference(got, w)
			}
		}
		if wrong == 0 || time.Now().After(deadline) {
			return wrong
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func symmetricDifference(a, b []string) int {
	count := map[string]int{}
	for _, x := range a {
		count[x]++
	}
	for _, x := range b {
		count[x]--
	}
	n := 0
	for _, v := range count {
		if v != 0 {
			n++
		}
	}
	return n
}

// workqueueMeans reads controller-runtime's workqueue histograms for the reconciler: the mean time
// a key waited in the queue and the mean time a reconcile took.
func workqueueMeans(b *testing.B) (queue, work float64) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	mean := func(name string) float64 {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "name" && l.GetValue() == "adaptiveloadbalancer" && m.GetHistogram().GetSampleCount() > 0 {
						return m.GetHistogram().GetSampleSum() / float64(m.GetHistogram().GetSampleCount())
					}
				}
			}
		}
		return 0
	}
	return mean("workqueue_queue_duration_seconds"), mean("workqueue_work_duration_seconds")
}

// profileAPIServer, when path is set, records a CPU profile of kube-apiserver (its
// /debug/pprof endpoint, on by default) for the given duration into path: the propagation delay
// is bounded by the API server's cost per write, and this shows where that cost goes. The
// returned channel closes when the profile is written.
func profileAPIServer(b *testing.B, path string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if path == "" {
		close(done)
		return done
	}
	rc, err := rest.RESTClientFor(restConfigForRaw(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(done)
		body, err := rc.Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + time.Minute).DoRaw(b.Context())
		if err != nil {
			b.Errorf("profile kube-apiserver: %v", err)
			return
		}
		if err := os.WriteFile(path, body, 0o644); err != nil {
			b.Errorf("write kube-apiserver profile: %v", err)
		}
	}()
	return done
}

func restConfigForRaw(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schema.GroupVersion{}
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return c
}
