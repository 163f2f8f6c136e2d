package istiod

import (
	"fmt"
	"sort"
	"testing"

	"istio.io/istio/pilot/test/xds"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestWorkloadNameOfServiceEntryHosts records a limit of the mirror: istiod names the workload
// of an inline ServiceEntry endpoint "<serviceentry>-<index>" (the Kubernetes copy names the
// Deployment), and reads no endpoint field or label to change it. The host Envoy keeps therefore
// carries that name in its Istio metadata ("istio"/"workload"), which client sidecars report as
// destination_workload when the peer sends no metadata of its own (a pod without a sidecar).
// Everything else in that metadata equals the Kubernetes copy (TestServiceEntryChangesOnlyWeights).
func TestWorkloadNameOfServiceEntryHosts(t *testing.T) {
	w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
	f := server(t, w, nil, xds.FakeOptions{})
	c := clients(w)[0]
	cluster := "outbound|80||" + targetHost
	_, _, before := keptHosts(fetch(t, f, c).endpoints[cluster])
	spec, _ := build(t, w)
	applySE(t, f, spec)
	_, _, after := keptHosts(fetch(t, f, c).endpoints[cluster])

	var addrs []string
	for addr := range before {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	for i, addr := range addrs {
		if before[addr] != "api" {
			t.Errorf("host %s: Kubernetes copy names workload %q, want the Deployment api", addr, before[addr])
		}
		// The ServiceEntry's endpoints are sorted by address, so the index follows the address order.
		if want := fmt.Sprintf("%s-%d", targetName, i); after[addr] != want {
			t.Errorf("host %s: kept copy names workload %q, want %q", addr, after[addr], want)
		}
	}
}
