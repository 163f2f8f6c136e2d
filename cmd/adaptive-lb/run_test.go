package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func TestRun_RejectsBadFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"workers":        {[]string{"run", "--workers", "0"}, "--workers 0 must be between 1 and 64"},
		"cluster domain": {[]string{"run", "--cluster-domain", ".local"}, `--cluster-domain ".local" must be a domain`},
		"log level":      {[]string{"run", "--log-level", "loud"}, `--log-level "loud" must be debug, info or error`},
		"leader timings": {[]string{"run", "--leader-elect", "--leader-elect-lease-duration", "5s", "--leader-elect-renew-deadline", "10s"}, "lease duration > renew deadline > retry period"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code != exitUsageError || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d stderr %q; want exit 2 and %q", code, errOut, tc.want)
			}
		})
	}
}

func TestRun_WithoutIstioCRDsFailsWithWhatToInstall(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test`, which builds kube-apiserver and etcd")
	}
	// A cluster with adaptive-lb's CRD but no Istio.
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	if _, err := env.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "run", "--kubeconfig", path, "--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	if code != exitFailure || !strings.Contains(errOut, "the ServiceEntry CRD (networking.istio.io/v1) is not installed: install Istio") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}
