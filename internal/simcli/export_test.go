package simcli

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The simulator checks Kubernetes names without k8s.io/apimachinery (to compile without it); it
// must accept exactly what the API server's own check accepts.
func TestCheckDNSLabel_AgreesWithKubernetes(t *testing.T) {
	for _, name := range []string{"sim", "seed-fib", "a", "0", "web-1", "-web", "web-", "Web", "we_b", "we.b", "", "a--b",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "ünï"} {
		want := len(validation.IsDNS1123Label(name)) == 0
		if got := checkDNSLabel(name) == nil; got != want {
			t.Errorf("%q: simulator accepts it %v, Kubernetes %v", name, got, want)
		}
	}
}

func TestExport_RejectsANamespaceThatIsNotAKubernetesName(t *testing.T) {
	code, _, errOut := runCommand(t, "--duration", "30s", "--warmup", "10s", "--export-metrics", t.TempDir()+"/m.txt", "--export-namespace", "Shop")
	if code != ExitUsageError || !strings.Contains(errOut, `--export-namespace "Shop" is not a Kubernetes name: want 1 to 63 lowercase letters`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}
