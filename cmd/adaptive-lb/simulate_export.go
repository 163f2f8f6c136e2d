package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// exportOptions are simulate's --export-* flags: the run of the first policy, written as the
// Prometheus series a real mesh would expose for it.
type exportOptions struct {
	file      string
	start     string
	namespace string
	service   string
	scrape    time.Duration

	startAt  time.Time
	recorder *sim.MetricsRecorder
}

func (e *exportOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&e.file, "export-metrics", "", "write the first policy's run as timestamped Prometheus series (cAdvisor, Istio, kube-state-metrics) to this file, for VictoriaMetrics' /api/v1/import/prometheus")
	f.StringVar(&e.start, "export-start", "", "RFC 3339 wall time of the run's start in the exported series (default: the run ends now)")
	f.StringVar(&e.namespace, "export-namespace", "sim", "namespace of the Service, its pods and its clients in the exported series")
	f.StringVar(&e.service, "export-service", "", "name of the Service in the exported series (default: the scenario's name)")
	f.DurationVar(&e.scrape, "export-scrape-interval", sim.DefaultScrapeInterval, "scrape interval of the exported series, whole seconds")
}

// complete checks the flags and prepares the recorder; now is the wall clock.
func (e *exportOptions) complete(sc *sim.Scenario, now time.Time) error {
	if e.file == "" {
		if e.start != "" {
			return newUsageError("--export-start needs --export-metrics FILE")
		}
		return nil
	}
	service := e.service
	if service == "" {
		service = sc.Name
	}
	for flag, v := range map[string]string{"--export-namespace": e.namespace, "--export-service (or the scenario's name)": service} {
		if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
			return newUsageError("%s %q is not a Kubernetes name: %s", flag, v, errs[0])
		}
	}
	e.startAt = now.Add(-sc.Duration.Duration).Truncate(time.Second)
	if e.start != "" {
		at, err := time.Parse(time.RFC3339, e.start)
		if err != nil {
			return newUsageError("--export-start %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", e.start)
		}
		e.startAt = at
	}
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: e.namespace, Service: service, ScrapeInterval: e.scrape})
	if err != nil {
		return newUsageError("--export-scrape-interval: %v", err)
	}
	e.recorder = rec
	return nil
}

// write saves the recorded series, when asked to, and says on stderr what it wrote.
func (e *exportOptions) write(stderr io.Writer, policy string) error {
	if e.recorder == nil {
		return nil
	}
	f, err := os.Create(e.file)
	if err != nil {
		return fmt.Errorf("write --export-metrics file: %w", err)
	}
	w := bufio.NewWriter(f)
	if err := e.recorder.WriteText(w, e.startAt); err != nil {
		f.Close()
		return fmt.Errorf("write --export-metrics file %s: %w", e.file, err)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write --export-metrics file %s: %w", e.file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write --export-metrics file %s: %w", e.file, err)
	}
	fmt.Fprintf(stderr, "Exported the %s run's series to %s (%s to %s); import with:\n  curl --data-binary @%s http://VICTORIAMETRICS:8428/api/v1/import/prometheus\n",
		policy, e.file, e.startAt.UTC().Format(time.RFC3339), e.end().UTC().Format(time.RFC3339), e.file)
	return nil
}

func (e *exportOptions) end() time.Time {
	return e.startAt.Add(e.recorder.Duration())
}
