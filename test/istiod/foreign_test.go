package istiod

import (
	"testing"
	"time"

	"istio.io/istio/pilot/pkg/config/kube/crd"
	"istio.io/istio/pilot/pkg/serviceregistry/provider"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/test/util/retry"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestForeignServiceEntryComesFirst records why another owner's ServiceEntry of the Service's
// host is a Conflict (foreign-serviceentry in TestServiceEntryChangesOnlyWeights): istiod lists
// its copies of the pods before the operator's, whether it is older (present from the start) or
// younger (created after the operator's), so every client keeps its weight 1 and its plaintext
// (it has no tlsMode label) while the operator's weights are ignored.
func TestForeignServiceEntryComesFirst(t *testing.T) {
	for _, older := range []bool{true, false} {
		name := "foreign-younger"
		if older {
			name = "foreign-older"
		}
		t.Run(name, func(t *testing.T) {
			w := defaultWorld(port("http-web", 80, intstr.FromInt32(8080)))
			cfg := ""
			if older {
				cfg = foreignServiceEntry
			}
			f := server(t, w, nil, xds.FakeOptions{ConfigString: cfg})
			spec, _ := build(t, w)
			applySE(t, f, spec)
			if !older {
				for _, c := range configsFromYAML(t, foreignServiceEntry) {
					if _, err := f.Store().Create(c); err != nil {
						t.Fatal(err)
					}
				}
				waitForServiceEntryEndpointsOf(t, f, 2*len(spec.Endpoints))
			}
			_, weights := keptByEnvoy(fetch(t, f, clients(w)[0]).endpoints["outbound|80||"+targetHost])
			for key, weight := range weights {
				if weight != 1 {
					t.Errorf("host %s kept with weight %d: the operator's copy came first; the recorded shadowing no longer holds", key, weight)
				}
			}
			t.Logf("kept hosts and weights: %v", weights)
		})
	}
}

// configsFromYAML parses Istio YAML into the config store's objects.
func configsFromYAML(t *testing.T, text string) []config.Config {
	t.Helper()
	out, _, err := crd.ParseInputs(text)
	if err != nil {
		t.Fatalf("parse Istio YAML: %v", err)
	}
	return out
}

// waitForServiceEntryEndpointsOf waits until istiod's endpoint index holds n ServiceEntry
// endpoints for the host in all (several ServiceEntries may list one address).
func waitForServiceEntryEndpointsOf(t *testing.T, f *xds.FakeDiscoveryServer, n int) {
	t.Helper()
	retry.UntilOrFail(t, func() bool {
		got := 0
		if shards, ok := f.Discovery.Env.EndpointIndex.ShardsForService(targetHost, targetNamespace); ok {
			shards.RLock()
			for key, eps := range shards.Shards {
				if key.Provider == provider.External {
					got += len(eps)
				}
			}
			shards.RUnlock()
		}
		return got == n
	}, retry.Timeout(responseTimeout), retry.Delay(10*time.Millisecond))
	f.EnsureSynced(t)
}
