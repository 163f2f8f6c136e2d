package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

// The watchdog follows the Services and the managed ServiceEntries by watches instead of listing
// them at every check: at 10,000 Services a list every 15 s has the API server send 40,000
// Services a minute, where a watch sends each change once.
const (
	// watchSyncWait bounds how long the watchdog waits at start-up for its watches before its first
	// check. The heartbeat checks need no watch, and a watchdog that starts while the operator is
	// down must not postpone the fallback for a watch that cannot sync (a Role without watch, an
	// API server slow to answer); it then checks without them, and deletes no ServiceEntry for
	// its Service until they sync.
	watchSyncWait = 30 * time.Second
	// watchSyncLogEvery is how often that wait says it is still waiting.
	watchSyncLogEvery = 5 * time.Second
	// watchRetryInterval is how long the watchdog waits before building its watches again after
	// it failed to (the ServiceEntry CRD not installed yet, the API server unreachable).
	watchRetryInterval = 10 * time.Second
)

var serviceGVK = corev1.SchemeGroupVersion.WithKind("Service")

// watchedMetadata is the watchdog's copy of the metadata (metav1.PartialObjectMetadata) of the
// Services and of the ServiceEntries labelled app.kubernetes.io/managed-by=adaptive-lb in the
// watched namespaces, kept current by watches, without their annotations and managed fields.
type watchedMetadata struct {
	cfg        *rest.Config
	namespaces []string
	logger     logr.Logger

	reader  client.Reader // set before synced is closed; read only after
	synced  chan struct{} // closed once every watch has delivered its initial state
	stopped chan struct{} // closed once the watches have stopped (start's ctx ended); reader still reads what they held
}

func newWatchedMetadata(cfg *rest.Config, namespaces []string, logger logr.Logger) *watchedMetadata {
	return &watchedMetadata{cfg: cfg, namespaces: namespaces, logger: logger, synced: make(chan struct{}), stopped: make(chan struct{})}
}

// isSynced reports, without waiting, whether every watch has delivered its initial state.
func (m *watchedMetadata) isSynced() bool {
	select {
	case <-m.synced:
		return true
	default:
		return false
	}
}

// start builds the watches (again every watchRetryInterval while that fails), runs them until
// ctx ends and closes synced once they have synced. It returns at once.
func (m *watchedMetadata) start(ctx context.Context) {
	go func() {
		began := time.Now()
		var c cache.Cache
		for {
			var err error
			if c, err = m.build(ctx); err == nil {
				break
			}
			m.logger.Error(err, "cannot watch the Services and the managed ServiceEntries; ServiceEntries whose Service is gone are not deleted until it can; retrying", "retryIn", watchRetryInterval)
			select {
			case <-ctx.Done():
				close(m.stopped)
				return
			case <-time.After(watchRetryInterval):
			}
		}
		go func() {
			defer close(m.stopped)
			if err := c.Start(ctx); err != nil {
				m.logger.Error(err, "the watches of the Services and the managed ServiceEntries stopped")
			}
		}()
		if !c.WaitForCacheSync(ctx) {
			return // ctx ended
		}
		m.reader = c
		close(m.synced)
		m.logger.Info("the watches of the Services and the managed ServiceEntries have synced", "after", time.Since(began).Round(time.Millisecond))
	}()
}

// waitForSync waits until the watches have synced, for at most bound, saying every
// watchSyncLogEvery that it still waits. It reports whether they have.
func (m *watchedMetadata) waitForSync(ctx context.Context, bound time.Duration) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	tick := time.NewTicker(watchSyncLogEvery)
	defer tick.Stop()
	began := time.Now()
	for {
		select {
		case <-m.synced:
			return true
		case <-ctx.Done():
			return false
		case <-deadline.C:
			m.logger.Info("the watches of the Services and the managed ServiceEntries have not synced; checking the heartbeat without them: no ServiceEntry is deleted for its Service until they sync (see the errors above: the watchdog needs list and watch on services and serviceentries)",
				"waited", bound)
			return false
		case <-tick.C:
			m.logger.Info("waiting for the watches of the Services and the managed ServiceEntries to sync", "waited", time.Since(began).Round(time.Second), "bound", bound)
		}
	}
}

// build makes the cache of the two watches, restricted to the watched namespaces, and registers
// both, so that they start with it. Reads of anything else fail instead of starting another
// watch.
func (m *watchedMetadata) build(ctx context.Context) (cache.Cache, error) {
	managed := labels.SelectorFromSet(labels.Set{controller.ManagedByLabel: controller.ManagedByValue})
	opts := cache.Options{
		Scheme:                      runtime.NewScheme(), // metadata only: no type is decoded
		ReaderFailOnMissingInformer: true,
		DefaultTransform:            dropAnnotationsAndManagedFields,
		DefaultWatchErrorHandler:    m.logWatchError,
		NewInformer:                 m.newInformer,
		// The ServiceEntries the operator writes; installSelectors then picks this installation's.
		ByObject: map[client.Object]cache.ByObject{metadataOf(serviceEntryGVK): {Label: managed}},
	}
	if len(m.namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range m.namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	c, err := cache.New(m.cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("build the watches: %w", err)
	}
	for _, gvk := range []schema.GroupVersionKind{serviceGVK, serviceEntryGVK} {
		if _, err := c.GetInformer(ctx, metadataOf(gvk)); err != nil {
			return nil, fmt.Errorf("watch %s: %w", gvk.Kind, err)
		}
	}
	return c, nil
}

// logWatchError says, in the watchdog's log, why a watch failed; the watch retries on its own.
// A watch closed or expired in the normal way is not an error.
func (m *watchedMetadata) logWatchError(_ context.Context, _ *toolscache.Reflector, err error) {
	if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	// Both watches are of metadata, one type to the reflector: the error names the resource.
	what := "a watch of the Services or of the managed ServiceEntries failed; it retries"
	if apierrors.IsForbidden(err) {
		what += ": the watchdog's Role must allow list and watch on services and serviceentries (config/rbac/failsafe.yaml, the chart's failsafe.yaml)"
	}
	m.logger.Error(err, what)
}

// newInformer is client-go's informer, logging to the watchdog's logger. controller-runtime
// hands its informers its global logger, which this process leaves unset (the watchdog shares
// nothing with an operator, also when both run in one test process): the first line an
// informer logs would print a warning and a stack trace instead, and nothing after it.
func (m *watchedMetadata) newInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	return loggingInformer{SharedIndexInformer: toolscache.NewSharedIndexInformer(lw, obj, resync, indexers), logger: m.logger}
}

// loggingInformer runs its informer with logger in place of the one its caller passes.
type loggingInformer struct {
	toolscache.SharedIndexInformer
	logger logr.Logger
}

func (i loggingInformer) Run(stop <-chan struct{}) {
	i.RunWithContext(wait.ContextForChannel(stop))
}

func (i loggingInformer) RunWithContext(ctx context.Context) {
	i.SharedIndexInformer.RunWithContext(logr.NewContext(ctx, i.logger))
}

// dropAnnotationsAndManagedFields drops from a cached object's metadata the largest parts, which
// the watchdog never reads: annotations (kubectl's last-applied-configuration is a whole copy of
// the object) and managed fields.
func dropAnnotationsAndManagedFields(in any) (any, error) {
	if m, ok := in.(*metav1.PartialObjectMetadata); ok {
		m.Annotations, m.ManagedFields = nil, nil
	}
	return in, nil
}

// metadataOf is an empty metadata-only object of kind gvk.
func metadataOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}
