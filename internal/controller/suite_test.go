package controller

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/progress"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// The suite runs one real kube-apiserver and etcd (envtest), a kube-controller-manager beside
// them, and one operator manager for every test in the package; each test works in its own
// namespace.
var (
	k8s          client.Client // direct client, no cache: what a user's kubectl sees
	scheme       = runtime.NewScheme()
	testMetrics  *Metrics
	seWrites     atomic.Int64 // ServiceEntry writes the operator sent to the API server
	envSkipCause string
	testConfig   *rest.Config
	// operatorClient is the manager's cached client, with the operator's indexes.
	operatorClient client.Client
	// sharedVersions are the mirror's ServiceEntry versions; the weight cycles under test share them, as in the operator.
	sharedVersions = &ServiceEntryVersions{}
	// sharedMembership is the mirror's record of endpoint membership, shared the same way; a
	// weight-cycle test stamps it with its own fake clock.
	sharedMembership = NewMembership(nil)
	// propagationSamples collects exact propagation delays while a benchmark records them.
	propagationSamples = &delayRecorder{}
	// suiteReconciler is the operator's reconciler, for tests that call Reconcile directly.
	suiteReconciler *AdaptiveLoadBalancerReconciler
	// suiteEnv is the shared API server; controllerManager, the kube-controller-manager beside
	// it (garbage collector, EndpointSlice and namespace controllers), nil with kcmSkipCause set
	// when `make test` has not built one.
	suiteEnv          *envtest.Environment
	controllerManager *testtools.ControllerManager
	kcmSkipCause      string
	// suiteProgress tracks the suite operator's informers.
	suiteProgress *progress.Tracker
)

// seWriteCounter counts the operator's create/update/patch/delete calls on ServiceEntries at the
// HTTP layer, so "no write when nothing changed" is measured against the real API traffic.
type seWriteCounter struct{ next http.RoundTripper }

func (c seWriteCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	countServiceEntryRead(req)
	if req.Method != http.MethodGet && strings.Contains(req.URL.Path, "/serviceentries") {
		seWrites.Add(1)
		if resp := injectedFault(req); resp != nil {
			return resp, nil
		}
	}
	return c.next.RoundTrip(req)
}

// seReads counts the operator's uncached reads of ServiceEntries in one namespace, by verb
// ("list", "get", and "get <name>" per object): namespace → verb → *atomic.Int64. The informers watch every namespace, so
// what a namespace's path counts is the reconcilers' own.
var seReads sync.Map

func countServiceEntryRead(req *http.Request) {
	if req.Method != http.MethodGet || req.URL.Query().Get("watch") == "true" {
		return
	}
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	for i := 0; i+2 < len(parts); i++ {
		if parts[i] != "namespaces" || parts[i+2] != "serviceentries" {
			continue
		}
		verbs := []string{"list"}
		if i+3 < len(parts) {
			verbs = []string{"get", "get " + parts[i+3]}
		}
		counters, _ := seReads.LoadOrStore(parts[i+1], &sync.Map{})
		for _, verb := range verbs {
			n, _ := counters.(*sync.Map).LoadOrStore(verb, &atomic.Int64{})
			n.(*atomic.Int64).Add(1)
		}
		return
	}
}

// serviceEntryReads returns how many uncached ServiceEntry reads of verb the operator has made
// in namespace.
func serviceEntryReads(namespace, verb string) int64 {
	counters, ok := seReads.Load(namespace)
	if !ok {
		return 0
	}
	n, ok := counters.(*sync.Map).Load(verb)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

type delayRecorder struct {
	mu      sync.Mutex
	on      bool
	samples []time.Duration
}

func (d *delayRecorder) add(v time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.on {
		d.samples = append(d.samples, v)
	}
}

func (d *delayRecorder) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.on, d.samples = true, nil
}

func (d *delayRecorder) stop() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.on = false
	return d.samples
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	// The suite's log shows errors only; operatorLogs sees info lines too, while a test captures.
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel()),
		zap.RawZapOpts(uzap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, operatorLogs.core()) }))))
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		envSkipCause = "KUBEBUILDER_ASSETS is not set: run `make test`, which builds kube-apiserver and etcd"
		return m.Run()
	}
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, adlbv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	istioCRDs, err := testtools.IstioCRDPath()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases"), istioCRDs},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	// Every test creates Services with a ClusterIP (Build mirrors the Service's address); the
	// default /24 runs out when the suite runs with -count above 1.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.0.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start envtest: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	suiteEnv = env
	if stop, err := startControllerManager(env); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	} else if stop != nil {
		defer stop()
	}

	cfg.QPS, cfg.Burst = 1000, 2000 // the tests' own client must not be the bottleneck
	testConfig = cfg
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vmDir, err := os.MkdirTemp("", "adaptivelb-suite-vm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(vmDir) }()
	if suiteIstiod, err = startIstiodScrape(ctx, vmDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := startOperator(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// startControllerManager runs kube-controller-manager beside the suite's API server, as a real
// cluster has it. Without the binary the tests that need it skip (fail under CI).
func startControllerManager(env *envtest.Environment) (stop func(), err error) {
	bin := os.Getenv(testtools.ControllerManagerEnv)
	if bin == "" {
		kcmSkipCause = testtools.ControllerManagerEnv + " is not set: run `make test`, which builds kube-controller-manager"
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "adaptivelb-suite-")
	if err != nil {
		return nil, err
	}
	kubeconfig, err := testtools.AdminKubeconfig(env, "kube-controller-manager", dir)
	if err != nil {
		return nil, err
	}
	controllerManager, err = testtools.StartControllerManager(bin, kubeconfig, testtools.DefaultControllers)
	if err != nil {
		return nil, err
	}
	return func() {
		_ = controllerManager.Stop()
		_ = os.RemoveAll(dir)
	}, nil
}

// requireControllerManager skips a test that needs kube-controller-manager when it is not built;
// under CI that is a failure.
func requireControllerManager(t testing.TB) {
	t.Helper()
	requireEnv(t)
	if kcmSkipCause == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(kcmSkipCause)
	}
	t.Skip(kcmSkipCause)
}

func startOperator(ctx context.Context, cfg *rest.Config) error {
	opCfg := rest.CopyConfig(cfg)
	opCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return seWriteCounter{next: rt} }
	opCfg.QPS, opCfg.Burst = 200, 400 // the run command's defaults
	// The informers' progress is tracked as in the operator; the defaults never take a healthy
	// informer for a blind one (the API server sends every watch a bookmark each minute).
	suiteProgress = NewInformerProgress(progress.DefaultConfig())
	cacheOpts, err := WithProgress(CacheOptions(), opCfg, suiteProgress)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	testMetrics = NewMetrics(prometheus.NewRegistry())
	testMetrics.EnableEndpointWeights(prometheus.NewRegistry())
	operatorClient = mgr.GetClient()
	// The mirror's statuses go through a status queue, as in the operator.
	statuses := &StatusQueue{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}
	if err := mgr.Add(statuses); err != nil {
		return fmt.Errorf("add the status queue: %w", err)
	}
	r := &AdaptiveLoadBalancerReconciler{
		StatusQueue:   statuses,
		Versions:      sharedVersions,
		Membership:    sharedMembership,
		Client:        mgr.GetClient(),
		Scheme:        mgr.GetScheme(),
		Recorder:      mgr.GetEventRecorderFor("adaptive-lb"),
		Metrics:       testMetrics,
		ClusterDomain: "cluster.local",
		MaxEndpoints:  suiteMaxEndpoints,
		// Small slices, so that every test with more endpoints than this goes through slices.
		SliceEndpoints: suiteSlices(),

		StaleServiceEntryTimeout: suiteStaleTimeout,
		InstallID:                suiteInstallID,
		Progress:                 suiteProgress,
	}
	// The mesh's clusters are judged as a default install does, from istiod's own gauge in the
	// TSDB; without VictoriaMetrics the operator is told the mesh is one cluster.
	if suiteIstiod != nil {
		if r.RemoteClusters, err = suiteIstiod.probe(); err != nil {
			return err
		}
	} else {
		r.Mesh = DefaultMeshSource()
		r.Mesh.MultiCluster = istio.MultiClusterFalse
	}
	r.observePropagation = propagationSamples.add
	suiteReconciler = r
	if err := r.SetupWithManager(ctx, mgr, benchWorkers()); err != nil {
		return fmt.Errorf("set up reconciler: %w", err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "manager stopped: %v\n", err)
		}
	}()
	syncCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		return fmt.Errorf("operator caches did not sync")
	}
	return nil
}

// suiteMaxEndpoints is the endpoint limit of a Service in the suite: the 10,000 pods the issue
// asks to weight, so that TestMirror_TenThousandPodsGetWeightsInSlices passes it with one more.
const suiteMaxEndpoints = 10_000

// suiteSliceEndpoints is the most endpoints per ServiceEntry slice in the suite: a Service of
// 41 pods or more has several slices.
const suiteSliceEndpoints = 40

func zapLevel() zapLevelT {
	if os.Getenv("ADAPTIVELB_TEST_DEBUG") != "" {
		return -1
	}
	return 2 // errors only: the suite's log should show failures, not every reconcile
}

// requireEnv skips a test when the real API server is not available; under CI that is a failure.
func requireEnv(t testing.TB) {
	t.Helper()
	if envSkipCause == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(envSkipCause)
	}
	t.Skip(envSkipCause)
}

// suiteSlices is suiteSliceEndpoints, or ADAPTIVELB_BENCH_SLICE_ENDPOINTS for the slice
// benchmark (BenchmarkServiceEntrySlices_EndpointChange).
func suiteSlices() int {
	if n, err := strconv.Atoi(os.Getenv("ADAPTIVELB_BENCH_SLICE_ENDPOINTS")); err == nil && n > 0 {
		return n
	}
	return suiteSliceEndpoints
}

// benchWorkers is the operator's concurrent reconciles: the run command's default, or
// ADAPTIVELB_BENCH_WORKERS to explore the propagation benchmark.
func benchWorkers() int {
	if n, err := strconv.Atoi(os.Getenv("ADAPTIVELB_BENCH_WORKERS")); err == nil && n > 0 {
		return n
	}
	return 8
}
