package whatif

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// MinData is the least stretch of a Service's requests the fit works from.
const MinData = time.Minute

// Reader reads a Service's Measurements from a Prometheus-compatible TSDB. The per-pod CPU,
// request rate and latency histogram come through the operator's own metrics.Source, so query
// overrides and label names apply as they do to the operator; the load over time, the client
// proxies and the kube-state-metrics facts come from a few more queries through API.
type Reader struct {
	API    v1.API
	Source metrics.Source
	// Labels are the pod label names of cAdvisor and Istio series (metrics.DefaultLabels when
	// empty). kube-state-metrics series are read with their own namespace and pod labels.
	Labels metrics.Labels
	// Timeout bounds each query.
	Timeout time.Duration
	// Address names the TSDB in messages.
	Address string
	// CPUQuery is the operator's CPU query template (--tsdb-query-cpu), read per step to follow
	// a speed that changes during the window; metrics.DefaultCPUQuery when empty.
	CPUQuery string
}

// Window is the stretch of time to read a Service over.
type Window struct {
	Namespace, Service string
	// End is the end of the window and Length its length.
	End    time.Time
	Length time.Duration
	// Step is the resolution of the load profile; DefaultStep(Length) when zero.
	Step time.Duration
	// Cluster, when the caller could read it, helps tell a Service without a mesh from one
	// without metrics.
	Cluster *ClusterFacts
}

// DefaultStep is the load profile's resolution for a window: a 120th of it, at least 30 s, in
// whole multiples of 15 s (a usual scrape interval, so that each step holds two scrapes or more).
func DefaultStep(length time.Duration) time.Duration {
	step := length / 120
	const unit = 15 * time.Second
	step = (step + unit - 1) / unit * unit
	return max(step, 30*time.Second)
}

// Read reads the Service's measurements over the window.
func (r *Reader) Read(ctx context.Context, w Window) (*Measurements, error) {
	if w.Step == 0 {
		w.Step = DefaultStep(w.Length)
	}
	if r.Labels.Pod == "" {
		r.Labels = metrics.DefaultLabels
	}
	if r.Timeout == 0 {
		r.Timeout = metrics.DefaultTimeout
	}
	q := &queries{r: r, ctx: ctx, ns: w.Namespace, svc: w.Service}
	start := w.End.Add(-w.Length)
	span, samples, err := q.dataSpan(start, w.End, w.Length)
	if err != nil {
		return nil, err
	}
	if samples == 0 {
		return nil, q.diagnoseMissing(start, w)
	}
	tooLittle := func(steps int) error {
		return fmt.Errorf("%w: Service %s/%s has %v of request data between %s and %s (%d step(s) of %v with a rate), under the %v the fit needs; widen --window, move it with --at, or measure again later",
			ErrTooLittleData, w.Namespace, w.Service, span, stamp(start), stamp(w.End), steps, w.Step, MinData)
	}
	if span < MinData {
		return nil, tooLittle(0)
	}
	// rate() over a step needs two samples in it (Prometheus does not look before the range):
	// a step is at least twice the scrape interval, as the series show it.
	var notes []string
	if interval := (span / time.Duration(max(1, samples-1))).Round(5 * time.Second); 2*interval > w.Step {
		const unit = 15 * time.Second
		w.Step = (2*interval + unit - 1) / unit * unit
		notes = append(notes, fmt.Sprintf("the sidecars are scraped about every %v, so the load is read in steps of %v", interval.Round(time.Second), w.Step))
	}
	load, err := q.rangeQuery(fmt.Sprintf(`sum(rate(istio_requests_total{%s}[%s]))`, q.dest(), promDuration(w.Step)), start.Add(w.Step), w.End, w.Step)
	if err != nil {
		return nil, err
	}
	if len(load) == 0 || len(load[0].Values) < 2 {
		n := 0
		if len(load) > 0 {
			n = len(load[0].Values)
		}
		return nil, tooLittle(n)
	}
	points := load[0].Values
	first, last := points[0].Timestamp.Time(), points[len(points)-1].Timestamp.Time()
	m := &Measurements{Namespace: w.Namespace, Service: w.Service, From: first.Add(-w.Step), To: last, Step: w.Step, Notes: notes}
	steps := int(math.Round(m.To.Sub(m.From).Seconds() / w.Step.Seconds()))
	m.Load = valuesPerStep(points, m.From, w.Step, steps)
	if m.To.Sub(m.From) < w.Length-w.Step {
		m.Notes = append(m.Notes, fmt.Sprintf("the Service has data from %s to %s only, %v of the %v window", stamp(m.From), stamp(m.To), m.To.Sub(m.From), w.Length))
	}
	if err := q.readPods(m, steps); err != nil {
		return nil, err
	}
	if err := q.readClients(m); err != nil {
		return nil, err
	}
	if err := q.readKubeStateMetrics(m); err != nil {
		return nil, err
	}
	return m, nil
}

// queries holds one Read's context and the Service's selectors.
type queries struct {
	r       *Reader
	ctx     context.Context
	ns, svc string
}

// dest selects the Service's requests as its pods' sidecars report them; source as the client
// sidecars report them.
func (q *queries) dest() string {
	return `reporter="destination", destination_service_namespace="` + quote(q.ns) + `", destination_service_name="` + quote(q.svc) + `"`
}

func (q *queries) source() string {
	return `reporter="source", destination_service_namespace="` + quote(q.ns) + `", destination_service_name="` + quote(q.svc) + `"`
}

func (q *queries) instant(text string, at time.Time) (model.Vector, error) {
	ctx, cancel := context.WithTimeout(q.ctx, q.r.Timeout)
	defer cancel()
	v, warnings, err := q.r.API.Query(ctx, text, at, v1.WithTimeout(q.r.Timeout))
	if err != nil {
		return nil, fmt.Errorf("querying %s for %s: %w", q.r.Address, text, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("querying %s for %s: the TSDB answered with warnings (a partial result is not used): %s", q.r.Address, text, strings.Join(warnings, "; "))
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("querying %s for %s: want an instant vector, got %s", q.r.Address, text, v.Type())
	}
	return vec, nil
}

func (q *queries) rangeQuery(text string, from, to time.Time, step time.Duration) (model.Matrix, error) {
	ctx, cancel := context.WithTimeout(q.ctx, q.r.Timeout)
	defer cancel()
	v, warnings, err := q.r.API.QueryRange(ctx, text, v1.Range{Start: from, End: to, Step: step}, v1.WithTimeout(q.r.Timeout))
	if err != nil {
		return nil, fmt.Errorf("querying %s over a range for %s: %w", q.r.Address, text, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("querying %s over a range for %s: the TSDB answered with warnings (a partial result is not used): %s", q.r.Address, text, strings.Join(warnings, "; "))
	}
	mat, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("querying %s over a range for %s: want a matrix, got %s", q.r.Address, text, v.Type())
	}
	return mat, nil
}

// spanStep is the resolution at which dataSpan finds the Service's first sample.
const spanStep = 15 * time.Second

// dataSpan is the time between the Service's first and last request samples in [from, to], to
// within spanStep, and the most samples one of its request series holds in the window (0 when it
// has none). At each step, timestamp() gives the newest raw sample at or before it, so the last
// step gives the last sample exactly and the first step with a value a sample at most one step
// after the first.
func (q *queries) dataSpan(from, to time.Time, length time.Duration) (time.Duration, int, error) {
	mat, err := q.rangeQuery(fmt.Sprintf(`max(timestamp(istio_requests_total{%s}))`, q.dest()), from, to, spanStep)
	if err != nil || len(mat) == 0 || len(mat[0].Values) == 0 {
		return 0, 0, err
	}
	vs := mat[0].Values
	first := time.UnixMilli(int64(float64(vs[0].Value) * 1000))
	if first.Before(from) {
		first = from // a sample from before the window, seen through the lookback
	}
	last := time.UnixMilli(int64(float64(vs[len(vs)-1].Value) * 1000))
	if !last.After(from) {
		return 0, 0, nil // only samples from before the window
	}
	// The count's range reaches one spanStep before the window, so that a sample at its very
	// start, which the span counts from, is counted too.
	samples, err := q.scalar(fmt.Sprintf(`max(count_over_time(istio_requests_total{%s}[%s]))`, q.dest(), promDuration(length+spanStep)), to)
	if err != nil {
		return 0, 0, err
	}
	return last.Sub(first), int(samples), nil
}

// readPods reads each pod's rate per step, then its CPU, rate and latency histogram over the
// stretch through the operator's metrics source.
func (q *queries) readPods(m *Measurements, steps int) error {
	l := q.r.Labels
	perPod, err := q.rangeQuery(fmt.Sprintf(`sum by (%s) (rate(istio_requests_total{%s}[%s]))`, l.Pod, q.dest(), promDuration(m.Step)), m.From.Add(m.Step), m.To, m.Step)
	if err != nil {
		return err
	}
	var names []string
	for _, s := range perPod {
		name := string(s.Metric[model.LabelName(l.Pod)])
		if name == "" {
			return fmt.Errorf("the Service's request series carry no %q label; set --tsdb-label-pod to the label that names the pod", l.Pod)
		}
		rates := valuesPerStep(s.Values, m.From, m.Step, steps)
		served := 0
		for _, v := range rates {
			if !math.IsNaN(v) {
				served++
			}
		}
		m.Pods = append(m.Pods, PodMeasurement{Name: name, Rates: rates, Coverage: float64(served) / float64(steps)})
		names = append(names, name)
	}
	sort.Slice(m.Pods, func(i, j int) bool { return m.Pods[i].Name < m.Pods[j].Name })
	sort.Strings(names)

	window := m.To.Sub(m.From)
	req := metrics.Request{Now: m.To, Window: window, Interval: window, PodRegex: podRegex(names)}
	for _, p := range m.Pods {
		req.Pods = append(req.Pods, metrics.Pod{Namespace: m.Namespace, Name: p.Name})
	}
	batch, fetchErr := q.r.Source.Fetch(q.ctx, req)
	if batch.Observations == nil {
		return fmt.Errorf("reading the pods' CPU, rate and latency from %s: %w", q.r.Address, fetchErr)
	}
	if err := q.readCPUPerStep(m, names, steps); err != nil {
		return err
	}
	var noCPU, noHistogram []string
	for i, obs := range batch.Observations {
		p := &m.Pods[i]
		p.CPUCores, p.RequestRate = math.NaN(), math.NaN()
		if obs.CPUCores.Present {
			p.CPUCores = obs.CPUCores.Value
		} else {
			noCPU = append(noCPU, p.Name)
		}
		if obs.RequestRate.Present {
			p.RequestRate = obs.RequestRate.Value
		}
		if len(obs.LatencyBuckets) > 0 {
			p.Latency = histogramFromBuckets(obs.LatencyBuckets)
			m.ServerLatency = m.ServerLatency.Add(p.Latency)
		} else {
			noHistogram = append(noHistogram, p.Name)
		}
	}
	if len(noCPU) == len(m.Pods) {
		return fmt.Errorf("%w: no pod of Service %s/%s has CPU series (cAdvisor container_cpu_usage_seconds_total) between %s and %s (%v); check that the kubelets' cAdvisor endpoints are scraped, the --tsdb-label-* flags and --tsdb-query-cpu",
			ErrNoMetrics, m.Namespace, m.Service, stamp(m.From), stamp(m.To), fetchErr)
	}
	if len(noCPU) > 0 {
		m.Notes = append(m.Notes, fmt.Sprintf("no CPU series for %s: their cost per request is taken from their group", strings.Join(noCPU, ", ")))
	}
	if err := q.checkIstioNames(m, names, noHistogram); err != nil {
		return err
	}
	if err := q.readCalmStretch(m, names); err != nil {
		return err
	}
	// The pooled server-side histogram's sum, for the network latency (the per-pod buckets carry
	// no sum).
	sum, err := q.scalar(fmt.Sprintf(`sum(increase(istio_request_duration_milliseconds_sum{%s}[%s]))`, q.dest(), promDuration(window)), m.To)
	if err != nil {
		return err
	}
	m.ServerLatency.SumMS = sum
	return nil
}

// readCalmStretch finds the window's calmest stretch and reads each pod's latency histogram over
// it: the operator's histogram query, alone (the stretch needs no CPU, rate or freshness).
func (q *queries) readCalmStretch(m *Measurements, names []string) error {
	calm := calmestStretch(m.Load)
	if calm == nil {
		return nil
	}
	length := time.Duration(calm.To-calm.From) * m.Step
	query, err := metrics.RenderQuery("latency histogram", metrics.DefaultLatencyHistogramQuery, metrics.NewTemplateData([]string{m.Namespace}, podRegex(names), length, q.r.Labels))
	if err != nil {
		return err
	}
	v, err := q.instant(query, m.From.Add(time.Duration(calm.To)*m.Step))
	if err != nil {
		// Only a refinement of the cost fit: go on with the whole window's histograms.
		m.Notes = append(m.Notes, fmt.Sprintf("the pods' latency over the window's calmest stretch could not be read (%v); the request cost is fitted to the whole window's histograms", err))
		return nil
	}
	byPod := map[string]model.Vector{}
	for _, s := range v {
		pod := string(s.Metric[model.LabelName(q.r.Labels.Pod)])
		byPod[pod] = append(byPod[pod], s)
	}
	for i := range m.Pods {
		if buckets := byPod[m.Pods[i].Name]; len(buckets) > 0 {
			m.Pods[i].CalmLatency = histogramFromLe(buckets)
		}
	}
	m.Calm = calm
	return nil
}

// calmStretchLoad is how much below the window's mean load a stretch must run to be worth
// fitting the cost distribution on: a fifth.
const calmStretchLoad = 0.8

// calmestStretch is the run of a quarter of the window's steps (at least 4) with the least mean
// load, or nil when it is not calmStretchLoad below the window's mean or the window is too short.
func calmestStretch(load []float64) *Stretch {
	n := max(4, len(load)/4)
	if len(load) < 2*n {
		return nil
	}
	filled := fillGaps(load, 0)
	sum := 0.0
	for _, v := range filled {
		sum += v
	}
	mean := sum / float64(len(filled))
	best, bestSum := 0, math.Inf(1)
	run := 0.0
	for k, v := range filled {
		run += v
		if k >= n {
			run -= filled[k-n]
		}
		if k >= n-1 && run < bestSum {
			best, bestSum = k-n+1, run
		}
	}
	if bestSum/float64(n) > calmStretchLoad*mean {
		return nil
	}
	return &Stretch{From: best, To: best + n}
}

// readCPUPerStep reads each pod's CPU in each step through the operator's CPU query, so that a
// speed that changes during the window can be seen in the CPU per request of each step.
func (q *queries) readCPUPerStep(m *Measurements, names []string, steps int) error {
	text := q.r.CPUQuery
	if text == "" {
		text = metrics.DefaultCPUQuery
	}
	query, err := metrics.RenderQuery("cpu", text, metrics.NewTemplateData([]string{m.Namespace}, podRegex(names), m.Step, q.r.Labels))
	if err != nil {
		return err
	}
	mat, err := q.rangeQuery(query, m.From.Add(m.Step), m.To, m.Step)
	if err != nil {
		return err
	}
	byName := map[string][]float64{}
	for _, s := range mat {
		byName[string(s.Metric[model.LabelName(q.r.Labels.Pod)])] = valuesPerStep(s.Values, m.From, m.Step, steps)
	}
	for i := range m.Pods {
		p := &m.Pods[i]
		p.CPUs = byName[p.Name]
		if p.CPUs == nil {
			p.CPUs = make([]float64, steps)
			for k := range p.CPUs {
				p.CPUs[k] = math.NaN()
			}
		}
	}
	return nil
}

// readClients counts the client proxies and reads their pooled latency histogram.
func (q *queries) readClients(m *Measurements) error {
	rng := promDuration(m.To.Sub(m.From))
	pods, err := q.instant(fmt.Sprintf(`sum by (%s) (increase(istio_requests_total{%s}[%s])) > 0`, q.r.Labels.Pod, q.source(), rng), m.To)
	if err != nil {
		return err
	}
	if len(pods) == 0 {
		return fmt.Errorf("%w: no client sidecar reports requests to Service %s/%s between %s and %s (istio_requests_total{reporter=\"source\"}). adaptive-lb's weights act in the client sidecars: callers outside the mesh would see no change. If the callers do run sidecars, check that their metrics are scraped",
			ErrNoClientSidecars, m.Namespace, m.Service, stamp(m.From), stamp(m.To))
	}
	m.Clients.Proxies = len(pods)
	buckets, err := q.instant(fmt.Sprintf(`sum by (le) (increase(istio_request_duration_milliseconds_bucket{%s}[%s]))`, q.source(), rng), m.To)
	if err != nil {
		return err
	}
	m.Clients.Latency = histogramFromLe(buckets)
	if m.Clients.Latency.SumMS, err = q.scalar(fmt.Sprintf(`sum(increase(istio_request_duration_milliseconds_sum{%s}[%s]))`, q.source(), rng), m.To); err != nil {
		return err
	}
	m.Clients.LB, m.Clients.LBOrigin = sim.LBLeastRequest, Assumed
	return nil
}

// scalar runs a query that sums to one value; no series gives 0.
func (q *queries) scalar(text string, at time.Time) (float64, error) {
	v, err := q.instant(text, at)
	if err != nil || len(v) == 0 {
		return 0, err
	}
	return float64(v[0].Value), nil
}

// valuesPerStep places a range query's points on the steps after from: point k covers
// (from + k·step, from + (k+1)·step]. Steps without a point are NaN.
func valuesPerStep(points []model.SamplePair, from time.Time, step time.Duration, steps int) []float64 {
	out := make([]float64, steps)
	for i := range out {
		out[i] = math.NaN()
	}
	for _, p := range points {
		k := int(math.Round(p.Timestamp.Time().Sub(from).Seconds()/step.Seconds())) - 1
		if k >= 0 && k < steps {
			out[k] = float64(p.Value)
		}
	}
	return out
}

// histogramFromBuckets converts the operator's buckets (bounds in seconds) to milliseconds.
func histogramFromBuckets(b []metrics.LatencyBucket) sim.Histogram {
	h := sim.Histogram{BoundsMS: make([]float64, len(b)), Cumulative: make([]float64, len(b))}
	for i, x := range b {
		h.BoundsMS[i] = x.UpperBoundSeconds * 1000
		h.Cumulative[i] = x.Count
	}
	return h
}

// histogramFromLe builds a histogram from `sum by (le)` series, sorted by bound.
func histogramFromLe(v model.Vector) sim.Histogram {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for _, s := range v {
		le, err := strconv.ParseFloat(string(s.Metric["le"]), 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, float64(s.Value)})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	var h sim.Histogram
	for _, b := range bs {
		h.BoundsMS = append(h.BoundsMS, b.le)
		h.Cumulative = append(h.Cumulative, b.count)
	}
	return h
}

// alternation is a regex matching exactly the given names, escaped for a PromQL string.
func alternation(names []string) string { return metrics.NamespaceRegex(names) }

// podRegex is a regex matching exactly the given names, for metrics.Request.PodRegex (which
// escapes it for PromQL itself).
func podRegex(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return strings.Join(quoted, "|")
}

// quote escapes a label value for a double-quoted PromQL string.
func quote(s string) string { return strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) }

// promDuration renders a duration as PromQL does (1h, 30s, 1m30s).
func promDuration(d time.Duration) string { return model.Duration(d).String() }

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
