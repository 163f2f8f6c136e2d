package metrics

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/api"
	"github.com/prometheus/client_golang/prometheus"
)

// maxConcurrentQueries bounds the queries in flight per Fetch: enough to overlap the round trips,
// few enough that a 200k-series cycle does not hold every decoded result at once.
const maxConcurrentQueries = 2

// maxCachedTemplates bounds the parsed-template cache fed by per-AdaptiveLoadBalancer overrides.
const maxCachedTemplates = 256

type prometheusSource struct {
	// client builds the endpoint URL (address plus path prefix) the way client_golang's v1 does;
	// requests go through http with the same round-tripper so that a 200,000-series body is
	// decoded as it streams in, where api.Client.Do would first read it whole.
	client    api.Client
	http      *http.Client
	timeout   time.Duration
	maxBytes  int64
	queries   QueryTemplates
	freshness QueryTemplates
	labels    Labels
	metrics   *instrumentation
	// histogram is the latency histogram query's template; empty when disabled.
	histogram string
	// remoteClusters is istiod's remote cluster count query's template (istiod.go).
	remoteClusters string
	// historyQuery is the load history query's template (DefaultHistoryQuery when empty).
	historyQuery string

	mu        sync.Mutex
	templates map[string]*template.Template
}

// New validates cfg and returns a Source that speaks the Prometheus HTTP API. Its query metrics
// are registered on reg (pass controller-runtime's metrics.Registry in the operator; nil skips).
func New(cfg Config, reg prometheus.Registerer) (Source, error) {
	client, rt, err := cfg.client()
	if err != nil {
		return nil, err
	}
	in, err := newInstrumentation(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics source metrics: %w", err)
	}
	return &prometheusSource{
		client:         client,
		http:           &http.Client{Transport: rt},
		timeout:        cfg.timeout(),
		maxBytes:       cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes),
		queries:        cfg.Queries.Or(DefaultQueries),
		freshness:      cfg.FreshnessQueries.Or(DefaultFreshnessQueries),
		labels:         cfg.Labels.withDefaults(),
		metrics:        in,
		histogram:      histogramTemplate(cfg),
		remoteClusters: cmp.Or(cfg.RemoteClustersQuery, DefaultRemoteClustersQuery),
		templates:      map[string]*template.Template{},
		historyQuery:   cfg.HistoryQuery,
	}, nil
}

func histogramTemplate(cfg Config) string {
	if cfg.DisableLatencyHistogram {
		return ""
	}
	return DefaultLatencyHistogramQuery
}

// signalQueries holds, per signal (in Signals order), the index of a pod's value query.
type signalQueries [4]int

func signalIndex(s Signal) int { return slices.Index(Signals, s) }

// plannedQuery is one distinct PromQL text of a cycle.
type plannedQuery struct {
	Query
	result podValues
	// histogram marks the latency histogram query, whose result is buckets.
	histogram bool
	buckets   podHistograms
}

// plan maps every (pod, signal) to the index of its value query and every signal to its
// freshness probe, rendering each distinct template once.
type plan struct {
	queries   []*plannedQuery
	byText    map[string]int
	value     []signalQueries // per pod
	freshness map[Signal]int
	// histogram is the index of the latency histogram query, -1 when none is sent.
	histogram int
}

func (p *plan) add(name string, signal Signal, text string) int {
	if i, ok := p.byText[text]; ok {
		q := p.queries[i]
		if !slices.Contains(q.Signals, signal) {
			q.Signals = append(q.Signals, signal)
		}
		return i
	}
	p.queries = append(p.queries, &plannedQuery{Query: Query{Name: name, Signals: []Signal{signal}, Text: text}})
	p.byText[text] = len(p.queries) - 1
	return len(p.queries) - 1
}

func validateRequest(req Request) error {
	var errs []error
	if req.Now.IsZero() {
		errs = append(errs, errors.New("request Now is zero; pass the cycle's evaluation time"))
	}
	if req.Window <= 0 {
		errs = append(errs, fmt.Errorf("request window %s must be positive", req.Window))
	}
	if req.Interval <= 0 {
		errs = append(errs, fmt.Errorf("request interval %s must be positive", req.Interval))
	}
	if len(req.Pods) == 0 && !req.Discover {
		errs = append(errs, errors.New("request has no pods"))
	}
	for i, p := range req.Pods {
		if p.Namespace == "" || p.Name == "" {
			errs = append(errs, fmt.Errorf("pod %d (%q/%q): namespace and name are required", i, p.Namespace, p.Name))
		}
	}
	return errors.Join(errs...)
}

func (s *prometheusSource) makePlan(req Request) (*plan, error) {
	p := &plan{byText: map[string]int{}, freshness: map[Signal]int{}, value: make([]signalQueries, len(req.Pods)), histogram: -1}
	allNamespaces := req.DiscoverNamespaces
	if len(req.Pods) > 0 {
		allNamespaces = nil
		for _, pod := range req.Pods {
			allNamespaces = appendNamespace(allNamespaces, pod.Namespace)
		}
	}
	for si, signal := range Signals {
		// One query per distinct effective template. Most pods use the source's template, so
		// only the pods with an override are grouped; the rest share the default query.
		defaultText := s.queries.For(signal)
		overrides := map[string][]int{}
		var order []string
		var defaultNamespaces []string
		defaultUsed := len(req.Pods) == 0
		if defaultUsed {
			defaultNamespaces = allNamespaces
		}
		for i, pod := range req.Pods {
			text := pod.Queries.For(signal)
			if text == "" || text == defaultText {
				defaultUsed = true
				defaultNamespaces = appendNamespace(defaultNamespaces, pod.Namespace)
				continue
			}
			if _, ok := overrides[text]; !ok {
				order = append(order, text)
			}
			overrides[text] = append(overrides[text], i)
		}
		if defaultUsed {
			qi := s.planValueQuery(p, signal, defaultText, NewTemplateData(defaultNamespaces, req.PodRegex, req.Window, s.labels))
			for i, pod := range req.Pods {
				if text := pod.Queries.For(signal); text == "" || text == defaultText {
					p.value[i][si] = qi
				}
			}
		}
		for _, text := range order {
			var namespaces []string
			for _, i := range overrides[text] {
				namespaces = appendNamespace(namespaces, req.Pods[i].Namespace)
			}
			qi := s.planValueQuery(p, signal, text, NewTemplateData(namespaces, req.PodRegex, req.Window, s.labels))
			for _, i := range overrides[text] {
				p.value[i][si] = qi
			}
		}
		if text := s.freshness.For(signal); text != "" {
			rendered, err := s.render(signal, text, NewTemplateData(allNamespaces, req.PodRegex, req.Window, s.labels))
			if err != nil {
				return nil, fmt.Errorf("freshness %w", err)
			}
			p.freshness[signal] = p.add("freshness", signal, rendered)
		}
	}
	// One histogram query for every pod of the cycle; discovery (metrics check) has no use for it.
	if s.histogram != "" && len(req.Pods) > 0 {
		q := &plannedQuery{Query: Query{Name: histogramQueryName, Text: s.histogram}, histogram: true}
		rendered, err := s.render(histogramQueryName, s.histogram, NewTemplateData(allNamespaces, req.PodRegex, req.Window, s.labels))
		if err != nil {
			q.Err = err
		} else {
			q.Text = rendered
		}
		p.queries = append(p.queries, q)
		p.histogram = len(p.queries) - 1
	}
	return p, nil
}

// planValueQuery renders a value query and adds it to the plan, returning its index. A template
// that fails to render becomes a failed query: a broken override fails only the pods that use it,
// never the whole cycle.
func (s *prometheusSource) planValueQuery(p *plan, signal Signal, text string, data TemplateData) int {
	rendered, err := s.render(signal, text, data)
	if err != nil {
		p.queries = append(p.queries, &plannedQuery{Query: Query{Name: string(signal), Signals: []Signal{signal}, Text: text, Err: err}})
		return len(p.queries) - 1
	}
	return p.add(string(signal), signal, rendered)
}

// appendNamespace skips a namespace equal to the last one: pods arrive grouped by namespace, so
// the list handed to the template stays about as short as the set of namespaces.
func appendNamespace(namespaces []string, ns string) []string {
	if n := len(namespaces); n > 0 && namespaces[n-1] == ns {
		return namespaces
	}
	return append(namespaces, ns)
}

func (s *prometheusSource) render(signal Signal, text string, data TemplateData) (string, error) {
	s.mu.Lock()
	t, ok := s.templates[text]
	s.mu.Unlock()
	if !ok {
		var err error
		if t, err = parseTemplate(string(signal), text); err != nil {
			return "", err
		}
		s.mu.Lock()
		if len(s.templates) >= maxCachedTemplates {
			clear(s.templates)
		}
		s.templates[text] = t
		s.mu.Unlock()
	}
	return execute(t, data)
}

// Fetch implements Source.
func (s *prometheusSource) Fetch(ctx context.Context, req Request) (Batch, error) {
	if err := validateRequest(req); err != nil {
		return Batch{}, fmt.Errorf("invalid metrics request: %w", err)
	}
	p, err := s.makePlan(req)
	if err != nil {
		return Batch{}, err
	}

	index, slotOf := newPodIndex(req.Pods)
	if len(req.Pods) == 0 {
		index = newOpenPodIndex()
	}
	sem := make(chan struct{}, maxConcurrentQueries)
	var wg sync.WaitGroup
	for _, q := range p.queries {
		if q.Err != nil { // failed to render: nothing to send
			s.metrics.errors.WithLabelValues(q.Name, Reason(q.Err)).Inc()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s.runPlanned(ctx, q, req.Now, index)
		}()
	}
	wg.Wait()

	batch := Batch{Queries: make([]Query, len(p.queries))}
	var errs []error
	for i, q := range p.queries {
		batch.Queries[i] = q.Query
		if q.Err != nil {
			errs = append(errs, &QueryError{Name: q.Name, Query: q.Text, Err: q.Err})
		}
	}

	pods := req.Pods
	podQueries := p.value
	if len(pods) == 0 {
		pods, podQueries, slotOf = discoveredPods(p, index)
	}
	var probes [len(signalQueries{})]*plannedQuery
	for si, signal := range Signals {
		if fi, ok := p.freshness[signal]; ok {
			probes[si] = p.queries[fi]
		}
	}
	batch.Observations = make([]Observation, len(pods))
	for i := range pods {
		obs := &batch.Observations[i]
		obs.Pod = pods[i]
		slot, key := slotOf[i], podKey{pods[i].Namespace, pods[i].Name}
		for si, signal := range Signals {
			q := p.queries[podQueries[i][si]]
			sample := Sample{Err: q.Err}
			if q.Err == nil {
				sample = q.result.valueSample(slot, key)
			}
			var probe *podValues
			var probeErr error
			if probes[si] != nil {
				probe, probeErr = &probes[si].result, probes[si].Err
			}
			sample = applyFreshness(sample, slot, key, probe, probeErr, req.Now, req.Interval)
			// Per-pod data faults are counted here; query failures were counted when they happened.
			if q.Err == nil && (errors.Is(sample.Err, ErrNonFinite) || errors.Is(sample.Err, ErrDuplicateSeries)) {
				s.metrics.errors.WithLabelValues(string(signal), Reason(sample.Err)).Inc()
			}
			if sample.Present && errors.Is(sample.Err, ErrStale) {
				s.metrics.stale.WithLabelValues(string(signal)).Inc()
			}
			*obs.Sample(signal) = sample
		}
		if p.histogram >= 0 {
			if q := p.queries[p.histogram]; q.Err != nil {
				obs.LatencyBucketsErr = q.Err
			} else {
				obs.LatencyBuckets, obs.LatencyBucketsErr = q.buckets.at(slot, key)
			}
		}
	}
	return batch, errors.Join(errs...)
}

// discoveredPods lists every pod found in the value queries' results, sorted, for Discover mode.
// Freshness probes also add slots to the open index; a pod only they returned is not listed.
func discoveredPods(p *plan, index *podIndex) ([]Pod, []signalQueries, []int32) {
	var slots []int32
	for slot := range int32(index.size()) {
		for _, q := range p.queries {
			if q.Name != "freshness" && q.result.has(slot) {
				slots = append(slots, slot)
				break
			}
		}
	}
	slices.SortFunc(slots, func(a, b int32) int {
		ka, kb := index.keys[a], index.keys[b]
		if c := strings.Compare(ka.namespace, kb.namespace); c != 0 {
			return c
		}
		return strings.Compare(ka.name, kb.name)
	})
	var valueQuery signalQueries
	for i, q := range p.queries {
		if q.Name != "freshness" {
			for _, s := range q.Signals {
				valueQuery[signalIndex(s)] = i
			}
		}
	}
	pods := make([]Pod, len(slots))
	queries := make([]signalQueries, len(slots))
	for i, slot := range slots {
		k := index.keys[slot]
		pods[i] = Pod{Namespace: k.namespace, Name: k.name}
		queries[i] = valueQuery
	}
	return pods, queries, slots
}

func (s *prometheusSource) runPlanned(ctx context.Context, q *plannedQuery, now time.Time, index *podIndex) {
	start := time.Now()
	decoded, warnings, err := s.query(ctx, q.Text, now, index, q.histogram)
	s.metrics.duration.WithLabelValues(q.Name).Observe(time.Since(start).Seconds())
	q.Warnings = warnings
	if err != nil {
		q.Err = err
		s.metrics.errors.WithLabelValues(q.Name, Reason(err)).Inc()
		return
	}
	q.result, q.buckets = decoded.result, decoded.buckets
	q.Series = decoded.series
	if unlabelled := q.result.unlabelled + q.buckets.unlabelled; unlabelled > 0 {
		q.Warnings = append(q.Warnings, fmt.Sprintf("%d series lack the %q or %q label and were ignored; aggregate by (%s, %s)",
			unlabelled, s.labels.Namespace, s.labels.Pod, s.labels.Namespace, s.labels.Pod))
	}
}

// query runs one instant query and turns every failure into a typed error. The request goes
// through the source's round-tripper (TLS, auth, headers); a successful body is decoded by
// decodeQueryResponse as it streams in, and each series is attributed through the cycle's index.
func (s *prometheusSource) query(ctx context.Context, text string, now time.Time, index *podIndex, histogram bool) (apiResponse, []string, error) {
	form := url.Values{}
	form.Set("query", text)
	form.Set("time", formatTime(now))
	var decoded apiResponse
	err := s.exchange(ctx, instantQueryPath, form, func(body io.Reader) (apiEnvelope, error) {
		var err error
		decoded, err = decodeResponse(body, s.labels, index, histogram)
		return decoded.apiEnvelope, err
	})
	var partial *PartialResponseError
	if errors.As(err, &partial) {
		return apiResponse{}, decoded.warnings, err
	}
	if err != nil {
		return apiResponse{}, nil, err
	}
	switch decoded.resultType {
	case "":
		return apiResponse{}, nil, fmt.Errorf("%w: response has no data", ErrMalformedResponse)
	case resultTypeVector:
	default:
		return apiResponse{}, nil, &UnexpectedResultTypeError{Got: decoded.resultType}
	}
	if decoded.series == 0 {
		return apiResponse{}, nil, &NoDataError{}
	}
	return decoded, nil, nil
}

// exchange sends one query's form to path with the source's timeout, by POST or, where a
// read-only gateway refuses POST, by GET (as v1 does), decodes the body with decode as it streams
// in, and turns every failure into a typed error: the transport's, the HTTP status's, a body too
// large or cut off, a malformed body, the API's error status, and its warnings (a partial
// response).
func (s *prometheusSource) exchange(ctx context.Context, path string, form url.Values, decode func(io.Reader) (apiEnvelope, error)) error {
	qctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	form.Set("timeout", s.timeout.String())
	resp, err := s.send(qctx, path, form, http.MethodPost)
	if err == nil && (resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented) {
		discardBody(resp)
		resp, err = s.send(qctx, path, form, http.MethodGet)
	}
	if err != nil {
		return classify(ctx, qctx, err, s.timeout)
	}
	defer discardBody(resp)
	if resp.StatusCode/100 != 2 {
		return s.statusError(ctx, qctx, resp)
	}
	body := &readErrorRecorder{r: &cappedReader{r: resp.Body, left: s.maxBytes, limit: s.maxBytes}}
	envelope, decodeErr := decode(body)
	if errors.Is(body.err, ErrResponseTooLarge) {
		return body.err
	}
	if body.err != nil { // the transport failed mid-body: a timeout or a reset, not bad JSON
		return classify(ctx, qctx, body.err, s.timeout)
	}
	if decodeErr != nil {
		return fmt.Errorf("%w (is the URL a Prometheus-compatible API?)", decodeErr)
	}
	if envelope.status == "error" {
		return fmt.Errorf("%w: %s: %s", ErrMalformedResponse, envelope.errorType, envelope.errorText)
	}
	if len(envelope.warnings) > 0 {
		return &PartialResponseError{Warnings: envelope.warnings}
	}
	return nil
}

// cappedReader fails with ErrResponseTooLarge once more than limit bytes were read.
type cappedReader struct {
	r           io.Reader
	left, limit int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("%w: more than %d bytes; the query selects far more series than the Service's pods", ErrResponseTooLarge, c.limit)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// maxErrorBodyBytes bounds what is read of a non-2xx body.
const maxErrorBodyBytes = 64 << 10

// readErrorRecorder remembers a transport error met while the decoder reads the body, so that it
// is reported as a timeout or an unreachable TSDB instead of as malformed JSON.
type readErrorRecorder struct {
	r   io.Reader
	err error
}

func (r *readErrorRecorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && r.err == nil {
		r.err = err
	}
	return n, err
}

// discardBody drains a little of what the decoder left (so the connection can be reused) and
// closes the body.
func discardBody(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBodyBytes))
	_ = resp.Body.Close()
}

// The API paths of the two kinds of query.
const (
	instantQueryPath = "/api/v1/query"
	rangeQueryPath   = "/api/v1/query_range"
)

// send sends a query's form to path, as a POST form or as a GET's query string.
func (s *prometheusSource) send(ctx context.Context, path string, form url.Values, method string) (*http.Response, error) {
	endpoint := s.client.URL(path, nil)
	var body io.Reader
	if method == http.MethodGet {
		endpoint.RawQuery = form.Encode()
	} else {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building the query request for %s: %w", endpoint.Redacted(), err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return s.http.Do(req)
}

// statusError reads a non-2xx answer into an *HTTPStatusError, quoting the API's own error text
// when the body has one, else the start of the body as it came.
func (s *prometheusSource) statusError(ctx, qctx context.Context, resp *http.Response) error {
	// Error bodies are small; read a bounded prefix to quote it.
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
	if readErr != nil {
		return classify(ctx, qctx, readErr, s.timeout)
	}
	detail := truncate(string(body), 1000)
	if decoded, err := decodeMatrix(bytes.NewReader(body)); err == nil && decoded.status == "error" && decoded.errorText != "" {
		detail = decoded.errorText
	}
	return &HTTPStatusError{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header), Detail: strings.TrimSpace(detail)}
}

// formatTime renders t as Unix seconds with the fraction the API accepts.
func formatTime(t time.Time) string {
	return strconv.FormatFloat(float64(t.Unix())+float64(t.Nanosecond())/1e9, 'f', -1, 64)
}

// classify turns a transport failure of client.Do into a typed error.
func classify(parent, qctx context.Context, err error, timeout time.Duration) error {
	if parent.Err() != nil {
		return parent.Err() // the caller gave up; not a TSDB fault
	}
	var netErr net.Error
	switch {
	case errors.Is(qctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Errorf("%w after %s: raise --timeout or make the query cheaper (%v)", ErrTimeout, timeout, err)
	case isUnreachable(err):
		return fmt.Errorf("%w: %v (check the URL, DNS, network policy and that the TSDB is running)", ErrUnreachable, err)
	}
	return err
}

func isUnreachable(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.Is(err, io.ErrUnexpectedEOF) || // the connection closed in the middle of a body
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.As(err, &opErr) || errors.As(err, &dnsErr)
}

// parseRetryAfter reads delay-seconds or an HTTP-date relative to the response's Date header.
func parseRetryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	date, err := http.ParseTime(h.Get("Date"))
	if err != nil || !at.After(date) {
		return 0
	}
	return at.Sub(date)
}
