package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
		"workers":                                 {[]string{"run", "--workers", "0"}, "--workers 0 must be between 1 and 64"},
		"weight burst below the budget":           {[]string{"run", "--weight-api-burst", "10", "--write-budget", "50"}, "--weight-api-burst 10 must be at least --write-budget 50"},
		"cluster domain":                          {[]string{"run", "--cluster-domain", ".local"}, `--cluster-domain ".local" must be a domain`},
		"log level":                               {[]string{"run", "--log-level", "loud"}, `--log-level "loud" must be debug, info or error`},
		"watch namespaces":                        {[]string{"run", "--watch-namespaces", "shop,Bad_NS"}, `--watch-namespaces: "Bad_NS" is not a namespace name`},
		"leader timings":                          {[]string{"run", "--leader-elect", "--leader-elect-lease-duration", "5s", "--leader-elect-renew-deadline", "10s"}, "lease duration > renew deadline > retry period"},
		"latency offset":                          {[]string{"run", "--tsdb-url", "http://vm:8428", "--tsdb-latency-offset", "-30s"}, "--tsdb-latency-offset: latency offset -30s must not be negative"},
		"a check finer than a second":             {[]string{"run", "--fast-check-interval", "500ms"}, "--fast-check-interval 500ms must be 0s (off) or from 1s to below 10m0s"},
		"a check as long as the longest interval": {[]string{"run", "--fast-check-interval", "10m"}, "--fast-check-interval 10m0s must be 0s (off) or from 1s to below 10m0s"},
		"a check window shorter than a scrape":    {[]string{"run", "--fast-check-window", "10s"}, "--fast-check-window 10s must be from --tsdb-scrape-interval 15s"},
		"a scrape interval under a second":        {[]string{"run", "--tsdb-scrape-interval", "0s"}, "--tsdb-scrape-interval 0s must be at least 1s"},
		"a load history too short to learn from":  {[]string{"run", "--load-history", "30m"}, "--load-history 30m0s must be 0s (off) or from 1h"},
		"a load history beyond a month":           {[]string{"run", "--load-history", "1000h"}, "to 744h"},
		"a refresh under a minute":                {[]string{"run", "--load-history-refresh", "10s"}, "--load-history-refresh 10s must be at least 1m"},
		"a history template that does not render": {[]string{"run", "--tsdb-url", "http://vm:8428", "--tsdb-history-query", "sum(rate(x{ns=\"{{.Pod}}\"}[{{.Window}}]))"}, "load history query"},
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

// probeStatus returns the HTTP status of a probe endpoint, or 0 while nothing answers.
func probeStatus(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func waitForProbe(t *testing.T, addr, path string, want int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	got := 0
	for time.Now().Before(deadline) {
		if got = probeStatus(addr, path); got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s answered %d, want %d", path, got, want)
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestRun_WaitsForItsOwnCRDInsteadOfCrashing(t *testing.T) {
	// Istio is installed, adaptive-lb's CRD is not (yet).
	env, cfg := startAPIServer(t, istioCRDPath(t))
	path := kubeconfigFile(t, env, "")
	probeAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() {
		root := newRootCmd(io.Discard, io.Discard)
		root.SetArgs([]string{"run", "--kubeconfig", path, "--metrics-bind-address", "0", "--health-probe-bind-address", probeAddr, "--log-level", "error"})
		exited <- root.ExecuteContext(ctx)
	}()
	defer func() { cancel(); <-exited }()
	// While it waits, the pod is alive (the liveness probe must not restart it) and not ready.
	waitForProbe(t, probeAddr, "/healthz", http.StatusOK)
	if got := probeStatus(probeAddr, "/readyz"); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz answered %d without the CRD; want 503", got)
	}
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
			// Reconciled: TargetNotFound, since there is no Service. Ready now.
			waitForProbe(t, probeAddr, "/readyz", http.StatusOK)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the operator never reconciled after its CRD was installed")
}

// After a lost lease the process builds a new manager only once the old one's workers have
// returned. A drain that times out ends the process, also on a later loss while rejoining:
// building a manager beside a stuck reconcile runs two writers of the same ServiceEntries.
func TestRun_StuckWorkersEndTheProcessInsteadOfASecondManager(t *testing.T) {
	lost := errors.New("leader election lost")
	stuck := fmt.Errorf("%w within %v: %w", errWorkersStuck, maxWorkerDrain, context.DeadlineExceeded)
	for _, c := range []struct {
		name      string
		err       error
		rejoining bool
		want      managerStopped
	}{
		{"lease lost", lost, false, rejoinElection},
		{"lease lost again", lost, true, rejoinElection},
		{"rebuild failed while rejoining", errors.New("connection refused"), true, retryRejoin},
		{"error at the first start", errors.New("connection refused"), false, exitProcess},
		{"workers stuck", stuck, false, exitProcess},
		{"workers stuck while rejoining", stuck, true, exitProcess},
	} {
		if got := afterManagerStopped(c.err, c.rejoining); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A certificate directory without the certificate is refused at start, not replaced by a
// self-signed certificate the scraper cannot verify.
func TestRun_RefusesAMetricsCertDirWithoutTheCertificate(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := runCLI(t, "run", "--metrics-cert-dir", dir)
	if code != exitUsageError || !strings.Contains(errOut, "--metrics-cert-dir "+dir) || !strings.Contains(errOut, "tls.crt") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

// The check between cycles reads the newest data: where the TSDB answers a scrape or more in the
// past it would see a jump after the damage, so the default turns it off (and says why); an
// explicit --fast-check-interval runs it anyway.
func TestRunOptions_TheCheckBetweenCyclesIsOffByDefaultWhereTheTSDBAnswersInThePast(t *testing.T) {
	offset := func(d time.Duration) *time.Duration { return &d }
	for name, tc := range map[string]struct {
		offset  *time.Duration
		set     bool
		want    time.Duration
		why     string
		dataLag time.Duration
	}{
		"the newest data (0s)":             {offset: offset(0), want: 15 * time.Second, dataLag: 4 * time.Second},
		"an offset under a scrape":         {offset: offset(10 * time.Second), want: 15 * time.Second, dataLag: 10 * time.Second},
		"an offset of a scrape":            {offset: offset(15 * time.Second), want: 0, why: "--tsdb-latency-offset 15s reads data a scrape (15s) or more old", dataLag: 15 * time.Second},
		"none: VictoriaMetrics' 30s":       {offset: nil, want: 0, why: "--tsdb-latency-offset none reads data a scrape (15s) or more old", dataLag: 30 * time.Second},
		"none, with the interval set":      {offset: nil, set: true, want: 15 * time.Second, dataLag: 30 * time.Second},
		"set to 0s: off whatever the TSDB": {offset: offset(0), set: true, dataLag: 4 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			o := &runOptions{fastCheckInterval: 15 * time.Second, scrapeInterval: 15 * time.Second, fastCheckSet: tc.set}
			if tc.set && tc.want == 0 {
				o.fastCheckInterval = 0
			}
			o.sourceConfig.LatencyOffset = tc.offset
			got, why := o.fastCheck()
			if got != tc.want || why != tc.why {
				t.Fatalf("fastCheck() = %v, %q; want %v, %q", got, why, tc.want, tc.why)
			}
			if lag := o.dataLag(); lag != tc.dataLag {
				t.Fatalf("dataLag() = %v, want %v", lag, tc.dataLag)
			}
		})
	}
}
