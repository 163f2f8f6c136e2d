package controller

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// istiodScrape plays istiod's metrics and their scrape for the suite's operator: istiod's gauge
// istiod_managed_clusters, for the local cluster and the remote ones, imported into a real
// VictoriaMetrics every 200 ms at the wall clock's time, with the remote count a test sets. The
// suite's operator judges the mesh's clusters as a default install does (auto): from that
// gauge, read by its RemoteClusterProbe.
type istiodScrape struct {
	vm     *vmtest.Server
	remote atomic.Uint64 // math.Float64bits of the remote count
}

// suiteIstiod is the suite's; nil when VictoriaMetrics is not built (then the suite's operator
// is told the mesh is one cluster, and the tests that need the gauge skip).
var suiteIstiod *istiodScrape

// istiodPod is the istiod pod the suite's scrape reports.
const istiodPod = "istio-system/istiod-7d9f"

// startIstiodScrape starts VictoriaMetrics and the scrape until ctx ends; it returns nil, and no
// error, without the VictoriaMetrics binary.
func startIstiodScrape(ctx context.Context, dir string) (*istiodScrape, error) {
	bin := os.Getenv(vmtest.BinaryEnv)
	if bin == "" {
		return nil, nil
	}
	vm, err := vmtest.Launch(bin, dir, true)
	if err != nil {
		return nil, err
	}
	s := &istiodScrape{vm: vm}
	if err := s.scrape(ctx); err != nil {
		vm.Stop()
		return nil, err
	}
	go func() {
		defer vm.Stop()
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				_ = s.scrape(ctx)
			}
		}
	}()
	return s, nil
}

func (s *istiodScrape) scrape(ctx context.Context) error {
	now := time.Now().UnixMilli()
	remote := math.Float64frombits(s.remote.Load())
	return s.vm.Import(ctx, fmt.Sprintf("istiod_managed_clusters{cluster_type=\"local\",app=\"istiod\",namespace=\"istio-system\",pod=\"istiod-7d9f\"} 1 %d\n"+
		"istiod_managed_clusters{cluster_type=\"remote\",app=\"istiod\",namespace=\"istio-system\",pod=\"istiod-7d9f\"} %g %d\n", now, remote, now))
}

// setRemote makes istiod report n remote clusters from the next scrape on.
func (s *istiodScrape) setRemote(n float64) { s.remote.Store(math.Float64bits(n)) }

// probe is the suite operator's reader of the gauge, reading every 200 ms.
func (s *istiodScrape) probe() (*RemoteClusterProbe, error) {
	src, err := metrics.New(metrics.Config{URL: s.vm.URL}, nil)
	if err != nil {
		return nil, err
	}
	return &RemoteClusterProbe{Source: src.(metrics.RemoteClusterCounter), Interval: 200 * time.Millisecond, Logger: logr.Discard()}, nil
}
