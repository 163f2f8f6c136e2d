package main

import (
	"context"
	"fmt"
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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// The cluster of the scale benchmark and its churn: `services` Services of 20 pods each, one in step opted
// in, and optionally the big Service (ADAPTIVELB_BENCH_SCALE_BIG): one opted-in Service of many
// pods in EndpointSlices as the EndpointSlice controller makes them.
const (
	bigNamespace = "team-00"
	bigService   = "big"
	// bigSliceEndpoints is the EndpointSlice controller's default --max-endpoints-per-slice.
	bigSliceEndpoints = 100
)

// checkScaleSizes refuses sizes the harness cannot build or measure.
func checkScaleSizes(services, opted, big int) error {
	switch {
	case opted < 10 || opted > services:
		return fmt.Errorf("ADAPTIVELB_BENCH_SCALE_OPTED=%d: want between 10 (one per churn writer) and ADAPTIVELB_BENCH_SCALE_SERVICES (%d)", opted, services)
	case services >= 150*250:
		return fmt.Errorf("ADAPTIVELB_BENCH_SCALE_SERVICES=%d: want fewer than 37,500, or the pod IPs (10.100.0.0 to 10.249.255.255) run out", services)
	case big > istio.MaxEndpoints:
		return fmt.Errorf("ADAPTIVELB_BENCH_SCALE_BIG=%d: the operator mirrors at most %d endpoints of one Service; want at most that", big, istio.MaxEndpoints)
	}
	return nil
}

// inParallel runs f(0) … f(n-1) on 16 workers and returns the first error.
func inParallel(n int, f func(int) error) error {
	work := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func scaleIP(s, p int) string { return fmt.Sprintf("10.%d.%d.%d", 100+s/250, s%250, p+1) }

func scaleNames(s, namespaces int) (ns, svc string) {
	return fmt.Sprintf("team-%02d", s%namespaces), fmt.Sprintf("svc-%04d", s)
}

func scaleNode(n int) string { return fmt.Sprintf("node-%03d", n) }

// createScaleService creates one Service with its pods (IPs set in status), EndpointSlice and,
// when opted, its AdaptiveLoadBalancer.
func createScaleService(ctx context.Context, c client.Client, s, namespaces, perService, nodes int, opted bool) error {
	ns, name := scaleNames(s, namespaces)
	if err := createScaleServiceObject(ctx, c, ns, name); err != nil {
		return err
	}
	slice := newScaleEndpointSlice(ns, name, name+"-x")
	for p := range perService {
		pod, node, ip := fmt.Sprintf("%s-%02d", name, p), scaleNode((s*perService+p)%nodes), scaleIP(s, p)
		if err := createReadyPod(ctx, c, ns, name, pod, node, ip); err != nil {
			return err
		}
		slice.Endpoints = append(slice.Endpoints, readyEndpoint(ns, pod, node, ip))
	}
	if err := c.Create(ctx, slice); err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", ns, slice.Name, err)
	}
	if opted {
		return createScaleALB(ctx, c, ns, name)
	}
	return nil
}

func createScaleServiceObject(ctx context.Context, c client.Client, ns, name string) error {
	err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": name},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}})
	if err != nil {
		return fmt.Errorf("create Service %s/%s: %w", ns, name, err)
	}
	return nil
}

func createScaleALB(ctx context.Context, c client.Client, ns, service string) error {
	err := c.Create(ctx, &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: ns}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: service}}})
	if err != nil {
		return fmt.Errorf("create AdaptiveLoadBalancer %s/%s: %w", ns, service, err)
	}
	return nil
}

// newScaleEndpointSlice is an empty EndpointSlice of service with the Service's port.
func newScaleEndpointSlice(ns, service, name string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
}

func readyEndpoint(ns, pod, node, ip string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		NodeName: ptr.To(node), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}}
}

// createReadyPod creates a pod of app with a sidecar on node, then sets it ready at ip.
func createReadyPod(ctx context.Context, c client.Client, ns, app, name, node, ip string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"app": app, "version": "v1"},
			Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: app, Containers: []corev1.Container{
			{Name: "app", Image: "registry.example.com/app:1.0", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}},
			{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.31.1"},
		}},
	}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	pod.Status = corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("set the status of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// writeScaleSignals writes pod p's CPU and request counters, from two minutes ago to ten
// minutes ahead, so that every weight cycle of the run finds a full window; odd pods cost three
// times the CPU per request (two hardware speeds).
func writeScaleSignals(sig *strings.Builder, ns, pod string, p int, now time.Time) {
	cores := 0.2 + 0.4*float64(p%2)
	sig.WriteString(vmtest.Counter(fmt.Sprintf(`container_cpu_usage_seconds_total{namespace=%q,pod=%q,container="app"}`, ns, pod), cores, now.Add(-2*time.Minute), now.Add(10*time.Minute), 15*time.Second))
	sig.WriteString(vmtest.Counter(fmt.Sprintf(`istio_requests_total{reporter="destination",namespace=%q,pod=%q,response_code="200"}`, ns, pod), 20, now.Add(-2*time.Minute), now.Add(10*time.Minute), 15*time.Second))
}

func bigPodName(p int) string { return fmt.Sprintf("%s-%05d", bigService, p) }

// bigIP is pod p's address, in 10.250.0.0 and up, which scaleIP (10.100.0.0 to
// 10.249.255.255) never reaches.
func bigIP(p int) string { return fmt.Sprintf("10.%d.%d.%d", 250+p/62500, p/250%250, p%250+1) }

func bigSliceName(k int) string { return fmt.Sprintf("%s-%03d", bigService, k) }

// bigSlices is how many EndpointSlices a big Service of pods has.
func bigSlices(pods int) int { return (pods + bigSliceEndpoints - 1) / bigSliceEndpoints }

// isBigServiceSlice tells the big Service's ServiceEntry slices (big, big.1, …, labelled with
// the Service) from the 20-pod Services' ServiceEntries.
func isBigServiceSlice(se *networkingv1.ServiceEntry) bool {
	if se.Namespace != bigNamespace {
		return false
	}
	_, named := istio.SliceIndex(bigService, se.Name)
	return named || se.Labels[controller.ServiceLabel] == bigService
}

// createBigService creates the big Service with its pods (spread over the nodes), its
// EndpointSlices of at most bigSliceEndpoints endpoints and its AdaptiveLoadBalancer.
func createBigService(ctx context.Context, c client.Client, pods, nodes int) error {
	if err := createScaleServiceObject(ctx, c, bigNamespace, bigService); err != nil {
		return err
	}
	err := inParallel(pods, func(p int) error {
		return createReadyPod(ctx, c, bigNamespace, bigService, bigPodName(p), scaleNode(p%nodes), bigIP(p))
	})
	if err != nil {
		return err
	}
	for k := range bigSlices(pods) {
		slice := newScaleEndpointSlice(bigNamespace, bigService, bigSliceName(k))
		for p := k * bigSliceEndpoints; p < min((k+1)*bigSliceEndpoints, pods); p++ {
			slice.Endpoints = append(slice.Endpoints, readyEndpoint(bigNamespace, bigPodName(p), scaleNode(p%nodes), bigIP(p)))
		}
		if err := c.Create(ctx, slice); err != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", bigNamespace, slice.Name, err)
		}
	}
	return createScaleALB(ctx, c, bigNamespace, bigService)
}

// churn flips the readiness of endpoints of the opted-in Services (Service i*step for i <
// opted) at rate per second for d, from 10 writers that own disjoint Services, and disjoint
// EndpointSlices of the big Service (bigSlices of them), so that each object's changes stay
// ordered. One change in ten of a writer that owns a big Service slice goes to that slice. It
// returns how many changes it made, in all and in the big Service.
func churn(b *testing.B, c client.Client, namespaces, step, opted, perService, bigSlices, rate int, d time.Duration) (total, big int) {
	b.Helper()
	const writers = 10
	var all, inBig atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	// Every request ends by then, whatever the API server does.
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(30*time.Second))
	defer cancel()
	for w := range writers {
		var mySlices []int
		for k := w; k < bigSlices; k += writers {
			mySlices = append(mySlices, k)
		}
		myServices := (opted - w + writers - 1) / writers // the opted-in Services w, w+10, …
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second * writers / time.Duration(rate))
			defer tick.Stop()
			normal, sliced := 0, 0
			for i := 0; time.Now().Before(deadline); i++ {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
				if len(mySlices) > 0 && i%10 == 9 {
					k := mySlices[sliced%len(mySlices)]
					if err := flipReadiness(ctx, c, client.ObjectKey{Namespace: bigNamespace, Name: bigSliceName(k)}, sliced/len(mySlices)); err != nil {
						b.Error(err)
						return
					}
					sliced++
					inBig.Add(1)
					all.Add(1)
					continue
				}
				ns, name := scaleNames((w+writers*(normal%myServices))*step, namespaces)
				if err := flipReadiness(ctx, c, client.ObjectKey{Namespace: ns, Name: name + "-x"}, (normal/myServices)%perService); err != nil {
					b.Error(err)
					return
				}
				normal++
				all.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(all.Load()), int(inBig.Load())
}

// flipReadiness flips the readiness of endpoint e (modulo their number) of an EndpointSlice.
func flipReadiness(ctx context.Context, c client.Client, key client.ObjectKey, e int) error {
	slice := &discoveryv1.EndpointSlice{}
	if err := c.Get(ctx, key, slice); err != nil {
		return fmt.Errorf("get EndpointSlice %s: %w", key, err)
	}
	if len(slice.Endpoints) == 0 {
		return fmt.Errorf("EndpointSlice %s has no endpoints to flip", key)
	}
	e %= len(slice.Endpoints)
	slice.Endpoints[e].Conditions.Ready = ptr.To(!ptr.Deref(slice.Endpoints[e].Conditions.Ready, true))
	if err := c.Update(ctx, slice); err != nil {
		return fmt.Errorf("update EndpointSlice %s: %w", key, err)
	}
	return nil
}
