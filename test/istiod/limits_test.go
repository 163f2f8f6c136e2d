package istiod

import (
	"fmt"
	"net"
	"sort"
	"testing"

	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/test"
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

// TestDualStackIstiodSplitsIPv6Hosts records the other limit of docs/istio.md: with istiod's
// dual-stack support on (ISTIO_DUAL_STACK), the Kubernetes copy of a dual-stack pod is one host
// whose IPv6 address is an additional address, while a ServiceEntry endpoint holds one address,
// so the ServiceEntry adds a separate IPv6 host per pod. (With the flag off, its default, the
// dual-stack case of TestServiceEntryChangesOnlyWeights holds.)
func TestDualStackIstiodSplitsIPv6Hosts(t *testing.T) {
	test.SetForTest(t, &features.EnableDualStack, true)
	w := dualStackWorld()
	f := server(t, w, nil, xds.FakeOptions{})
	c := clients(w)[0]
	cluster := "outbound|80||" + targetHost
	_, before, _ := keptHosts(fetch(t, f, c).endpoints[cluster])
	spec, _ := build(t, w)
	applySE(t, f, spec)
	_, after, _ := keptHosts(fetch(t, f, c).endpoints[cluster])
	for _, p := range w.pods {
		v6 := net.JoinHostPort(p.ipv6, "8080")
		if _, ok := before[v6]; ok {
			t.Errorf("Kubernetes copy: %s is a host of its own; the documented limit no longer holds", v6)
		}
		if _, ok := after[v6]; !ok {
			t.Errorf("with the ServiceEntry: %s is not a host of its own; the documented limit no longer holds", v6)
		}
	}
}
