package controller

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/adaptive-lb/adaptive-lb/internal/progress"
)

// mirrorInformers are the informers the mirror reads: when one of them stops following the
// cluster, the ServiceEntries it writes no longer follow the endpoints, or the mesh. The mesh
// facts are among them (meshfacts.go): every Service's namespace labels (ambient mode, waypoint,
// istiod's network), istiod's ConfigMap (visibility, meshNetworks: several clusters) and, unless
// --istio-version says it, istiod's Deployments (its version, which ambient Services need).
// Frozen, they would let a refusal stand that no longer applies or, worse, miss one that does.
// Others (DestinationRules, read by the weight cycle for warm-up) change weights, not what the
// mirror writes.
var mirrorInformers = []string{
	"adaptiveloadbalancers.adaptivelb.io",
	"services",
	"endpointslices.discovery.k8s.io",
	"pods",
	"nodes",
	"serviceentries.networking.istio.io",
	"namespaces",
	"configmaps",
	"deployments.apps",
}

// NewInformerProgress returns a tracker for the operator's informers with cfg, describing a
// failed list or watch by the API server's message, in JSON or protobuf.
func NewInformerProgress(cfg progress.Config) *progress.Tracker {
	cfg.Describe = func(_ int, _ string, body []byte) string {
		obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if status, ok := obj.(*metav1.Status); err == nil && ok {
			return status.Message
		}
		return ""
	}
	return progress.New(cfg)
}

// WithProgress routes the informers of opts through tracker: their lists and watches get an HTTP
// client of their own, built from cfg, whose transport records their progress. Other requests
// (writes, uncached reads) do not pass through it.
func WithProgress(opts cache.Options, cfg *rest.Config, tracker *progress.Tracker) (cache.Options, error) {
	// The API server may be served under a path (Rancher's /k8s/clusters/<id>): the tracker
	// must find the resource after it.
	server, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return opts, fmt.Errorf("read the API server's URL %q: %w", cfg.Host, err)
	}
	informerCfg := rest.CopyConfig(cfg)
	informerCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return tracker.WrapUnder(server.Path, rt) })
	httpClient, err := rest.HTTPClientFor(informerCfg)
	if err != nil {
		return opts, fmt.Errorf("build the informers' HTTP client: %w", err)
	}
	opts.HTTPClient = httpClient
	return opts, nil
}

// blindMirrorInformers lists the mirror's informers that no longer see the cluster (none without
// a tracker), oldest first.
func blindMirrorInformers(t *progress.Tracker) []progress.Blindness {
	if t == nil {
		return nil
	}
	var out []progress.Blindness
	for _, b := range t.Blind() {
		if slices.Contains(mirrorInformers, b.Resource) {
			out = append(out, b)
		}
	}
	return out
}

// cacheStaleError: the mirror refused to write from informer caches that have stopped following
// the cluster. since is when the oldest of them stopped.
type cacheStaleError struct {
	since   time.Time
	blind   []progress.Blindness
	timeout time.Duration
}

func (e *cacheStaleError) Error() string {
	return fmt.Sprintf("the operator's caches have stopped following the cluster, so nothing is mirrored from them: %s. The ServiceEntry keeps its last endpoints until they recover, or is deleted once this has lasted %v (--stale-serviceentry-timeout); check the operator's RBAC (get, list and watch on what it reads), its connection to the API server, and that the CRDs it reads are installed",
		describeBlindness(e.blind), e.timeout)
}

// requireCurrentCaches fails when an informer the mirror reads is blind: a write from its cache
// would present a frozen view as the current one.
func (r *AdaptiveLoadBalancerReconciler) requireCurrentCaches() error {
	blind := blindMirrorInformers(r.Progress)
	if len(blind) == 0 {
		return nil
	}
	return &cacheStaleError{since: blind[0].Since, blind: blind, timeout: r.staleTimeout()}
}

// informerWatch re-mirrors every AdaptiveLoadBalancer when one of the mirror's informers goes
// blind or recovers. A frozen cache delivers no event to start a reconcile, so without it nothing
// would notice the blindness; after a recovery, a mirror that failed meanwhile would wait out its
// back-off (up to 5 min) before it re-creates its ServiceEntry. It logs each change.
type informerWatch struct {
	progress *progress.Tracker
	events   chan<- event.GenericEvent
	interval time.Duration
	logger   logr.Logger
}

var _ manager.LeaderElectionRunnable = &informerWatch{}

// NeedLeaderElection: only the leader reconciles.
func (w *informerWatch) NeedLeaderElection() bool { return true }

func (w *informerWatch) Start(ctx context.Context) error {
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	var previous []string
	for {
		blind := blindMirrorInformers(w.progress)
		names := make([]string, len(blind))
		for i, b := range blind {
			names[i] = b.Informer
			if !slices.Contains(previous, b.Informer) {
				w.logger.Error(nil, "an informer has stopped following the cluster: nothing is mirrored from the stale caches, and ServiceEntries are deleted once this lasts --stale-serviceentry-timeout",
					"informer", b.Informer, "since", b.Since, "cause", b.Cause)
			}
		}
		if !slices.Equal(names, previous) {
			if len(names) == 0 {
				w.logger.Info("every informer follows the cluster again; re-mirroring every Service")
			}
			select {
			case w.events <- event.GenericEvent{}:
			default: // a re-mirror of everything is already queued
			}
			previous = names
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// cutSilentStreams runs the tracker's cutting of silent lists and watches on every replica: a
// standby's informers need it as much as the leader's, to be current when it takes over.
type cutSilentStreams struct{ progress *progress.Tracker }

var _ manager.LeaderElectionRunnable = cutSilentStreams{}

func (c cutSilentStreams) NeedLeaderElection() bool { return false }

func (c cutSilentStreams) Start(ctx context.Context) error {
	c.progress.Run(ctx)
	return nil
}
