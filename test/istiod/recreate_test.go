package istiod

import (
	"context"
	"testing"
	"time"

	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/host"
	"istio.io/istio/pkg/test/util/retry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestServiceRecreatedWhileServiceEntryExists: the Service is deleted and created again while
// the operator's ServiceEntry stays, so istiod sees the ServiceEntry first and the Service
// second, the opposite of a fresh install. The config with the ServiceEntry must still equal
// the config after the ServiceEntry is removed, except the weights.
func TestServiceRecreatedWhileServiceEntryExists(t *testing.T) {
	for _, s := range []shape{
		{name: "port-http", world: defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))},
		{name: "port-tcp", world: defaultWorld(port("tcp-db", 5432, intstr.FromInt32(5432)))},
		{name: "port-name-without-protocol", world: defaultWorld(port("web", 80, intstr.FromInt32(8080)))},
	} {
		t.Run(s.name, func(t *testing.T) {
			w := s.world
			f := server(t, w, nil, xds.FakeOptions{MeshConfig: meshConfig(s)})
			spec, endpoints := build(t, w)
			wantWeight := map[string]uint32{}
			for _, ep := range endpoints {
				wantWeight[ep.IP] = ep.Weight
			}
			applySE(t, f, spec)

			services := f.KubeClient().Kube().CoreV1().Services(targetNamespace)
			if err := services.Delete(context.Background(), targetName, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitForKubeService(t, f, false)
			if _, err := services.Create(context.Background(), w.service.DeepCopy(), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitForKubeService(t, f, true)

			cs := clients(w)
			with := make([]snapshot, len(cs))
			for i, c := range cs {
				with[i] = fetch(t, f, c)
			}
			deleteSE(t, f)
			for i, c := range cs {
				checkInvariant(t, c.name, fetch(t, f, c), with[i], wantWeight)
			}
		})
	}
}

// waitForKubeService waits until istiod's Kubernetes registry has (or no longer has) the
// Service and the push context is rebuilt on it. Informer events are asynchronous; the bound
// only guards against a hang.
func waitForKubeService(t *testing.T, f *xds.FakeDiscoveryServer, present bool) {
	t.Helper()
	retry.UntilOrFail(t, func() bool {
		return (f.KubeRegistry.GetService(host.Name(targetHost)) != nil) == present
	}, retry.Timeout(responseTimeout), retry.Delay(10*time.Millisecond))
	f.EnsureSynced(t)
}
