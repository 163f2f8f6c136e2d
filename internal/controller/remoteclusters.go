package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

// Defaults of the RemoteClusterProbe.
const (
	// DefaultRemoteClusterInterval: istiod records its count when a remote cluster is added or
	// removed, and a scrape every 15 to 30 s brings it to the TSDB.
	DefaultRemoteClusterInterval = 30 * time.Second
	// DefaultRemoteClusterMaxAge is how long a count stands when the next readings fail: long
	// enough for a TSDB restart, short against the minutes a second cluster's traffic would be
	// weighted unseen.
	DefaultRemoteClusterMaxAge = 2 * time.Minute
)

// RemoteClusterProbe reads istiod's own count of the remote clusters it reads
// (istiod_managed_clusters{cluster_type="remote"}) from the TSDB every Interval, and keeps the
// last reading for the mirror, which judges from it whether the mesh spans several clusters
// (meshfacts.go). It replaces reading istiod's remote secrets, which hold the other clusters'
// credentials. It runs on every replica, so that a standby that takes over knows the count at
// once. A failed reading keeps the last good one until that is MaxAge old: a TSDB hiccup does
// not remove every ServiceEntry of the cluster. Each change of what it reports re-mirrors
// every Service.
type RemoteClusterProbe struct {
	Source metrics.RemoteClusterCounter
	// Namespace is istiod's.
	Namespace string
	Interval  time.Duration
	MaxAge    time.Duration
	Clock     clock.PassiveClock
	Logger    logr.Logger

	mu       sync.Mutex
	read     bool // a reading, good or failed, has completed
	good     metrics.RemoteClusterCount
	goodAt   time.Time
	failure  error
	failedAt time.Time
	reported istio.RemoteClusterReport
	// changed is called, without the lock, when the report changes.
	changed func()
}

var _ manager.LeaderElectionRunnable = &RemoteClusterProbe{}

// NeedLeaderElection: standbys read too, to be current when they take over.
func (p *RemoteClusterProbe) NeedLeaderElection() bool { return false }

// Start reads every Interval until ctx ends, the first time at once.
func (p *RemoteClusterProbe) Start(ctx context.Context) error {
	if p.Clock == nil {
		p.Clock = clock.RealClock{}
	}
	interval := p.Interval
	if interval <= 0 {
		interval = DefaultRemoteClusterInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		p.probe(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// probe takes one reading and announces a change of the report.
func (p *RemoteClusterProbe) probe(ctx context.Context) {
	now := p.Clock.Now()
	count, err := p.Source.RemoteClusters(ctx, now, p.Namespace)
	if ctx.Err() != nil {
		return // stopping: no verdict from a cancelled query
	}
	p.mu.Lock()
	p.read = true
	if err != nil {
		if p.failure == nil || err.Error() != p.failure.Error() {
			p.Logger.Error(err, "cannot read istiod's count of its remote clusters from the TSDB", "istioNamespace", p.Namespace)
		}
		if p.failure == nil {
			p.failedAt = now
		}
		p.failure = err
	} else {
		p.good, p.goodAt, p.failure = count, now, nil
	}
	report := p.reportLocked(now)
	changed := !equalReports(report, p.reported)
	p.reported = report
	p.mu.Unlock()
	if changed {
		p.Logger.Info("istiod's count of its remote clusters changed; re-mirroring every Service", "remoteClusters", report.ByIstiod, "unknown", report.Unknown)
		if p.changed != nil {
			p.changed()
		}
	}
}

// Report returns what the probe knows of istiod's count; false until its first reading has
// completed (the mirror then waits instead of refusing every Service at start).
func (p *RemoteClusterProbe) Report() (istio.RemoteClusterReport, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reported, p.read
}

func (p *RemoteClusterProbe) reportLocked(now time.Time) istio.RemoteClusterReport {
	maxAge := p.MaxAge
	if maxAge <= 0 {
		maxAge = DefaultRemoteClusterMaxAge
	}
	if !p.goodAt.IsZero() && now.Sub(p.goodAt) < maxAge {
		return istio.RemoteClusterReport{ByIstiod: maps.Clone(p.good.ByIstiod)}
	}
	if errors.Is(p.failure, metrics.ErrNoData) {
		return istio.RemoteClusterReport{Unknown: fmt.Sprintf("the TSDB has no istiod_managed_clusters series for an istiod in %s (does it scrape istiod's metrics?)", p.Namespace)}
	}
	return istio.RemoteClusterReport{Unknown: fmt.Sprintf("reading istiod's count of its remote clusters from the TSDB has failed since %s: %v", p.failedAt.UTC().Format(time.RFC3339), p.failure)}
}

func equalReports(a, b istio.RemoteClusterReport) bool {
	return a.Unknown == b.Unknown && maps.Equal(a.ByIstiod, b.ByIstiod)
}
