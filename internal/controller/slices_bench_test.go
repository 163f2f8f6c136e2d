package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
)

// BenchmarkServiceEntrySlices_EndpointChange measures what one endpoint change of a 2,000-pod
// Service costs: the ServiceEntry bytes written and the API server's CPU (user+system of envtest's
// kube-apiserver, from /proc). It flips the readiness of one endpoint at a time, 100 times, each
// time waiting until the operator's cache shows the change in its ServiceEntries; first on a
// Service without an AdaptiveLoadBalancer (the EndpointSlice updates alone, the baseline), then
// on one with; the API server's idle CPU over the same time is subtracted. The slice size is
// the suite's, set for the run:
//
//	ADAPTIVELB_BENCH_SLICE_ENDPOINTS=2000 go test -run '^$' -bench ServiceEntrySlices -benchtime 1x ./internal/controller/  # one ServiceEntry
//	ADAPTIVELB_BENCH_SLICE_ENDPOINTS=500  go test -run '^$' -bench ServiceEntrySlices -benchtime 1x ./internal/controller/  # slices of 500
func BenchmarkServiceEntrySlices_EndpointChange(b *testing.B) {
	const pods, changes = 2000, 100
	f := newFixture(b)
	f.node("node-a", "eu-west", "eu-west-1a")
	var idle float64 // the API server's CPU seconds per second with nothing to do
	run := func(svc string, subnet int, withALB bool) (cpuPerChange time.Duration, bytesPerChange, objects int) {
		f.service(svc)
		eps := make([]sliceEndpoint, pods)
		ips := make([]string, pods)
		for i := range pods {
			eps[i] = ready(fmt.Sprintf("%s-%04d", svc, i), fmt.Sprintf("10.%d.%d.%d", subnet, i/250, i%250+1))
			ips[i] = eps[i].ip
		}
		f.createPods(svc, eps)
		f.slice(svc, svc+"-a", eps[:1000]...)
		f.slice(svc, svc+"-b", eps[1000:]...)
		if withALB {
			f.alb(svc, svc)
			f.waitForAddresses(svc, append([]string(nil), ips...)...)
		}
		versions := func() map[string]*networkingv1.ServiceEntry {
			out := map[string]*networkingv1.ServiceEntry{}
			var list networkingv1.ServiceEntryList
			if err := operatorClient.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
				b.Fatal(err)
			}
			for _, se := range list.Items {
				if se.Name == svc || strings.HasPrefix(se.Name, svc+".") {
					out[se.Name] = se
				}
			}
			return out
		}
		before := versions()
		for deadline := time.Now().Add(30 * time.Second); withALB; before = versions() {
			n := 0 // the operator's cache may lag the API server the fixture waited on
			for _, se := range before {
				n += len(se.Spec.Endpoints)
			}
			if n == pods {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the operator's cache lists %d of %s's %d endpoints after 30s", n, svc, pods)
			}
			time.Sleep(10 * time.Millisecond)
		}
		objects = len(before)
		cpu0, start := benchutil.ChildCPUSeconds("kube-apiserver"), time.Now()
		bytes := 0
		for c := range changes {
			i := (c * 37) % 1000 // endpoints of the first EndpointSlice, spread over the slices
			eps[i].ready, eps[i].serving = !eps[i].ready, !eps[i].serving
			f.slice(svc, svc+"-a", eps[:1000]...)
			if !withALB {
				continue
			}
			wantListed := eps[i].ready
			deadline := time.Now().Add(30 * time.Second)
			for {
				after := versions()
				listed := false
				for _, se := range after {
					for _, e := range se.Spec.Endpoints {
						listed = listed || e.Address == eps[i].ip
					}
				}
				if listed == wantListed {
					for name, se := range after {
						if old := before[name]; old == nil || old.ResourceVersion != se.ResourceVersion {
							raw, _ := json.Marshal(se)
							bytes += len(raw)
						}
					}
					before = after
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("change %d of %s not mirrored after 30s", c, eps[i].ip)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		// Less what the API server spends idle (leases, the controller manager) meanwhile.
		cpu := benchutil.ChildCPUSeconds("kube-apiserver") - cpu0 - idle*time.Since(start).Seconds()
		return time.Duration(cpu / changes * float64(time.Second)), bytes / changes, objects
	}
	idleFrom := benchutil.ChildCPUSeconds("kube-apiserver")
	time.Sleep(5 * time.Second)
	idle = (benchutil.ChildCPUSeconds("kube-apiserver") - idleFrom) / 5
	baseCPU, _, _ := run("plain", 70, false)
	cpu, bytes, objects := run("web", 71, true)
	b.ReportMetric(float64(baseCPU.Microseconds())/1000, "base-apiserver-ms/change")
	b.ReportMetric(float64(cpu.Microseconds())/1000, "apiserver-ms/change")
	b.ReportMetric(float64((cpu-baseCPU).Microseconds())/1000, "mirror-apiserver-ms/change")
	b.ReportMetric(float64(bytes), "se-bytes/change")
	b.ReportMetric(float64(objects), "serviceentries")
	b.ReportMetric(idle*1000, "idle-apiserver-ms/s")
}
