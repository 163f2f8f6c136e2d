package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// WarmupSource finds the slow-start warm-up a DestinationRule sets for a Service. It watches
// DestinationRules through an informer of its own, registered when the operator is set up and
// started with the manager, but never waited for: the manager's caches, its readiness and the
// weight cycle go on without it. Where DestinationRules cannot be listed (the operator's Role
// lacks them, or the cluster does not serve networking.istio.io/v1 DestinationRules), the weight
// cycle plans without warm-ups and says so in WeightsApplied, instead of blocking every Service
// behind an informer that never syncs (issue 21.7).
type WarmupSource struct {
	cache cache.Cache
	// retry is how long Start waits before asking again for an informer the API refused.
	retry time.Duration

	mu       sync.Mutex
	informer cache.Informer
	err      error // why no informer could be started yet
}

// NewWarmupSource builds the source's own cache from cfg, in namespaces only when given (the
// operator's --watch-namespaces).
func NewWarmupSource(cfg *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper, namespaces ...string) (*WarmupSource, error) {
	opts := cache.Options{Scheme: scheme, Mapper: mapper, DefaultTransform: cache.TransformStripManagedFields(), ReaderFailOnMissingInformer: true}
	for _, ns := range namespaces {
		if opts.DefaultNamespaces == nil {
			opts.DefaultNamespaces = map[string]cache.Config{}
		}
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("build the DestinationRule cache: %w", err)
	}
	return &WarmupSource{cache: c, retry: time.Minute, err: errors.New("the DestinationRule informer has not started")}, nil
}

// NeedLeaderElection: standbys keep this cache warm too, as they do the others.
func (s *WarmupSource) NeedLeaderElection() bool { return false }

// Start runs the informer until ctx ends (a manager.Runnable). An API that does not serve
// DestinationRules yet is asked again every retry period: Istio may be installed later.
func (s *WarmupSource) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("destinationrules")
	started := make(chan error, 1)
	go func() { started <- s.cache.Start(ctx) }()
	for {
		inf, err := s.cache.GetInformer(ctx, &networkingv1.DestinationRule{}, cache.BlockUntilSynced(false))
		if err == nil {
			s.mu.Lock()
			s.informer, s.err = inf, nil
			s.mu.Unlock()
			break
		}
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		logger.Error(err, "cannot watch DestinationRules: the weight cycle plans without slow-start warm-ups until it can; retrying", "in", s.retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.retry):
		}
	}
	return <-started
}

// errWarmupsUnknown says why warm-ups are unknown, in words that stay the same from cycle to
// cycle (they go into a condition).
var errWarmupsUnknown = errors.New("slow-start warm-ups of DestinationRules are not taken into account")

// Warmup returns the warm-up (slow start) duration a DestinationRule in the Service's namespace
// sets for the Service's host, or 0. The error wraps errWarmupsUnknown when DestinationRules
// cannot be read: the informer could not start, or has not synced (the operator may not list
// or watch them).
func (s *WarmupSource) Warmup(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) (time.Duration, error) {
	s.mu.Lock()
	inf, startErr := s.informer, s.err
	s.mu.Unlock()
	switch {
	case inf == nil && meta.IsNoMatchError(startErr):
		return 0, fmt.Errorf("%w: the cluster does not serve networking.istio.io/v1 DestinationRules", errWarmupsUnknown)
	case inf == nil:
		return 0, fmt.Errorf("%w: DestinationRules cannot be watched yet (see the operator's log)", errWarmupsUnknown)
	case !inf.HasSynced():
		return 0, fmt.Errorf("%w: DestinationRules cannot be listed yet; check that the operator may list and watch destinationrules.networking.istio.io", errWarmupsUnknown)
	}
	var rules networkingv1.DestinationRuleList
	if err := s.cache.List(ctx, &rules, client.InNamespace(alb.Namespace)); err != nil {
		return 0, fmt.Errorf("%w: list DestinationRules in %s: %w", errWarmupsUnknown, alb.Namespace, err)
	}
	svc := alb.Spec.TargetRef.Name
	for _, dr := range rules.Items {
		h := dr.Spec.Host
		if h != svc && h != svc+"."+alb.Namespace && !strings.HasPrefix(h, svc+"."+alb.Namespace+".svc") {
			continue
		}
		lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer()
		if d := lb.GetWarmup().GetDuration(); d != nil {
			return d.AsDuration(), nil
		}
		if d := lb.GetWarmupDurationSecs(); d != nil {
			return d.AsDuration(), nil
		}
	}
	return 0, nil
}
