package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
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
	// A cluster with adaptive-lb's CRD but no Istio.
	env, _ := startAPIServer(t, ownCRDPath)
	path := kubeconfigFile(t, env, "")
	code, _, errOut := runCLI(t, "run", "--kubeconfig", path, "--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	if code != exitFailure || !strings.Contains(errOut, "the ServiceEntry CRD (networking.istio.io/v1) is not installed: install Istio") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

func TestRun_WaitsForItsOwnCRDInsteadOfCrashing(t *testing.T) {
	// Istio is installed, adaptive-lb's CRD is not (yet).
	env, cfg := startAPIServer(t, istioCRDPath(t))
	path := kubeconfigFile(t, env, "")
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() {
		root := newRootCmd(io.Discard, io.Discard)
		root.SetArgs([]string{"run", "--kubeconfig", path, "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-level", "error"})
		exited <- root.ExecuteContext(ctx)
	}()
	defer func() { cancel(); <-exited }()
	// Install the CRD late; the operator, still running, picks it up and serves an object.
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{ownCRDPath}}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("the operator exited without its CRD: %v", err)
	default:
	}
	scheme, _ := operatorScheme()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	alb := &adlbv1.AdaptiveLoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: adlbv1.AdaptiveLoadBalancerSpec{TargetRef: adlbv1.TargetRef{Name: "web"}}}
	if err := c.Create(ctx, alb); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(alb), alb); err == nil && len(alb.Status.Conditions) > 0 {
			return // reconciled: TargetNotFound, since there is no Service
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the operator never reconciled after its CRD was installed")
}
