package metrics

import (
	"context"
	"errors"
	"fmt"
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
	client    api.Client
	timeout   time.Duration
	queries   QueryTemplates
	freshness QueryTemplates
	labels    Labels
	metrics   *instrumentation

	mu        sync.Mutex
	templates map[string]*template.Template
}

// New validates cfg and returns a Source that speaks the Prometheus HTTP API. Its query metrics
// are registered on reg (pass controller-runtime's metrics.Registry in the operator; nil skips).
func New(cfg Config, reg prometheus.Registerer) (Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("metrics source configuration: %w", err)
	}
	rt, err := cfg.roundTripper()
	if err != nil {
		return nil, fmt.Errorf("metrics source configuration: %w", err)
	}
	client, err := api.NewClient(api.Config{Address: cfg.address(), RoundTripper: rt})
	if err != nil {
		return nil, fmt.Errorf("metrics source configuration: url %q: %w", cfg.address(), err)
	}
	in, err := newInstrumentation(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics source metrics: %w", err)
	}
	return &prometheusSource{
		client:    client,
		timeout:   cfg.timeout(),
		queries:   cfg.Queries.Or(DefaultQueries),
		freshness: cfg.FreshnessQueries.Or(DefaultFreshnessQueries),
		labels:    cfg.Labels.withDefaults(),
		metrics:   in,
		templates: map[string]*template.Template{},
	}, nil
}

// signalQueries holds, per signal (in Signals order), the index of a pod's value query.
type signalQueries [4]int

func signalIndex(s Signal) int { return slices.Index(Signals, s) }

// plannedQuery is one distinct PromQL text of a cycle.
type plannedQuery struct {
	Query
	result podValues
}

// plan maps every (pod, signal) to the index of its value query and every signal to its
// freshness probe, rendering each distinct template once.
type plan struct {
	queries   []*plannedQuery
	byText    map[string]int
	value     []signalQueries // per pod
	freshness map[Signal]int
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
	p := &plan{byText: map[string]int{}, freshness: map[Signal]int{}, value: make([]signalQueries, len(req.Pods))}
	allNamespaces := req.DiscoverNamespaces
	if len(req.Pods) > 0 {
		allNamespaces = make([]string, 0, len(req.Pods))
		for _, pod := range req.Pods {
			allNamespaces = append(allNamespaces, pod.Namespace)
		}
	}
	for si, signal := range Signals {
		// Group pods by their effective template: one query per distinct template.
		groups := map[string][]int{}
		var order []string
		for i, pod := range req.Pods {
			text := pod.Queries.For(signal)
			if text == "" {
				text = s.queries.For(signal)
			}
			if _, ok := groups[text]; !ok {
				order = append(order, text)
			}
			groups[text] = append(groups[text], i)
		}
		if len(req.Pods) == 0 {
			order = []string{s.queries.For(signal)}
		}
		for _, text := range order {
			namespaces := allNamespaces
			if members := groups[text]; len(req.Pods) > 0 {
				namespaces = make([]string, len(members))
				for j, i := range members {
					namespaces[j] = req.Pods[i].Namespace
				}
			}
			rendered, err := s.render(signal, text, NewTemplateData(namespaces, req.PodRegex, req.Window, s.labels))
			var qi int
			if err != nil {
				// A broken override fails only the pods that use it, never the whole cycle.
				p.queries = append(p.queries, &plannedQuery{Query: Query{Name: string(signal), Signals: []Signal{signal}, Text: text, Err: err}})
				qi = len(p.queries) - 1
			} else {
				qi = p.add(string(signal), signal, rendered)
			}
			for _, i := range groups[text] {
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
	return p, nil
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
			s.runPlanned(ctx, q, req.Now, len(req.Pods))
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
		pods, podQueries = discoveredPods(p)
	}
	batch.Observations = make([]Observation, len(pods))
	for i, pod := range pods {
		obs := Observation{Pod: pod}
		key := podKey{pod.Namespace, pod.Name}
		for si, signal := range Signals {
			q := p.queries[podQueries[i][si]]
			sample := Sample{Err: q.Err}
			if q.Err == nil {
				sample = q.result.valueSample(key)
			}
			var probe *podValues
			var probeErr error
			if fi, ok := p.freshness[signal]; ok {
				probe, probeErr = &p.queries[fi].result, p.queries[fi].Err
			}
			sample = applyFreshness(sample, key, probe, probeErr, req.Now, req.Interval)
			// Per-pod data faults are counted here; query failures were counted when they happened.
			if q.Err == nil && (errors.Is(sample.Err, ErrNonFinite) || errors.Is(sample.Err, ErrDuplicateSeries)) {
				s.metrics.errors.WithLabelValues(string(signal), Reason(sample.Err)).Inc()
			}
			*obs.Sample(signal) = sample
		}
		batch.Observations[i] = obs
	}
	return batch, errors.Join(errs...)
}

// discoveredPods lists every pod found in the value queries' results, sorted, for Discover mode.
func discoveredPods(p *plan) ([]Pod, []signalQueries) {
	seen := map[podKey]bool{}
	for _, q := range p.queries {
		if q.Name == "freshness" {
			continue
		}
		for k := range q.result.values {
			seen[k] = true
		}
		for k := range q.result.duplicates {
			seen[k] = true
		}
	}
	keys := make([]podKey, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b podKey) int {
		return strings.Compare(a.namespace+"/"+a.name, b.namespace+"/"+b.name)
	})
	pods := make([]Pod, len(keys))
	queries := make([]signalQueries, len(keys))
	var valueQuery signalQueries
	for i, q := range p.queries {
		if q.Name != "freshness" {
			for _, s := range q.Signals {
				valueQuery[signalIndex(s)] = i
			}
		}
	}
	for i, k := range keys {
		pods[i] = Pod{Namespace: k.namespace, Name: k.name}
		queries[i] = valueQuery
	}
	return pods, queries
}

func (s *prometheusSource) runPlanned(ctx context.Context, q *plannedQuery, now time.Time, podsHint int) {
	start := time.Now()
	result, series, warnings, err := s.query(ctx, q.Text, now, podsHint)
	s.metrics.duration.WithLabelValues(q.Name).Observe(time.Since(start).Seconds())
	q.Warnings = warnings
	if err != nil {
		q.Err = err
		s.metrics.errors.WithLabelValues(q.Name, Reason(err)).Inc()
		return
	}
	q.result = result
	q.Series = series
	if q.result.unlabelled > 0 {
		q.Warnings = append(q.Warnings, fmt.Sprintf("%d series lack the %q or %q label and were ignored; aggregate by (%s, %s)",
			q.result.unlabelled, s.labels.Namespace, s.labels.Pod, s.labels.Namespace, s.labels.Pod))
	}
}

// query runs one instant query and turns every failure into a typed error. HTTP goes through
// client_golang's api.Client (transport, auth, TLS); the body is decoded by decodeQueryResponse.
// podsHint is the number of pods the cycle expects (0 if unknown); it presizes the result.
func (s *prometheusSource) query(ctx context.Context, text string, now time.Time, podsHint int) (podValues, int, []string, error) {
	qctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	form := url.Values{}
	form.Set("query", text)
	form.Set("time", formatTime(now))
	form.Set("timeout", s.timeout.String())
	resp, body, err := s.post(qctx, form)
	if err == nil && (resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented) {
		// Read-only gateways may refuse POST; v1 falls back to GET the same way.
		resp, body, err = s.get(qctx, form)
	}
	if err != nil {
		return podValues{}, 0, nil, classify(ctx, qctx, err, s.timeout)
	}
	decoded, decodeErr := decodeQueryResponse(body, s.labels, podsHint)
	if resp.StatusCode/100 != 2 {
		detail := truncate(string(body), 1000)
		// Prefer the API's own error text; a non-JSON body is shown as it came.
		if decodeErr == nil && decoded.status == "error" && decoded.errorText != "" {
			detail = decoded.errorText
		}
		return podValues{}, 0, nil, &HTTPStatusError{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header), Detail: strings.TrimSpace(detail)}
	}
	if decodeErr != nil {
		return podValues{}, 0, nil, fmt.Errorf("%w (is the URL a Prometheus-compatible API?)", decodeErr)
	}
	if decoded.status == "error" {
		return podValues{}, 0, nil, fmt.Errorf("%w: %s: %s", ErrMalformedResponse, decoded.errorType, decoded.errorText)
	}
	if len(decoded.warnings) > 0 {
		return podValues{}, 0, decoded.warnings, &PartialResponseError{Warnings: decoded.warnings}
	}
	switch decoded.resultType {
	case "":
		return podValues{}, 0, nil, fmt.Errorf("%w: response has no data", ErrMalformedResponse)
	case resultTypeVector:
	default:
		return podValues{}, 0, nil, &UnexpectedResultTypeError{Got: decoded.resultType}
	}
	if decoded.series == 0 {
		return podValues{}, 0, nil, &NoDataError{}
	}
	return decoded.result, decoded.series, nil, nil
}

func (s *prometheusSource) post(ctx context.Context, form url.Values) (*http.Response, []byte, error) {
	endpoint := s.client.URL("/api/v1/query", nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, nil, fmt.Errorf("building the query request for %s: %w", endpoint.Redacted(), err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return s.client.Do(ctx, req)
}

func (s *prometheusSource) get(ctx context.Context, form url.Values) (*http.Response, []byte, error) {
	endpoint := s.client.URL("/api/v1/query", nil)
	endpoint.RawQuery = form.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint.String(), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("building the query request for %s: %w", endpoint.Redacted(), err)
	}
	return s.client.Do(ctx, req)
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
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
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
