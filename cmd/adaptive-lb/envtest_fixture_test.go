package main

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// ownCRDPath is adaptive-lb's generated CRD directory.
var ownCRDPath = filepath.Join("..", "..", "config", "crd", "bases")

// istioCRDPath is Istio's CRD bundle inside the istio.io/api module pinned by go.mod.
func istioCRDPath(t testing.TB) string {
	t.Helper()
	path, err := testtools.IstioCRDPath()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// startAPIServer starts a real kube-apiserver and etcd with the given CRDs for the test's
// lifetime, or skips (fails under CI) when the binaries are not built.
func startAPIServer(t testing.TB, crdPaths ...string) (*envtest.Environment, *rest.Config) {
	t.Helper()
	return startAPIServerWith(t, nil, crdPaths...)
}

// startAPIServerWith is startAPIServer with extra kube-apiserver flags (name → value).
func startAPIServerWith(t testing.TB, flags map[string]string, crdPaths ...string) (*envtest.Environment, *rest.Config) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{CRDDirectoryPaths: crdPaths, ErrorIfCRDPathMissing: true}
	// A fixed certificate directory keeps the API server's certificates (and, with them, every
	// client's kubeconfig) valid across a stop and start of the API server alone.
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: t.TempDir()}
	for k, v := range flags {
		env.ControlPlane.APIServer.Configure().Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env, cfg
}

// kubeconfigFile writes a kubeconfig for an admin of env, acting as impersonate when it is set,
// and returns its path.
func kubeconfigFile(t testing.TB, env *envtest.Environment, impersonate string) string {
	t.Helper()
	return userKubeconfigFile(t, env, "admin", impersonate)
}

// userKubeconfigFile writes a kubeconfig for a cluster admin of env named name (the API server's
// audit log tells its requests apart by that name), acting as impersonate when it is set.
func userKubeconfigFile(t testing.TB, env *envtest.Environment, name, impersonate string) string {
	t.Helper()
	user, err := env.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range kc.AuthInfos {
		a.Impersonate = impersonate
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
