package metrics

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
)

// NewAPI returns client_golang's Prometheus API client for the configured TSDB, through the same
// transport as the Source: TLS, bearer token or basic auth, extra headers, the path prefix. It
// serves tools that read a few series over a range of time (`adaptive-lb simulate --from-tsdb`);
// the operator's cycle goes through Source, whose decoder is built for 200,000 pods.
func NewAPI(cfg Config) (v1.API, error) {
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
	return v1.NewAPI(client), nil
}

// QueryTimeout is the per-query timeout the configuration asks for (DefaultTimeout when unset).
func (c Config) QueryTimeout() time.Duration { return c.timeout() }
