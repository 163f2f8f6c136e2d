package controller

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

// scriptedCounter answers RemoteClusters with the next scripted reading.
type scriptedCounter struct {
	counts []map[string]float64
	errs   []error
}

func (s *scriptedCounter) RemoteClusters(context.Context, time.Time, string) (metrics.RemoteClusterCount, error) {
	count, err := s.counts[0], s.errs[0]
	s.counts, s.errs = s.counts[1:], s.errs[1:]
	return metrics.RemoteClusterCount{ByIstiod: count}, err
}

// The probe tells the mirror nothing before its first reading, keeps a good reading through
// failures younger than MaxAge, then says why it cannot tell, and announces every change once.
func TestRemoteClusterProbe_KeepsAGoodReadingThroughABriefFailureOnly(t *testing.T) {
	unreachable := &metrics.QueryError{Name: "remoteClusters", Err: metrics.ErrUnreachable}
	counter := &scriptedCounter{
		counts: []map[string]float64{{"istio-system/istiod-1": 0}, nil, nil, nil, {"istio-system/istiod-1": 1}},
		errs:   []error{nil, unreachable, unreachable, &metrics.QueryError{Name: "remoteClusters", Err: &metrics.NoDataError{}}, nil},
	}
	clock := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	changes := 0
	p := &RemoteClusterProbe{Source: counter, Namespace: "istio-system", MaxAge: 2 * time.Minute, Clock: clock, Logger: logr.Discard(), changed: func() { changes++ }}
	if _, known := p.Report(); known {
		t.Fatal("a report before the first reading")
	}
	step := func(d time.Duration) {
		clock.SetTime(clock.Now().Add(d))
		p.probe(context.Background())
	}

	step(0)
	if r, known := p.Report(); !known || !maps.Equal(r.ByIstiod, map[string]float64{"istio-system/istiod-1": 0}) || changes != 1 {
		t.Fatalf("after a good reading: %+v (known %v), %d changes", r, known, changes)
	}
	step(30 * time.Second) // the TSDB unreachable: the reading of 30 s ago stands
	if r, _ := p.Report(); r.Unknown != "" || changes != 1 {
		t.Fatalf("a failure 30 s after a good reading: %+v, %d changes; want the good reading kept", r, changes)
	}
	step(2 * time.Minute) // still unreachable, the reading now 2m30s old
	r, _ := p.Report()
	if !strings.Contains(r.Unknown, "has failed since 2026-01-01T12:00:30Z") || len(r.ByIstiod) != 0 || changes != 2 {
		t.Fatalf("after MaxAge: %+v, %d changes; want unknown, saying since when it fails", r, changes)
	}
	step(30 * time.Second) // the TSDB answers, without istiod's series
	if r, _ := p.Report(); !strings.Contains(r.Unknown, "no istiod_managed_clusters series for an istiod in istio-system") || changes != 3 {
		t.Fatalf("no series: %+v, %d changes", r, changes)
	}
	step(30 * time.Second)
	if r, _ := p.Report(); !maps.Equal(r.ByIstiod, map[string]float64{"istio-system/istiod-1": 1}) || changes != 4 {
		t.Fatalf("a remote cluster appears: %+v, %d changes", r, changes)
	}
}
