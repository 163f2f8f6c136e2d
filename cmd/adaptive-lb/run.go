package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/progress"
	"github.com/adaptive-lb/adaptive-lb/internal/pushmodel"
)

// runOptions are the operator's flags; defaults are documented in docs/operations.md.
type runOptions struct {
	kubeconfig               string
	metricsAddr              string
	secureMetrics            bool
	metricsCertDir           string
	probeAddr                string
	pprofAddr                string
	leaderElect              bool
	leaderElectionNamespace  string
	leaderElectionID         string
	leaseDuration            time.Duration
	renewDeadline            time.Duration
	retryPeriod              time.Duration
	releaseOnCancel          bool
	clusterDomain            string
	workers                  int
	qps                      float32
	burst                    int
	weightQPS                float32
	weightBurst              int
	statusQPS                float32
	statusBurst              int
	logLevel                 string
	cycleTick                time.Duration
	writeBudget              int
	holdIntervals            int
	staleServiceEntryTimeout time.Duration
	cycleTimeout             time.Duration
	endpointWeightMetrics    bool
	allowQueryOverrides      bool
	watchNamespaces          []string
	mesh                     controller.MeshSource
	multiCluster             string
	logOutput                io.Writer // the command's stderr
	source                   *metricsSourceFlags
	sourceConfig             metrics.Config
	fastCheckInterval        time.Duration
	fastCheckWindow          time.Duration
	scrapeInterval           time.Duration
	loadHistory              time.Duration
	loadHistoryRefresh       time.Duration
	// fastCheckSet: --fast-check-interval was given, and stays even where the default would
	// turn the check off (a TSDB read in the past).
	fastCheckSet bool
}

func newRunCmd() *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the operator: mirror opted-in Services into weighted Istio ServiceEntries",
		Args:  cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			o.fastCheckSet = cmd.Flags().Changed("fast-check-interval")
			return o.validate()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil || ctx == context.Background() {
				ctx = ctrl.SetupSignalHandler()
			}
			o.logOutput = cmd.ErrOrStderr()
			return o.run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster config or $KUBECONFIG")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "address of the metrics endpoint; 0 disables it")
	f.BoolVar(&o.secureMetrics, "metrics-secure", true, "serve metrics over HTTPS, authenticated and authorized through the API server")
	f.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory holding tls.crt and tls.key for the HTTPS metrics endpoint, re-read when they change; empty: a self-signed certificate made at start, which no scraper can verify")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz probes")
	// Off by default: the profiles expose the process's memory (object names, labels) to anyone
	// who reaches the port, unauthenticated; bind it to loopback and port-forward to it.
	f.StringVar(&o.pprofAddr, "pprof-bind-address", "0", "address of Go's /debug/pprof/ profiles (heap, CPU, goroutines), unauthenticated; 0 disables it; bind to loopback, e.g. 127.0.0.1:6060, and reach it with kubectl port-forward")
	f.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader so that only one replica writes; standbys keep warm caches")
	f.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's own)")
	f.StringVar(&o.leaderElectionID, "leader-election-id", "adaptive-lb.adaptivelb.io", "name of the leader Lease")
	f.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a crashed leader's lease blocks the standby")
	f.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader retries renewing before it steps down")
	f.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often candidates try to acquire the lease")
	f.BoolVar(&o.releaseOnCancel, "leader-elect-release-on-cancel", true, "release the lease on a graceful stop so the standby takes over at once")
	f.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain, used in ServiceEntry hosts")
	f.IntVar(&o.workers, "workers", 8, "concurrent reconciles")
	// Three client-side budgets, so that the endpoint mirror's ServiceEntry writes never queue
	// behind the weight cycle's or behind status writes: sized for 200 endpoint changes per
	// second; a cycle's burst of weight writes (the write budget, 50 objects); and the statuses
	// of 200 AdaptiveLoadBalancers due in one tick, written within seconds.
	f.Float32Var(&o.qps, "kube-api-qps", 200, "client-side rate limit toward the API server of the endpoint mirror and everything else not below (requests per second)")
	f.IntVar(&o.burst, "kube-api-burst", 400, "client-side burst of the endpoint mirror and everything else not below")
	f.Float32Var(&o.weightQPS, "weight-api-qps", 100, "client-side rate limit of the weight cycle's and the checks' ServiceEntry weight writes (requests per second), apart from the mirror's")
	f.IntVar(&o.weightBurst, "weight-api-burst", 100, "client-side burst of the weight writes; at least --write-budget, so that a cycle's writes go out in one burst istiod merges into one push")
	f.Float32Var(&o.statusQPS, "status-api-qps", 50, "client-side rate limit of the AdaptiveLoadBalancer status writes (requests per second), apart from the ServiceEntry writes")
	f.IntVar(&o.statusBurst, "status-api-burst", 100, "client-side burst of the status writes")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info or error")
	f.DurationVar(&o.cycleTick, "cycle-tick", 5*time.Second, "the weight cycle's tick; each AdaptiveLoadBalancer's interval is rounded up to a multiple of it")
	f.IntVar(&o.writeBudget, "write-budget", 50, "most ServiceEntry objects the weight writes of one cycle patch across the cluster (0: unlimited): a Service in one ServiceEntry spends 1, one split into 100 slices up to 100 (written alone when it is first in line); the rest carry over")
	f.DurationVar(&o.staleServiceEntryTimeout, "stale-serviceentry-timeout", controller.DefaultStaleServiceEntryTimeout, "how long mirroring a Service may keep failing (its ServiceEntry write refused, or an informer it reads no longer following the cluster: a list or watch refused or failing, or silent for 3m) before its ServiceEntry, which no longer follows the endpoints, is deleted so that clients use the Kubernetes endpoints; re-created once a mirror succeeds")
	f.IntVar(&o.holdIntervals, "hold-intervals", 5, "intervals the last weights survive a metrics outage before they return to equal")
	f.DurationVar(&o.cycleTimeout, "cycle-timeout", controller.DefaultCycleTimeout, "how long one weight cycle may take (reading the cluster, the metrics fetch and the burst of writes); writes it leaves out go to the next cycle, and every Service's status is still written")
	f.BoolVar(&o.endpointWeightMetrics, "endpoint-weight-metrics", true, "export adaptivelb_endpoint_weight, one series per endpoint; turn off on the largest clusters")
	f.StringSliceVar(&o.watchNamespaces, "watch-namespaces", nil, "namespaces to watch and write, comma-separated (default: all); with it the operator needs Roles in those namespaces and read access to nodes only, not a ClusterRole over everything")
	f.StringVar(&o.mesh.IstioNamespace, "istio-namespace", "istio-system", "istiod's namespace, where its ConfigMap and Deployments are read (mesh config, mesh networks, version) and its pods' metrics found in the TSDB")
	f.StringVar(&o.mesh.MeshConfigMap, "istio-mesh-configmap", "istio", "istiod's ConfigMap in --istio-namespace, whose mesh and meshNetworks keys are read (istio-<revision> for a revisioned istiod)")
	f.StringVar(&o.multiCluster, "mesh-multi-cluster", string(istio.MultiClusterAuto), "whether the mesh spans several clusters, which adaptive-lb refuses: auto judges from istiod's own count of its remote clusters in the TSDB (istiod_managed_clusters) and its meshNetworks, and refuses every Service while the TSDB cannot say (no --tsdb-url, istiod not scraped); false: the mesh is this cluster alone (a meshNetworks of several registries still refuses); true: refuse every Service")
	f.StringVar(&o.mesh.IstioVersion, "istio-version", "", "istiod's version, such as 1.29.2, when its Deployment carries no app.kubernetes.io/version label (Istio before 1.24, or istiod outside the cluster); Services in ambient mode need it")
	f.BoolVar(&o.allowQueryOverrides, "allow-query-overrides", false, "let AdaptiveLoadBalancers replace the PromQL queries (spec.metrics.queries); they run with the operator's TSDB credentials, so only allow it where every namespace that may create an AdaptiveLoadBalancer may read every series")
	// Optional: the mirror alone needs no TSDB; the weight cycle runs only with one.
	o.source = addMetricsSourceFlags(f, "tsdb-", "(optional: without it endpoints are mirrored with equal weights and no weight cycle runs)")
	f.BoolVar(&o.source.latencyHistogram, "tsdb-latency-histogram", true, "fetch each pod's latency histogram for the tail algorithm: one more query per cycle, about 20 series per pod (see docs/metrics.md); false: tail assumes a default request-size variability")
	f.DurationVar(&o.scrapeInterval, "tsdb-scrape-interval", 15*time.Second, "how often the TSDB scrapes the pods' sidecars: the step of the load history's short rates, and the shortest --fast-check-window")
	f.StringVar(&o.source.historyQuery, "tsdb-history-query", "", "Go template replacing the load history query, a Service's summed request rate over its past (.Namespace, .Service, .Window, .Function; see docs/metrics.md)")
	f.DurationVar(&o.fastCheckInterval, "fast-check-interval", 15*time.Second, "how often, between two weight cycles, every pod's newest signals are read and a pod whose latency or CPU jumped since the last cycle has its weight cut at once (capacity and tail); 0 turns the check off, as does the default when --tsdb-latency-offset reads data a scrape or more old")
	f.DurationVar(&o.fastCheckWindow, "fast-check-window", controller.DefaultFastCheckWindow, "the window of the check between cycles' rates: at least --tsdb-scrape-interval, two scrapes to hold two samples on every TSDB")
	f.DurationVar(&o.loadHistory, "load-history", 72*time.Hour, "how much of each tail Service's request rate history is read to learn its surge bound (how far its load has risen within the loop's reaction time); 0 turns learning off: every Service plans with the default bound")
	f.DurationVar(&o.loadHistoryRefresh, "load-history-refresh", time.Hour, "how often each Service's load history is read again (and whenever its spec changes)")
	return cmd
}

func (o *runOptions) validate() error {
	if o.workers < 1 || o.workers > 64 {
		return newUsageError("--workers %d must be between 1 and 64", o.workers)
	}
	if o.clusterDomain == "" || strings.HasPrefix(o.clusterDomain, ".") || strings.HasSuffix(o.clusterDomain, ".") {
		return newUsageError("--cluster-domain %q must be a domain such as cluster.local", o.clusterDomain)
	}
	if o.qps <= 0 || o.burst < 1 || o.weightQPS <= 0 || o.weightBurst < 1 || o.statusQPS <= 0 || o.statusBurst < 1 {
		return newUsageError("--kube-api-qps, --weight-api-qps, --status-api-qps and their bursts must be positive")
	}
	if o.writeBudget > 0 && o.weightBurst < o.writeBudget {
		return newUsageError("--weight-api-burst %d must be at least --write-budget %d: a cycle's weight writes go out in one burst, which istiod merges into one push", o.weightBurst, o.writeBudget)
	}
	if o.leaderElect && !(o.leaseDuration > o.renewDeadline && o.renewDeadline > o.retryPeriod && o.retryPeriod > 0) {
		return newUsageError("leader election needs lease duration > renew deadline > retry period > 0 (got %v, %v, %v)", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	if o.staleServiceEntryTimeout < 10*time.Second {
		return newUsageError("--stale-serviceentry-timeout %v must be at least 10s: shorter, an API server hiccup or a leader change would delete ServiceEntries", o.staleServiceEntryTimeout)
	}
	if o.cycleTick < time.Second || o.writeBudget < 0 || o.holdIntervals < 1 {
		return newUsageError("--cycle-tick must be at least 1s, --write-budget at least 0 and --hold-intervals at least 1")
	}
	if o.cycleTimeout < o.cycleTick {
		return newUsageError("--cycle-timeout %v must be at least --cycle-tick %v: shorter, a cycle could never finish its writes", o.cycleTimeout, o.cycleTick)
	}
	if o.source.url != "" {
		cfg, err := o.source.config()
		if err != nil {
			return err
		}
		o.sourceConfig = cfg
	}
	if err := o.validateLoop(); err != nil {
		return err
	}
	if err := checkLogLevel(o.logLevel); err != nil {
		return err
	}
	if o.metricsCertDir != "" {
		// controller-runtime would fall back to a self-signed certificate without a word.
		for _, name := range []string{"tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(o.metricsCertDir, name)); err != nil {
				return newUsageError("--metrics-cert-dir %s: %v; mount a kubernetes.io/tls Secret there (tls.crt and tls.key)", o.metricsCertDir, err)
			}
		}
	}
	for _, ns := range o.watchNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return newUsageError("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Label(o.mesh.IstioNamespace); len(errs) > 0 {
		return newUsageError("--istio-namespace: %q is not a namespace name: %s", o.mesh.IstioNamespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(o.mesh.MeshConfigMap); len(errs) > 0 {
		return newUsageError("--istio-mesh-configmap: %q is not a ConfigMap name: %s", o.mesh.MeshConfigMap, strings.Join(errs, "; "))
	}
	if _, ok := istio.ParseVersion(o.mesh.IstioVersion); o.mesh.IstioVersion != "" && !ok {
		return newUsageError("--istio-version %q must be an Istio release such as 1.29.2", o.mesh.IstioVersion)
	}
	mode, err := istio.ParseMultiClusterMode(o.multiCluster)
	if err != nil {
		return newUsageError("--mesh-multi-cluster: %v", err)
	}
	o.mesh.MultiCluster = mode
	return nil
}

// maxInterval is the longest spec.interval the CRD admits: a check between cycles at least that
// long would never fall between two.
const maxInterval = 10 * time.Minute

// validateLoop checks the flags of the check between cycles and of the load history.
func (o *runOptions) validateLoop() error {
	if o.scrapeInterval < time.Second {
		return newUsageError("--tsdb-scrape-interval %v must be at least 1s: the TSDB's scrape interval of the sidecars (15s in Istio's sample Prometheus)", o.scrapeInterval)
	}
	if fc := o.fastCheckInterval; fc != 0 && (fc < time.Second || fc >= maxInterval) {
		return newUsageError("--fast-check-interval %v must be 0s (off) or from 1s to below %v, the longest interval: a Service is checked when its interval is longer than this", fc, maxInterval)
	}
	if fw := o.fastCheckWindow; fw < o.scrapeInterval || fw > 2*maxInterval {
		return newUsageError("--fast-check-window %v must be from --tsdb-scrape-interval %v (a shorter window holds no new sample) to %v", fw, o.scrapeInterval, 2*maxInterval)
	}
	if h := o.loadHistory; h != 0 && (h < time.Hour || h > 31*24*time.Hour) {
		return newUsageError("--load-history %v must be 0s (off) or from 1h (less holds too few rises to learn from) to 744h (a month, VictoriaMetrics' default retention; each day costs about 8,600 points per Service and read)", h)
	}
	if o.loadHistoryRefresh < time.Minute {
		return newUsageError("--load-history-refresh %v must be at least 1m: each refresh costs every tail Service two range queries", o.loadHistoryRefresh)
	}
	return nil
}

// fastCheck is the check between cycles' interval in force: off by default when the TSDB answers
// with data a scrape or more old (--tsdb-latency-offset none, or at least the scrape interval),
// where a jump is seen after the damage and every check would read the same data again.
func (o *runOptions) fastCheck() (time.Duration, string) {
	if o.fastCheckSet {
		return o.fastCheckInterval, ""
	}
	if off := o.sourceConfig.LatencyOffset; off == nil || *off >= o.scrapeInterval {
		return 0, fmt.Sprintf("--tsdb-latency-offset %s reads data a scrape (%v) or more old", metrics.FormatLatencyOffset(off), o.scrapeInterval)
	}
	return o.fastCheckInterval, ""
}

// dataLag is how old the newest data the cycle reads is: the latency offset it asks for (30s,
// VictoriaMetrics' default, when it sends none), or the delay from a scrape to its visibility
// (about 4s: vmagent's flush and VictoriaMetrics' ingestion, docs/benchmarks.md) when longer.
func (o *runOptions) dataLag() time.Duration {
	const ingestion, defaultOffset = 4 * time.Second, 30 * time.Second
	if off := o.sourceConfig.LatencyOffset; off != nil {
		return max(*off, ingestion)
	}
	return defaultOffset
}

func (o *runOptions) restConfig() (*rest.Config, error) {
	cfg, err := restConfigFrom(o.kubeconfig, "adaptive-lb/"+version)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	return cfg, nil
}

// Scheme holds every type the operator reads or writes.
func operatorScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, adlbv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// errIstioCRDsMissing is fatal: without ServiceEntry the operator has nothing to write.
var errIstioCRDsMissing = errors.New("the ServiceEntry CRD (networking.istio.io/v1) is not installed: install Istio (1.22.1 or newer) or at least its CRDs, e.g. `istioctl install` or the istio/base Helm chart, then restart adaptive-lb")

func (o *runOptions) run(ctx context.Context) error {
	base := installLogger(o.logOutput, logLevels[o.logLevel])
	// The manager, its controllers and the weight cycle log through base (the manager's Logger
	// option and the context), not through the process-wide default, which only the first call
	// of SetLogger sets.
	ctx = log.IntoContext(ctx, base)
	logger := base.WithName("run")
	if soft := setMemoryLimitFromCgroup(cgroupMemoryMax); soft > 0 {
		logger.Info("Go memory limit set from the container's", "bytes", soft)
	}
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	scheme, err := operatorScheme()
	if err != nil {
		return err
	}
	// What outlives one manager: the operator's own metrics and the metrics source.
	shared := sharedParts{metrics: controller.DefaultMetrics(), statusMetrics: controller.NewStatusQueueMetrics(ctrlmetrics.Registry)}
	if o.endpointWeightMetrics {
		shared.metrics.EnableEndpointWeights(ctrlmetrics.Registry)
	}
	if o.source.url != "" {
		if shared.source, err = metrics.New(o.sourceConfig, ctrlmetrics.Registry); err != nil {
			return err
		}
		shared.cycle = controller.NewCycleMetrics(ctrlmetrics.Registry)
	}
	// One leader identity for the process: a manager rebuilt after a lost lease (typically an
	// API server outage) finds the lease still naming it and takes it back at once, instead of
	// waiting out its own previous lease as a stranger (15 s by default).
	if o.leaderElect {
		if shared.leaderLock, err = o.leaderLock(cfg); err != nil {
			return err
		}
	}
	// Without leader election too, when the Lease's namespace is known (in a pod it is): the
	// label keeps another installation's watchdog off this one's ServiceEntries, and the
	// heartbeat tells that watchdog whether the operator still sees the cluster.
	if namespace, err := leaseNamespace(o.leaderElectionNamespace); err == nil {
		shared.installID = controller.InstallID(namespace, o.leaderElectionID)
		shared.heartbeat = types.NamespacedName{Namespace: namespace, Name: controller.HeartbeatLeaseName(o.leaderElectionID)}
		shared.identity = processIdentity()
		if shared.leaderLock != nil {
			shared.identity = shared.leaderLock.Identity()
		}
	} else {
		logger.Info("ServiceEntries carry no installation label: the leader Lease's namespace is unknown outside a pod without --leader-election-namespace; every installation's fail-open watchdog treats them as written by an older version", "error", err.Error())
	}
	// The probes are served by the process, not by each manager: they answer while the
	// operator waits for its CRD and while a manager is rebuilt, so the liveness probe does not
	// restart a pod that is only waiting.
	shared.probes = &probes{}
	if o.probeAddr != "0" && o.probeAddr != "" {
		stopProbes, err := shared.probes.serve(o.probeAddr, logger)
		if err != nil {
			return err
		}
		defer stopProbes()
	}
	logger.Info("starting adaptive-lb", "version", version, "leaderElection", o.leaderElect, "clusterDomain", o.clusterDomain)
	rejoining := false
	wait := o.retryPeriod
	for {
		err := o.runManager(ctx, cfg, scheme, shared, base, logger)
		if ctx.Err() != nil {
			return err
		}
		switch afterManagerStopped(err, rejoining) {
		case rejoinElection:
			// The lease could not be renewed in time, typically because the API server was
			// unreachable for longer than the renew deadline; another replica may lead now.
			// Stepping down is controller-runtime's job; restarting the process is not: a
			// fresh manager rejoins the election as a standby and rebuilds its caches.
			logger.Error(err, "lost the leader lease; rejoining the election as a standby without restarting")
			rejoining, wait = true, o.retryPeriod
		case retryRejoin:
			// Rebuilding needs the API server, which may still be down: keep trying. That
			// includes a missing ServiceEntry CRD: a restarted API server serves discovery for
			// CRDs only once it has loaded them, so for a moment Istio's CRDs look absent.
			logger.Error(err, "cannot rejoin yet; retrying", "in", wait)
			wait = min(2*wait, maxRejoinWait)
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// managerStopped is what the process does once a manager has returned.
type managerStopped int

const (
	exitProcess    managerStopped = iota
	rejoinElection                // the lease was lost: build a new manager as a standby
	retryRejoin                   // rebuilding after a lost lease failed: try again
)

// afterManagerStopped decides, from the error a manager returned and whether the process is
// rejoining after a lost lease, whether to build another manager.
func afterManagerStopped(err error, rejoining bool) managerStopped {
	switch {
	case errors.Is(err, errWorkersStuck):
		// Never build a manager beside workers that still run, also while rejoining: two
		// writers would undo each other. Exiting lets Kubernetes restart the process.
		return exitProcess
	case isLeadershipLost(err):
		return rejoinElection
	case rejoining && err != nil:
		return retryRejoin
	default:
		return exitProcess
	}
}

// maxRejoinWait caps the back-off between attempts to rebuild the manager after a lost lease.
const maxRejoinWait = 10 * time.Second

// sharedParts are built once per process and handed to every manager the process runs.
type sharedParts struct {
	metrics *controller.Metrics
	source  metrics.Source           // nil without --tsdb-url
	cycle   *controller.CycleMetrics // nil without --tsdb-url
	// statusMetrics are the status queue's.
	statusMetrics *controller.StatusQueueMetrics
	leaderLock    resourcelock.Interface // nil without --leader-elect
	// installID names this installation on its ServiceEntries (controller.InstallLabel): its
	// leader Lease, which the fail-open watchdog also reads ("" when its namespace is unknown).
	installID string
	// heartbeat is the Lease the leader renews while its informers see the cluster (empty when
	// the namespace is unknown); identity names this process in it.
	heartbeat types.NamespacedName
	identity  string
	probes    *probes
}

// isLeadershipLost recognises the error controller-runtime's manager returns when its leader
// lease expired while it was still running (it has no typed error for it;
// TestRun_ResumesAfterTheAPIServerWasDown fails if the text changes).
func isLeadershipLost(err error) bool {
	return err != nil && strings.Contains(err.Error(), "leader election lost")
}

// runManager builds one controller manager with the mirror and the weight cycle and runs it
// until ctx ends or it stops on its own (for example after losing the leader lease).
func (o *runOptions) runManager(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, shared sharedParts, base, logger logr.Logger) error {
	metricsOpts := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.secureMetrics, CertDir: o.metricsCertDir}
	if o.secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	// Checked before the manager exists: its cache options name ServiceEntry, and without the
	// CRD the manager would fail with a less helpful message. The manager then uses the same
	// mapper, so the API server's discovery is read once.
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("build the Kubernetes HTTP client: %w", err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return fmt.Errorf("build the Kubernetes REST mapper: %w", err)
	}
	if err := requireServiceEntryCRD(mapper); err != nil {
		return err
	}
	shared.probes.setReady(func(*http.Request) error {
		return errors.New("waiting for the AdaptiveLoadBalancer CRD")
	})
	sweep := func(ctx context.Context) (int, error) {
		c, err := client.New(cfg, client.Options{Scheme: scheme, HTTPClient: httpClient, Mapper: mapper})
		if err != nil {
			return 0, err
		}
		return deleteInstallationServiceEntries(ctx, c, shared.installID, o.watchNamespaces, nil)
	}
	if err := waitForOwnCRD(ctx, mapper, logger, ownCRDGoneAfter, sweep); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	// The informers' own HTTP client goes through a progress tracker: a frozen informer (its list
	// or watch refused, or silent) stops the mirror and the heartbeat. One per manager: a rebuilt
	// manager's informers start afresh.
	tracker := controller.NewInformerProgress(progress.DefaultConfig())
	cacheOpts, err := controller.WithProgress(controller.CacheOptionsFor(o.mesh, o.watchNamespaces...), cfg, tracker)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                              scheme,
		Logger:                              base,
		MapperProvider:                      func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mapper, nil },
		Cache:                               cacheOpts,
		Metrics:                             metricsOpts,
		HealthProbeBindAddress:              "0", // served by the process: see sharedParts.probes
		PprofBindAddress:                    o.pprofAddr,
		LeaderElection:                      o.leaderElect,
		LeaderElectionResourceLockInterface: shared.leaderLock,
		LeaderElectionID:                    o.leaderElectionID,
		LeaderElectionNamespace:             o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel:       o.releaseOnCancel,
		LeaseDuration:                       &o.leaseDuration,
		RenewDeadline:                       &o.renewDeadline,
		RetryPeriod:                         &o.retryPeriod,
		// One manager at a time per process in production; the failover tests run several
		// replicas in one test process, and a manager rebuilt after a lost lease registers the
		// same controller names again: the name check would refuse both.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("create the controller manager: %w", err)
	}
	// Membership first: the mirror writes through the manager's client; the weight writes and
	// the status writes each through a client of its own, with its own client-side budget, so
	// that neither ever queues the mirror's ServiceEntry writes behind it. The chart's
	// FlowSchemas do the same on the API server (API Priority and Fairness).
	weightClient, err := budgetedClient(cfg, mgr, "weights", o.weightQPS, o.weightBurst)
	if err != nil {
		return err
	}
	statusClient, err := budgetedClient(cfg, mgr, "status", o.statusQPS, o.statusBurst)
	if err != nil {
		return err
	}
	versions := &controller.ServiceEntryVersions{}
	activity := &controller.Activity{}
	// The mirror's and the weight path's statuses, written off both paths, after what they report.
	statuses := &controller.StatusQueue{Client: statusClient, Reader: mgr.GetAPIReader(), Metrics: shared.statusMetrics, Activity: activity}
	if err := mgr.Add(statuses); err != nil {
		return fmt.Errorf("add the status queue: %w", err)
	}
	membership := controller.NewMembership(clock.RealClock{})
	r := &controller.AdaptiveLoadBalancerReconciler{
		Activity:      activity,
		Versions:      versions,
		Membership:    membership,
		Client:        mgr.GetClient(),
		StatusQueue:   statuses,
		Scheme:        mgr.GetScheme(),
		Recorder:      mgr.GetEventRecorderFor("adaptive-lb"),
		Metrics:       shared.metrics,
		ClusterDomain: o.clusterDomain,
		Mesh:          o.mesh,

		StaleServiceEntryTimeout: o.staleServiceEntryTimeout,
		InstallID:                shared.installID,
		Progress:                 tracker,
	}
	if counter, ok := shared.source.(metrics.RemoteClusterCounter); ok && o.mesh.MultiCluster == istio.MultiClusterAuto {
		// One per manager: a rebuilt manager reads afresh, a standby keeps it current.
		r.RemoteClusters = &controller.RemoteClusterProbe{Source: counter, Namespace: o.mesh.IstioNamespace, Logger: base.WithName("remote-clusters")}
	}
	if err := r.SetupWithManager(ctx, mgr, o.workers); err != nil {
		return fmt.Errorf("set up the AdaptiveLoadBalancer controller: %w", err)
	}
	if shared.heartbeat.Name != "" {
		if err := mgr.Add(&controller.Heartbeat{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Lease: shared.heartbeat, Identity: shared.identity,
			Interval: controller.DefaultHeartbeatInterval, Progress: tracker, Logger: base.WithName("heartbeat"),
		}); err != nil {
			return fmt.Errorf("add the heartbeat: %w", err)
		}
	}
	if shared.source == nil {
		logger.Info("no --tsdb-url: endpoints are mirrored with equal weights and no weight cycle runs")
		if o.mesh.MultiCluster == istio.MultiClusterAuto {
			logger.Error(nil, "no --tsdb-url and --mesh-multi-cluster=auto: istiod's count of its remote clusters cannot be read, so the operator cannot tell a mesh of one cluster and refuses every Service (MultiCluster); set --mesh-multi-cluster=false if the mesh is this cluster alone")
		}
	} else {
		// DestinationRules are watched from here on, through an informer nothing waits for: where
		// they cannot be read, weights are planned without their warm-ups.
		warmups, err := controller.NewWarmupSource(cfg, scheme, mapper, o.watchNamespaces...)
		if err != nil {
			return err
		}
		if err := mgr.Add(warmups); err != nil {
			return fmt.Errorf("add the DestinationRule informer: %w", err)
		}
		fastCheck, why := o.fastCheck()
		if why != "" {
			logger.Info("the check between cycles is off: "+why+"; set --fast-check-interval to run it anyway", "tsdbScrapeInterval", o.scrapeInterval.String())
		}
		loop := &controller.WeightCycle{
			Client: weightClient, APIReader: mgr.GetAPIReader(), Source: shared.source, Recorder: mgr.GetEventRecorderFor("adaptive-lb"), Status: statuses,
			Clock: clock.RealClock{}, Metrics: shared.metrics, Cycle: shared.cycle,
			Tick: o.cycleTick, Budget: o.writeBudget, HoldIntervals: o.holdIntervals, Debounce: pushmodel.DefaultConfig(),
			Versions: versions, Membership: membership, Activity: activity, AllowQueryOverrides: o.allowQueryOverrides,
			Warmups: warmups, Timeout: o.cycleTimeout,
			FastCheckInterval: fastCheck, FastCheckWindow: o.fastCheckWindow,
		}
		if history, ok := shared.source.(metrics.HistorySource); ok && o.loadHistory > 0 {
			loop.History = &controller.LoadHistories{Source: history, Clock: clock.RealClock{}, Span: o.loadHistory, Refresh: o.loadHistoryRefresh,
				ScrapeInterval: o.scrapeInterval, DataLag: o.dataLag()}
			if err := mgr.Add(loop.History); err != nil {
				return fmt.Errorf("add the load history reader: %w", err)
			}
		}
		if err := mgr.Add(loop); err != nil {
			return fmt.Errorf("add the weight cycle: %w", err)
		}
	}
	shared.probes.setReady(func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("informer caches not synced")
		}
		return nil
	})
	startErr := mgr.Start(ctx)
	shared.probes.setReady(func(*http.Request) error { return errors.New("the controller manager is restarting") })
	// After a lost lease the manager returns without waiting for its workers; the next one
	// must not start while an old reconcile or weight cycle can still write. Their context is
	// cancelled, so they return promptly.
	waitCtx, cancel := context.WithTimeout(context.Background(), maxWorkerDrain)
	defer cancel()
	if err := activity.CloseAndWait(waitCtx); err != nil {
		return fmt.Errorf("%w within %v: %w", errWorkersStuck, maxWorkerDrain, err)
	}
	if startErr != nil {
		return fmt.Errorf("operator stopped: %w", startErr)
	}
	return nil
}

// budgetedClient is a client that reads from mgr's cache and writes to the API server under a
// client-side rate limit of its own (one token bucket for every resource it writes, where a
// client built from cfg alone would have one per resource), over its own connection, identified
// as purpose in its user agent, which the API server's audit log records.
func budgetedClient(cfg *rest.Config, mgr ctrl.Manager, purpose string, qps float32, burst int) (client.Client, error) {
	c := rest.CopyConfig(cfg)
	c.UserAgent = strings.TrimSpace(cfg.UserAgent + " (" + purpose + ")")
	c.QPS, c.Burst = qps, burst
	c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	// Its own HTTP client: the user agent is the transport's, and its own connection keeps its
	// requests off the HTTP/2 stream limit of the mirror's.
	httpClient, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("build the %s HTTP client: %w", purpose, err)
	}
	cl, err := client.New(c, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), HTTPClient: httpClient,
		Cache: &client.CacheOptions{Reader: mgr.GetCache()}})
	if err != nil {
		return nil, fmt.Errorf("build the %s client: %w", purpose, err)
	}
	return cl, nil
}

// errWorkersStuck: a stopped manager's reconciles or weight cycle did not return.
var errWorkersStuck = errors.New("the stopped manager's reconciles did not return")

// maxWorkerDrain bounds the wait for a stopped manager's reconciles and weight cycle. Past it
// the process exits with an error (and Kubernetes restarts it) rather than run two writers.
const maxWorkerDrain = time.Minute

// leaderLock builds the leader Lease lock once per process, with one identity for every
// manager the process runs.
func (o *runOptions) leaderLock(cfg *rest.Config) (resourcelock.Interface, error) {
	namespace, err := leaseNamespace(o.leaderElectionNamespace)
	if err != nil {
		return nil, err
	}
	lockCfg := rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// A hung request must not cost the lease: bound each below the renew deadline, as
	// controller-runtime does for its own lock.
	lockCfg.Timeout = max(o.renewDeadline/2, time.Second)
	coordination, err := coordinationv1client.NewForConfig(lockCfg)
	if err != nil {
		return nil, fmt.Errorf("build the leader election client: %w", err)
	}
	return &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: o.leaderElectionID},
		Client:     coordination,
		LockConfig: resourcelock.ResourceLockConfig{Identity: processIdentity()},
	}, nil
}

// processIdentity names this process in the leader and heartbeat Leases: its host name (the
// pod's) and a random suffix.
func processIdentity() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + "_" + string(uuid.NewUUID())
}

// probes answers /healthz (the process is alive) and /readyz (the current manager's caches are
// synced) for the whole process, across manager rebuilds and the wait for the CRD.
type probes struct {
	mu    sync.Mutex
	ready func(*http.Request) error
}

func (p *probes) setReady(check func(*http.Request) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = check
}

func (p *probes) readyz(w http.ResponseWriter, req *http.Request) {
	p.mu.Lock()
	check := p.ready
	p.mu.Unlock()
	if check == nil {
		check = func(*http.Request) error { return errors.New("starting") }
	}
	if err := check(req); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// serve listens on addr and returns a function that stops the server.
func (p *probes) serve(addr string, logger logr.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for health probes on %s (--health-probe-bind-address): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/readyz", p.readyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "health probe server stopped")
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// ownCRDGoneAfter is how long the AdaptiveLoadBalancer CRD must stay missing before the operator
// deletes its installation's ServiceEntries: a restarted API server serves discovery for CRDs
// only once it has loaded them, which takes seconds, not a minute.
const ownCRDGoneAfter = time.Minute

// waitForOwnCRD waits, logging what to do, while the AdaptiveLoadBalancer CRD is missing (an
// install applied in the wrong order, or the CRD deleted): crash-looping would not install it any
// sooner. The probes are served meanwhile: alive, not ready. Once it has been missing for
// goneAfter, it calls sweep, once: without the CRD no AdaptiveLoadBalancer exists, so every
// ServiceEntry the installation wrote is an orphan that nothing would update again (the garbage
// collector deletes them with the AdaptiveLoadBalancers when it runs and knows their kind; this
// covers an operator that was down at the time, with the collector behind or absent).
func waitForOwnCRD(ctx context.Context, mapper meta.RESTMapper, logger logr.Logger, goneAfter time.Duration, sweep func(context.Context) (int, error)) error {
	gk := schema.GroupKind{Group: adlbv1.GroupVersion.Group, Kind: "AdaptiveLoadBalancer"}
	missingSince := time.Now()
	swept := false
	for {
		_, err := mapper.RESTMapping(gk, adlbv1.GroupVersion.Version)
		if err == nil {
			return nil
		}
		if !meta.IsNoMatchError(err) {
			return fmt.Errorf("look up the AdaptiveLoadBalancer API: %w", err)
		}
		logger.Error(err, "the AdaptiveLoadBalancer CRD is not installed; apply charts/adaptive-lb/crds/ (or config/crd/bases/). Waiting for it.")
		if !swept && time.Since(missingSince) >= goneAfter {
			swept = true
			n, err := sweep(ctx)
			if err != nil {
				swept = false // retried at the next check
				logger.Error(err, "cannot delete the ServiceEntries left without their CRD; retrying")
			} else {
				logger.Info("the AdaptiveLoadBalancer CRD has been missing for a while: deleted this installation's ServiceEntries, which no AdaptiveLoadBalancer can own; traffic uses the Kubernetes endpoints",
					"missingFor", goneAfter, "deleted", n)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

func requireServiceEntryCRD(mapper meta.RESTMapper) error {
	_, err := mapper.RESTMapping(schema.GroupKind{Group: "networking.istio.io", Kind: "ServiceEntry"}, "v1")
	if meta.IsNoMatchError(err) {
		return errIstioCRDsMissing
	}
	if err != nil {
		return fmt.Errorf("look up the ServiceEntry API: %w", err)
	}
	return nil
}

// installLogger builds the operator's logger: JSON lines on w at level, stack traces only for
// panics (an Error log here is an expected condition such as an API server outage, not a bug).
// It also becomes the logger of controller-runtime's packages and of klog, through which
// client-go (leader election, informers) logs, so every line the process writes is JSON.
func installLogger(w io.Writer, level zapcore.Level) logr.Logger {
	logger := newJSONLogger(w, level)
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return logger
}
