package simcli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/spf13/pflag"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// ExportOptions are simulate's --export-* flags: the run of the first policy, written as the
// Prometheus series a real mesh would expose for it.
type ExportOptions struct {
	file      string
	start     string
	namespace string
	service   string
	scrape    time.Duration

	startAt  time.Time
	recorder *sim.MetricsRecorder
}

func (e *ExportOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&e.file, "export-metrics", "", "write the first policy's run as timestamped Prometheus series (cAdvisor, Istio, kube-state-metrics) to this file, for VictoriaMetrics' /api/v1/import/prometheus")
	f.StringVar(&e.start, "export-start", "", "RFC 3339 wall time of the run's start in the exported series (default: the run ends now)")
	f.StringVar(&e.namespace, "export-namespace", "sim", "namespace of the Service, its pods and its clients in the exported series")
	f.StringVar(&e.service, "export-service", "", "name of the Service in the exported series (default: the scenario's name)")
	f.DurationVar(&e.scrape, "export-scrape-interval", sim.DefaultScrapeInterval, "scrape interval of the exported series, whole seconds")
}

// dnsLabel is a Kubernetes name (an RFC 1123 label), checked here rather than with
// k8s.io/apimachinery so that the simulator compiles without Kubernetes packages.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func checkDNSLabel(v string) error {
	if len(v) > 63 || !dnsLabel.MatchString(v) {
		return fmt.Errorf("want 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit, such as my-name")
	}
	return nil
}

// complete checks the flags and prepares the recorder; now is the wall clock.
func (e *ExportOptions) complete(sc *sim.Scenario, now time.Time) error {
	if e.file == "" {
		if e.start != "" {
			return NewUsageError("--export-start needs --export-metrics FILE")
		}
		return nil
	}
	service := e.service
	if service == "" {
		service = sc.Name
	}
	for _, c := range []struct{ flag, value string }{{"--export-namespace", e.namespace}, {"--export-service (or the scenario's name)", service}} {
		if err := checkDNSLabel(c.value); err != nil {
			return NewUsageError("%s %q is not a Kubernetes name: %v", c.flag, c.value, err)
		}
	}
	e.startAt = now.Add(-sc.Duration.Duration).Truncate(time.Second)
	if e.start != "" {
		at, err := time.Parse(time.RFC3339, e.start)
		if err != nil {
			return NewUsageError("--export-start %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", e.start)
		}
		e.startAt = at
	}
	rec, err := sim.NewMetricsRecorder(sim.MeshLabels{Namespace: e.namespace, Service: service, ScrapeInterval: e.scrape})
	if err != nil {
		return NewUsageError("--export-scrape-interval: %v", err)
	}
	e.recorder = rec
	return nil
}

// write saves the recorded series, when asked to, and says on stderr what it wrote.
func (e *ExportOptions) write(stderr io.Writer, policy string) error {
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

func (e *ExportOptions) end() time.Time {
	return e.startAt.Add(e.recorder.Duration())
}
