package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
)

func newMetricsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Inspect the metrics source (the Prometheus-compatible TSDB)",
	}
	cmd.AddCommand(newMetricsCheckCmd())
	return cmd
}

// metricsSourceFlags binds every connection and query option of the metrics source. The operator's
// run command can bind the same flags with addMetricsSourceFlags.
type metricsSourceFlags struct {
	url, pathPrefix           string
	timeout                   time.Duration
	bearerTokenFile           string
	basicAuthUser, passFile   string
	tlsCA, tlsCert, tlsKey    string
	tlsServerName             string
	tlsInsecureSkipVerify     bool
	headers                   []string
	labelNamespace, labelPod  string
	labelContainer            string
	queryCPU, queryRPS        string
	queryErrors, queryLatency string
	queryRemoteClusters       string
	// latencyHistogram is set by run's --tsdb-latency-histogram; metrics check discovers pods
	// and sends no histogram query.
	latencyHistogram bool
	latencyOffset    string
	// historyQuery is set by run's --tsdb-history-query.
	historyQuery string
	// prefix is the flags' prefix, to name them in errors.
	prefix string
}

// prefix names the flags ("" for metrics check, "tsdb-" for run); urlNote ends the URL flag's
// help with what an empty URL means to the command.
func addMetricsSourceFlags(fs *pflag.FlagSet, prefix, urlNote string) *metricsSourceFlags {
	f := &metricsSourceFlags{prefix: prefix}
	fs.StringVar(&f.url, prefix+"url", "", "base URL of the Prometheus-compatible query API, e.g. http://vmselect.monitoring:8481 "+urlNote)
	fs.StringVar(&f.pathPrefix, prefix+"path-prefix", "", "path before /api/v1/query, e.g. /select/0/prometheus (VictoriaMetrics cluster) or /prometheus (Mimir)")
	fs.DurationVar(&f.timeout, prefix+"timeout", metrics.DefaultTimeout, "timeout of each query")
	fs.StringVar(&f.bearerTokenFile, prefix+"bearer-token-file", "", "file holding a bearer token; re-read when it changes")
	fs.StringVar(&f.basicAuthUser, prefix+"basic-auth-username", "", "basic auth username")
	fs.StringVar(&f.passFile, prefix+"basic-auth-password-file", "", "file holding the basic auth password")
	fs.StringVar(&f.tlsCA, prefix+"tls-ca-file", "", "CA bundle to verify the TSDB's certificate; re-read when it changes")
	fs.StringVar(&f.tlsCert, prefix+"tls-cert-file", "", "client certificate for mutual TLS; re-read when it changes")
	fs.StringVar(&f.tlsKey, prefix+"tls-key-file", "", "client key for mutual TLS; re-read when it changes")
	fs.StringVar(&f.tlsServerName, prefix+"tls-server-name", "", "server name to verify instead of the URL's host")
	fs.BoolVar(&f.tlsInsecureSkipVerify, prefix+"tls-insecure-skip-verify", false, "do not verify the TSDB's certificate (testing only)")
	fs.StringArrayVar(&f.headers, prefix+"header", nil, "extra request header NAME=VALUE, repeatable, e.g. X-Scope-OrgID=team-a")
	fs.StringVar(&f.labelNamespace, prefix+"label-namespace", metrics.DefaultLabels.Namespace, "label holding the pod's namespace")
	fs.StringVar(&f.labelPod, prefix+"label-pod", metrics.DefaultLabels.Pod, "label holding the pod's name")
	fs.StringVar(&f.labelContainer, prefix+"label-container", metrics.DefaultLabels.Container, "label holding the container name (cAdvisor)")
	fs.StringVar(&f.latencyOffset, prefix+"latency-offset", "0s", "sent as VictoriaMetrics' latency_offset query argument, which overrides its -search.latencyOffset (30s): 0s reads the newest samples; "+metrics.LatencyOffsetNone+" sends no argument, and VictoriaMetrics answers 30s in the past (Prometheus, Thanos and Mimir ignore it; see docs/metrics.md)")
	fs.StringVar(&f.queryCPU, prefix+"query-cpu", "", "Go template replacing the default CPU query (see docs/metrics.md)")
	fs.StringVar(&f.queryRPS, prefix+"query-request-rate", "", "Go template replacing the default request-rate query")
	fs.StringVar(&f.queryErrors, prefix+"query-error-rate", "", "Go template replacing the default error-rate query")
	fs.StringVar(&f.queryLatency, prefix+"query-latency-p99", "", "Go template replacing the default p99 latency query (seconds)")
	fs.StringVar(&f.queryRemoteClusters, prefix+"query-remote-clusters", "", "Go template replacing the query of istiod's count of its remote clusters (istiod_managed_clusters), e.g. to add the cluster label of a TSDB shared by several clusters")
	return f
}

// config turns the flags into a validated metrics.Config; problems are usage errors.
func (f *metricsSourceFlags) config() (metrics.Config, error) {
	cfg := metrics.Config{
		URL:             f.url,
		PathPrefix:      f.pathPrefix,
		Timeout:         f.timeout,
		BearerTokenFile: f.bearerTokenFile,
		BasicAuth:       metrics.BasicAuth{Username: f.basicAuthUser, PasswordFile: f.passFile},
		TLS: metrics.TLSConfig{
			CAFile: f.tlsCA, CertFile: f.tlsCert, KeyFile: f.tlsKey,
			ServerName: f.tlsServerName, InsecureSkipVerify: f.tlsInsecureSkipVerify,
		},
		Labels:                  metrics.Labels{Namespace: f.labelNamespace, Pod: f.labelPod, Container: f.labelContainer},
		Queries:                 metrics.QueryTemplates{CPU: f.queryCPU, RequestRate: f.queryRPS, ErrorRate: f.queryErrors, LatencyP99: f.queryLatency},
		RemoteClustersQuery:     f.queryRemoteClusters,
		DisableLatencyHistogram: !f.latencyHistogram,
		HistoryQuery:            f.historyQuery,
	}
	offset, err := metrics.ParseLatencyOffset(f.latencyOffset)
	if err != nil {
		return cfg, newUsageError("--%slatency-offset: %v", f.prefix, err)
	}
	cfg.LatencyOffset = offset
	for _, h := range f.headers {
		name, value, ok := strings.Cut(h, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return cfg, newUsageError("--header %q: want NAME=VALUE, e.g. X-Scope-OrgID=team-a", h)
		}
		if cfg.Headers == nil {
			cfg.Headers = map[string]string{}
		}
		cfg.Headers[strings.TrimSpace(name)] = value
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err: fmt.Errorf("metrics source flags: %w", err)}
	}
	return cfg, nil
}

type metricsCheckOptions struct {
	source     *metricsSourceFlags
	namespaces []string
	podRegex   string
	window     time.Duration
	interval   time.Duration
	at         string
	cfg        metrics.Config
	now        time.Time
	// istioNamespace is where istiod's pods are found in the TSDB.
	istioNamespace string
}

func newMetricsCheckCmd() *cobra.Command {
	o := &metricsCheckOptions{}
	cmd := &cobra.Command{
		Use:   "check --url URL [--namespace NS ...]",
		Short: "Show, per pod, what the operator would read from the TSDB, with the query text",
		Long: `check sends one cycle of the operator's queries to the TSDB and prints the rendered
PromQL, then one row per pod found in the results: CPU cores, request rate, error rate, p99
latency, the age of the newest raw sample and whether the operator would consider it fresh
(newer than 2 × --interval).

It exits with status 1 when the TSDB is unreachable, rejects a query, or returns no pods, and
with status 2 on invalid flags.`,
		Example: `  adaptive-lb metrics check --url http://localhost:8428 --namespace shop
  adaptive-lb metrics check --url https://mimir.example --path-prefix /prometheus \
      --header X-Scope-OrgID=team-a --bearer-token-file /var/run/secrets/token`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if o.window <= 0 {
				return newUsageError("--window %s must be positive", o.window)
			}
			if o.interval <= 0 {
				return newUsageError("--interval %s must be positive", o.interval)
			}
			for _, ns := range o.namespaces {
				if ns == "" {
					return newUsageError("--namespace must not be empty")
				}
			}
			o.now = time.Now()
			if o.at != "" {
				at, err := time.Parse(time.RFC3339, o.at)
				if err != nil {
					return newUsageError("--at %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", o.at)
				}
				o.now = at
			}
			cfg, err := o.source.config()
			o.cfg = cfg
			return err
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMetricsCheck(cmd.Context(), o, o.now, cmd.OutOrStdout())
		},
	}
	o.source = addMetricsSourceFlags(cmd.Flags(), "", "(required)")
	cmd.Flags().StringArrayVar(&o.namespaces, "namespace", nil, "namespace to check, repeatable (default: all)")
	cmd.Flags().StringVar(&o.podRegex, "pod-regex", "", "only pods whose name matches this regex (PromQL =~ syntax)")
	cmd.Flags().DurationVar(&o.window, "window", time.Minute, "rate window of the queries")
	cmd.Flags().StringVar(&o.at, "at", "", "evaluation time, RFC 3339 (default: now); sample ages and freshness are relative to it")
	cmd.Flags().DurationVar(&o.interval, "interval", 30*time.Second, "operator cycle interval; samples older than twice this are stale")
	cmd.Flags().StringVar(&o.istioNamespace, "istio-namespace", "istio-system", "istiod's namespace, whose count of its remote clusters is shown")
	return cmd
}

// printRemoteClusters shows istiod's count of its remote clusters, from which the operator
// (--mesh-multi-cluster=auto, its default) tells a mesh of one cluster: without it, it refuses
// every Service. It does not change the exit status: the weights do not need it.
func printRemoteClusters(ctx context.Context, out io.Writer, src metrics.Source, now time.Time, namespace string) {
	counter, ok := src.(metrics.RemoteClusterCounter)
	if !ok {
		return
	}
	fmt.Fprintf(out, "\nistiod's count of its remote clusters (istiod_managed_clusters{cluster_type=\"remote\"}), which --mesh-multi-cluster=auto needs:\n")
	count, err := counter.RemoteClusters(ctx, now, namespace)
	if err != nil {
		fmt.Fprintf(out, "  cannot be read: %v\n  The operator refuses every Service (MultiCluster) unless the TSDB scrapes istiod's metrics (port 15014), or, for a mesh of this cluster alone, it runs with --mesh-multi-cluster=false (chart: mesh.multiCluster: false).\n", err)
		return
	}
	for _, pod := range count.Istiods() {
		fmt.Fprintf(out, "  %-50s %g\n", pod, count.ByIstiod[pod])
	}
}

func runMetricsCheck(ctx context.Context, o *metricsCheckOptions, now time.Time, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	src, err := metrics.New(o.cfg, nil)
	if err != nil {
		return usageError{err: err}
	}
	batch, fetchErr := src.Fetch(ctx, metrics.Request{
		Now: now, Window: o.window, Interval: o.interval,
		Discover: true, DiscoverNamespaces: o.namespaces, PodRegex: o.podRegex,
	})
	if batch.Queries == nil && fetchErr != nil {
		return fetchErr
	}
	printQueries(out, batch.Queries, now, o)
	printPods(out, batch.Observations, now)
	printFreshness(out, batch.Observations, now, o.interval, o.cfg.LatencyOffset)
	printRemoteClusters(ctx, out, src, now, o.istioNamespace)

	if fetchErr != nil && !allNoData(batch.Queries) {
		return summarizeFailures(o.cfg.URL+o.cfg.PathPrefix, batch.Queries)
	}
	if len(batch.Observations) == 0 {
		scope := "any namespace"
		if len(o.namespaces) > 0 {
			scope = "namespace(s) " + strings.Join(o.namespaces, ", ")
		}
		return fmt.Errorf("the TSDB at %s returned no pod series for %s: check that cAdvisor and the Istio sidecars are scraped, and the --label-* flags", o.cfg.URL+o.cfg.PathPrefix, scope)
	}
	return nil
}

// summarizeFailures keeps the error short (the per-query details are printed above it) while
// wrapping the first real failure so its kind stays visible to errors.Is.
func summarizeFailures(address string, queries []metrics.Query) error {
	var first error
	failed := 0
	for _, q := range queries {
		if q.Err != nil && !errors.Is(q.Err, metrics.ErrNoData) {
			failed++
			if first == nil {
				first = fmt.Errorf("%s query: %w", q.Name, q.Err)
			}
		}
	}
	return fmt.Errorf("querying %s: %d of %d queries failed; first: %w", address, failed, len(queries), first)
}

// allNoData reports whether every failed query merely matched nothing.
func allNoData(queries []metrics.Query) bool {
	for _, q := range queries {
		if q.Err != nil && !errors.Is(q.Err, metrics.ErrNoData) {
			return false
		}
	}
	return true
}

func printQueries(out io.Writer, queries []metrics.Query, now time.Time, o *metricsCheckOptions) {
	fmt.Fprintf(out, "Queries (evaluated at %s, window %s, stale after %s, latency offset %s):\n",
		now.UTC().Format(time.RFC3339), o.window, 2*o.interval, metrics.FormatLatencyOffset(o.cfg.LatencyOffset))
	for _, q := range queries {
		signals := make([]string, len(q.Signals))
		for i, s := range q.Signals {
			signals[i] = string(s)
		}
		status := fmt.Sprintf("%d series", q.Series)
		if q.Err != nil {
			status = "FAILED: " + q.Err.Error()
		}
		fmt.Fprintf(out, "  %-11s [%s] %s\n    %s\n", q.Name, strings.Join(signals, ","), status, q.Text)
		for _, w := range q.Warnings {
			fmt.Fprintf(out, "    warning: %s\n", w)
		}
	}
	fmt.Fprintln(out)
}

func printPods(out io.Writer, observations []metrics.Observation, now time.Time) {
	fmt.Fprintf(out, "Pods (%d):\n", len(observations))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tCPU CORES\tREQ/S\tERR/S\tP99\tSAMPLE AGE\tSTATUS")
	var problems []string
	for _, obs := range observations {
		var oldest time.Duration
		var stale, missing []string
		for _, signal := range metrics.Signals {
			s := obs.Sample(signal)
			switch {
			case !s.Present:
				missing = append(missing, string(signal))
			case !s.Fresh:
				stale = append(stale, string(signal))
			}
			if s.Present && !s.Timestamp.IsZero() {
				oldest = max(oldest, now.Sub(s.Timestamp))
			}
			if s.Err != nil {
				problems = append(problems, fmt.Sprintf("  %s/%s %s: %v", obs.Namespace, obs.Name, signal, s.Err))
			}
		}
		status := "fresh"
		switch {
		case len(stale) > 0:
			status = "stale: " + strings.Join(stale, ",")
		case len(missing) == len(metrics.Signals):
			status = "no metrics"
		}
		if len(missing) > 0 && len(missing) < len(metrics.Signals) {
			status += "; missing: " + strings.Join(missing, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", obs.Namespace, obs.Name,
			formatValue(obs.CPUCores, "%.3f"), formatValue(obs.RequestRate, "%.2f"), formatValue(obs.ErrorRate, "%.2f"),
			formatLatency(obs.LatencyP99Seconds), oldest.Round(time.Second), status)
	}
	_ = tw.Flush()
	if len(problems) > 0 {
		fmt.Fprintf(out, "\nProblems (the operator treats these signals as missing):\n%s\n", strings.Join(problems, "\n"))
	}
}

// printFreshness says how old the youngest sample is against the operator's limit, and, when
// every pod is stale, what to change: what makes samples look old depends on whether the newest
// data was asked for (latency offset, nil when no argument was sent).
func printFreshness(out io.Writer, observations []metrics.Observation, now time.Time, interval time.Duration, offset *time.Duration) {
	youngest := time.Duration(-1)
	pods, stale := 0, 0
	for _, obs := range observations {
		present, fresh := false, false
		for _, signal := range []metrics.Signal{metrics.SignalCPU, metrics.SignalRequestRate} {
			s := obs.Sample(signal)
			if !s.Present || s.Timestamp.IsZero() {
				continue
			}
			present = true
			fresh = fresh || s.Fresh
			if age := now.Sub(s.Timestamp); youngest < 0 || age < youngest {
				youngest = age
			}
		}
		if present {
			pods++
			if !fresh {
				stale++
			}
		}
	}
	if youngest < 0 {
		return
	}
	limit := 2 * interval
	fmt.Fprintf(out, "\nFreshness: the youngest sample is %s old; at --interval %s the operator accepts samples up to %s old (2× interval).\n",
		youngest.Round(time.Second), interval, limit)
	if stale == pods {
		fmt.Fprintln(out, "Every pod is stale: the operator would hold, then reset, the weights.")
		fmt.Fprintln(out, staleAdvice(offset))
	}
}

// staleAdvice says what makes every sample look too old, and what to set, for the latency
// offset the queries were sent with.
func staleAdvice(offset *time.Duration) string {
	switch {
	case offset == nil:
		return fmt.Sprintf(`No latency_offset argument was sent (--latency-offset=none), so VictoriaMetrics evaluates a
query for the last 30 s as of 30 s ago (-search.latencyOffset, default 30s) and every sample
looks that much older. Drop --latency-offset=none (the operator's --tsdb-latency-offset defaults
to 0s, the newest data), or set -search.latencyOffset=5s on victoria-metrics (single-node) or
vmselect (cluster), or raise spec.interval. The default interval, 30s, allows %s: enough
for the 30s offset with a scrape interval below 30s.`, 2*30*time.Second)
	case *offset > 0:
		return fmt.Sprintf(`--latency-offset=%s has VictoriaMetrics answer that far in the past: keep 2 × interval
above it plus the scrape interval. Lower it (0s reads the newest data) or raise spec.interval.`, *offset)
	}
	return `The newest data was asked for (latency_offset), so the samples are this old in the TSDB
itself: the pods are scraped less often than every 2 × interval, or the scrape or its remote
write is behind. Scrape more often or raise spec.interval. A TSDB that ignores latency_offset and
answers in the past looks the same: VictoriaMetrics before v1.85.2 (lower its
-search.latencyOffset), or a proxy in front of it that drops query arguments.`
}

func formatValue(s metrics.Sample, format string) string {
	if !s.Present {
		return "-"
	}
	return fmt.Sprintf(format, s.Value)
}

func formatLatency(s metrics.Sample) string {
	if !s.Present || math.IsNaN(s.Value) {
		return "-"
	}
	return (time.Duration(s.Value * float64(time.Second))).Round(100 * time.Microsecond).String()
}
