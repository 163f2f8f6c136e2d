package metrics

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
)

// NewAPI returns client_golang's Prometheus API client for the configured TSDB, through the same
// transport as the Source: TLS, bearer token or basic auth, extra headers, the path prefix. It
// serves tools that read a few series over a range of time (`adaptive-lb simulate --from-tsdb`);
// the operator's cycle goes through Source, whose decoder is built for 200,000 pods.
func NewAPI(cfg Config) (v1.API, error) {
	client, _, err := cfg.client()
	if err != nil {
		return nil, err
	}
	return v1.NewAPI(client), nil
}

// client validates the configuration and builds the client for its address and the transport
// chain under it.
func (c Config) client() (api.Client, http.RoundTripper, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("metrics source configuration: %w", err)
	}
	rt, err := c.roundTripper()
	if err != nil {
		return nil, nil, fmt.Errorf("metrics source configuration: %w", err)
	}
	client, err := api.NewClient(api.Config{Address: c.address(), RoundTripper: rt})
	if err != nil {
		return nil, nil, fmt.Errorf("metrics source configuration: url %q: %w", c.address(), err)
	}
	return client, rt, nil
}

// QueryTimeout is the per-query timeout the configuration asks for (DefaultTimeout when unset).
func (c Config) QueryTimeout() time.Duration { return c.timeout() }
