package metrics

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultMaxResponseBytes bounds one query's response when Config.MaxResponseBytes is zero.
// The operator's queries return one series per pod, about 200 bytes each: 64 MiB is some
// 300,000 pods. A query that returns more (an override that selects far too many series) is
// refused instead of holding the cycle and the operator's memory.
const DefaultMaxResponseBytes = 64 << 20

// DefaultTimeout bounds each query when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Config describes how to reach the TSDB and which queries to send.
type Config struct {
	// URL is the TSDB's base URL, e.g. http://vmselect:8481 or https://prometheus.example:9090.
	URL string
	// PathPrefix is prepended to /api/v1/query, e.g. /select/0/prometheus for VictoriaMetrics
	// cluster or /prometheus for Mimir. It may also be part of URL.
	PathPrefix string
	// Timeout bounds each query (client side, and sent to the server as the query timeout).
	Timeout time.Duration
	// MaxResponseBytes bounds one query's response; 0 is DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// LatencyOffset, when set, goes with every query as VictoriaMetrics' latency_offset
	// argument, overriding its -search.latencyOffset (30 s by default): 0 reads the newest
	// samples the TSDB has. nil sends no argument, and VictoriaMetrics then answers a query for
	// "now" as of its own offset ago. Prometheus, Thanos and Mimir do not read it.
	LatencyOffset *time.Duration

	// BearerTokenFile is read before the first request and re-read whenever its size or mtime
	// changes, so rotated service-account or vault tokens are picked up.
	BearerTokenFile string
	// BasicAuth is used when Username is set. Exclusive with BearerTokenFile.
	BasicAuth BasicAuth
	TLS       TLSConfig
	// Headers are added to every request, e.g. X-Scope-OrgID for Mimir/Cortex tenants.
	Headers map[string]string

	// Queries overrides the built-in value queries per signal (cluster level).
	Queries QueryTemplates
	// FreshnessQueries overrides the built-in freshness probes per signal.
	FreshnessQueries QueryTemplates
	// Labels overrides the label names that identify pods.
	Labels Labels
	// RemoteClustersQuery replaces DefaultRemoteClustersQuery, istiod's count of the remote
	// clusters it reads ({{.Namespaces}} is istiod's namespace): for a TSDB that holds several
	// clusters' series, one that selects this cluster's.
	RemoteClustersQuery string
	// DisableLatencyHistogram leaves out the per-pod latency histogram query
	// (DefaultLatencyHistogramQuery): its response has one series per pod and bucket, about
	// twenty times the other queries', which the largest fleets may not want to pay for.
	DisableLatencyHistogram bool
	// HistoryQuery replaces DefaultHistoryQuery, the template of a Service's summed request rate
	// over its past (HistorySource), for installs that relabel Istio's metrics.
	HistoryQuery string
}

// BasicAuth holds HTTP basic-auth credentials; PasswordFile wins over Password.
type BasicAuth struct {
	Username     string
	Password     string
	PasswordFile string
}

// TLSConfig configures the client side of TLS.
type TLSConfig struct {
	CAFile             string
	CertFile           string
	KeyFile            string
	ServerName         string
	InsecureSkipVerify bool
}

// Validate checks the configuration as a whole and reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("url is required, e.g. http://vmselect.monitoring:8481"))
	} else if u, err := url.Parse(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("url %q: %w", c.URL, err))
	} else if u.Scheme != "http" && u.Scheme != "https" {
		errs = append(errs, fmt.Errorf("url %q: scheme must be http or https", c.URL))
	} else if u.Host == "" {
		errs = append(errs, fmt.Errorf("url %q: host is missing", c.URL))
	}
	if c.PathPrefix != "" && !strings.HasPrefix(c.PathPrefix, "/") {
		errs = append(errs, fmt.Errorf("path prefix %q must start with /", c.PathPrefix))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %s must not be negative", c.Timeout))
	}
	if c.LatencyOffset != nil {
		if err := validateLatencyOffset(*c.LatencyOffset); err != nil {
			errs = append(errs, err)
		}
	}
	if c.BearerTokenFile != "" && c.BasicAuth.Username != "" {
		errs = append(errs, errors.New("bearer token file and basic auth are mutually exclusive: set one"))
	}
	if c.BasicAuth.Username == "" && (c.BasicAuth.Password != "" || c.BasicAuth.PasswordFile != "") {
		errs = append(errs, errors.New("basic auth password given without a username"))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, errors.New("TLS client certificate and key must be given together"))
	}
	for name := range c.Headers {
		if name == "" || strings.ContainsAny(name, " :\r\n") {
			errs = append(errs, fmt.Errorf("header name %q is not a valid HTTP header name", name))
		}
		if strings.EqualFold(name, "Authorization") {
			errs = append(errs, errors.New("set the Authorization header through the bearer token file or basic auth, not as an extra header"))
		}
	}
	if c.RemoteClustersQuery != "" {
		if err := ValidateTemplate(remoteClustersQueryName, c.RemoteClustersQuery); err != nil {
			errs = append(errs, fmt.Errorf("remote clusters query: %w", err))
		}
	}
	for _, set := range []struct {
		kind string
		q    QueryTemplates
	}{{"query", c.Queries}, {"freshness query", c.FreshnessQueries}} {
		for _, s := range Signals {
			if text := set.q.For(s); text != "" {
				if err := ValidateTemplate(string(s), text); err != nil {
					errs = append(errs, fmt.Errorf("%s for %s: %w", set.kind, s, err))
				}
			}
		}
	}
	if c.HistoryQuery != "" {
		if err := ValidateHistoryTemplate(c.HistoryQuery); err != nil {
			errs = append(errs, fmt.Errorf("load history query: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (c Config) timeout() time.Duration {
	if c.Timeout == 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// address joins URL and PathPrefix.
func (c Config) address() string {
	return strings.TrimRight(c.URL, "/") + strings.TrimRight(c.PathPrefix, "/")
}

// roundTripper builds the transport chain: TLS at the bottom, then auth, then extra headers, then
// the latency_offset argument.
// TLS files (CA, client certificate and key) are re-read when they change, like the bearer token.
func (c Config) roundTripper() (http.RoundTripper, error) {
	newTransport := func(tlsConfig *tls.Config) *http.Transport {
		return &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       tlsConfig,
			TLSHandshakeTimeout:   5 * time.Second,
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: c.timeout(),
		}
	}
	var rt http.RoundTripper
	if c.TLS.hasFiles() {
		reloading, err := newTLSFileTransport(c.TLS, newTransport)
		if err != nil {
			return nil, err
		}
		rt = reloading
	} else {
		tlsConfig, err := c.TLS.build()
		if err != nil {
			return nil, err
		}
		rt = newTransport(tlsConfig)
	}
	switch {
	case c.BearerTokenFile != "":
		rt = NewBearerTokenFileRoundTripper(c.BearerTokenFile, rt)
	case c.BasicAuth.Username != "":
		rt = &basicAuthRoundTripper{auth: c.BasicAuth, next: rt}
	}
	if len(c.Headers) > 0 {
		rt = &headerRoundTripper{headers: c.Headers, next: rt}
	}
	if c.LatencyOffset != nil {
		rt = newLatencyOffsetRoundTripper(*c.LatencyOffset, rt)
	}
	return rt, nil
}

func (t TLSConfig) build() (*tls.Config, error) {
	cfg := &tls.Config{
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // explicit user opt-in for test setups
		MinVersion:         tls.VersionTLS12,
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading TLS client certificate %s / key %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

type headerRoundTripper struct {
	headers map[string]string
	next    http.RoundTripper
}

func (h *headerRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range h.headers {
		req.Header.Set(k, v)
	}
	return h.next.RoundTrip(req)
}

type basicAuthRoundTripper struct {
	auth BasicAuth
	next http.RoundTripper
}

func (b *basicAuthRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	password := b.auth.Password
	if b.auth.PasswordFile != "" {
		data, err := os.ReadFile(b.auth.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("reading basic auth password file: %w", err)
		}
		password = strings.TrimSpace(string(data))
	}
	req = req.Clone(req.Context())
	req.SetBasicAuth(b.auth.Username, password)
	return b.next.RoundTrip(req)
}
