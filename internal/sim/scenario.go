package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

//go:embed scenarios/*.yaml
var builtins embed.FS

// DefaultScenario is the scenario `adaptive-lb simulate` runs without --scenario.
const DefaultScenario = "seed-fib"

// Scenario describes a fleet, its clients, its load and the controller. Field names are a public
// format: add fields, never rename them.
type Scenario struct {
	Name       string     `json:"name"`
	Duration   Duration   `json:"duration"`
	Warmup     Duration   `json:"warmup"`
	Seed       int64      `json:"seed"`
	Load       Load       `json:"load"`
	Clients    Clients    `json:"clients"`
	Controller Controller `json:"controller"`
	Pods       []PodGroup `json:"pods"`
}

// Load is the offered request rate.
type Load struct {
	RPS     float64 `json:"rps"`
	Arrival string  `json:"arrival"` // poisson | constant
	Phases  []Phase `json:"phases,omitempty"`
	// History is what the TSDB holds of the Service's load before the run, which the controller
	// learns its caution from (docs/simulator.md, "History"): HistorySame (the default: the past
	// days had this run's load shape), HistorySteady (the load never rose: the run's first rate
	// throughout) or HistoryNone (a new Service: no history).
	History string `json:"history,omitempty"`
}

// Load histories.
const (
	HistorySame   = "same"
	HistorySteady = "steady"
	HistoryNone   = "none"
)

var histories = []string{HistorySame, HistorySteady, HistoryNone}

// Phase changes the offered rate at a simulated time.
type Phase struct {
	At  Duration `json:"at"`
	RPS float64  `json:"rps"`
}

// Clients are the client sidecars (Envoy proxies) that balance requests over the pods.
type Clients struct {
	Proxies           int      `json:"proxies"`
	Workers           int      `json:"workers"`
	LB                string   `json:"lb"`
	ChoiceCount       int      `json:"choice_count"`
	ActiveRequestBias *float64 `json:"active_request_bias,omitempty"`
	NetworkLatency    Duration `json:"network_latency"`
	// ProbeRTT is how long a Prequal probe takes to come back (default: network_latency, or 1ms).
	ProbeRTT Duration `json:"probe_rtt,omitempty"`
}

// Controller configures the adaptive-lb loop inside the simulation.
type Controller struct {
	Interval   Duration `json:"interval"`
	Window     Duration `json:"window"`
	ApplyDelay Duration `json:"apply_delay"`
	// FastCheckInterval is how often, between two cycles, the controller reads each pod's newest
	// signals over FastCheckWindow and relieves a pod whose latency or CPU has jumped (the
	// operator's --fast-check-interval). Default: the scrape interval, when the controller reads
	// the newest data (query_latency_offset below the scrape interval), else off; 0s turns it off.
	// Only adaptive-lb's own algorithms (capacity, tail) check between cycles.
	FastCheckInterval *Duration `json:"fast_check_interval,omitempty"`
	// FastCheckWindow is the window of the check's rates: default twice the scrape interval, the
	// shortest that holds two samples on every TSDB.
	FastCheckWindow Duration `json:"fast_check_window,omitempty"`
	// Metrics is the TSDB between the pods and the controller: how often it samples the pods'
	// counters and how far in the past it answers. The defaults are a stock install's.
	Metrics Metrics `json:"metrics"`
}

// Metrics describes how the operator's TSDB samples and delays what the controller reads
// (docs/simulator.md, "Metrics lag"). The peers are not affected: they measure in-band.
type Metrics struct {
	// ScrapeInterval is how often every pod's sidecar (request counters, latency histogram) and
	// its cAdvisor CPU counter are scraped, each pod and job at its own phase. Default
	// DefaultScrapeInterval, or the window when that is shorter. Whole seconds.
	ScrapeInterval Duration `json:"scrape_interval"`
	// LatencyOffset is how far in the past the TSDB evaluates a query for "now"
	// (VictoriaMetrics -search.latencyOffset). Default DefaultLatencyOffset; 0s for Prometheus,
	// Thanos or Mimir.
	LatencyOffset *Duration `json:"latency_offset,omitempty"`
	// QueryLatencyOffset is the offset adaptive-lb's queries ask for instead (VictoriaMetrics'
	// latency_offset query argument, the operator's --tsdb-latency-offset). Default 0s: the
	// newest data. The published operator's rules (cpu-distance, cpu-share) do not ask and read
	// at LatencyOffset.
	QueryLatencyOffset *Duration `json:"query_latency_offset,omitempty"`
	// IngestionDelay is how long a scraped sample takes to become visible to queries: the
	// scraper's remote-write flush and the TSDB's in-memory buffer. It matters only when it
	// exceeds the offset a query is evaluated at. Default DefaultIngestionDelay.
	IngestionDelay *Duration `json:"ingestion_delay,omitempty"`
}

// Defaults of the metrics lag: a stock install. Istio's sample Prometheus configuration
// (samples/addons/prometheus.yaml) scrapes the sidecars (job kubernetes-pods) and cAdvisor
// (kubernetes-nodes-cadvisor) every 15 s, the interval docs/metrics.md assumes; VictoriaMetrics
// answers a query for now as of 30 s ago (-search.latencyOffset=30s).
//
// A scraped sample becomes visible to queries about DefaultIngestionDelay later: vmagent flushes
// its remote write every second (-remoteWrite.flushInterval=1s), and VictoriaMetrics v1.110.0
// makes an existing series' next sample searchable 2.1 to 3.9 s after it is written (median 3.1 s,
// BenchmarkVictoriaMetrics_IngestionToVisibility in docs/benchmarks.md).
const (
	DefaultScrapeInterval = 15 * time.Second
	DefaultLatencyOffset  = 30 * time.Second
	DefaultIngestionDelay = 4 * time.Second
)

// NoMetricsLag is the metrics setting of an ideal TSDB: every counter sampled every second, and
// queries answered for the instant asked. It is how the simulator read metrics before it modelled
// the lag, and what `--no-metrics-lag` sets for comparisons.
func NoMetricsLag() Metrics {
	return Metrics{ScrapeInterval: Duration{time.Second}, LatencyOffset: &Duration{0}, QueryLatencyOffset: &Duration{0}, IngestionDelay: &Duration{0}}
}

// OffsetFor is the offset a policy's queries are evaluated at: adaptive-lb's own algorithms ask
// for QueryLatencyOffset, the published operator's rules read at the TSDB's LatencyOffset.
func (m Metrics) OffsetFor(policy string) time.Duration {
	if policy == PolicyCPUDistance || policy == PolicyCPUShare {
		return m.LatencyOffset.Duration
	}
	return m.QueryLatencyOffset.Duration
}

// PodGroup is a set of identical pods.
type PodGroup struct {
	Name     string     `json:"name"`
	Replicas int        `json:"replicas"`
	Workers  int        `json:"workers"`
	Cores    float64    `json:"cores,omitempty"`
	CPULimit float64    `json:"cpu_limit,omitempty"`
	Speed    float64    `json:"speed,omitempty"`
	Cost     Cost       `json:"cost"`
	Events   []PodEvent `json:"events,omitempty"`
}

// Cost is the CPU time one request needs on hardware of speed 1: its mean and its distribution.
// A mixture's mean is its parts' (cost.mean may be left out, or must agree with them).
type Cost struct {
	Mean Duration `json:"mean"`
	Dist string   `json:"dist"` // constant | exponential | lognormal | gamma | mixture
	// CV is the coefficient of variation of a lognormal or gamma cost.
	CV    float64    `json:"cv,omitempty"`
	Parts []CostPart `json:"parts,omitempty"`
}

// CostPart is one part of a mixture: a share of the requests whose cost has its own distribution
// (a cache hit and a miss; the calls that wait on a slow dependency).
type CostPart struct {
	Share float64  `json:"share"`
	Mean  Duration `json:"mean"`
	Dist  string   `json:"dist"`
	CV    float64  `json:"cv,omitempty"`
}

// mixtureMean is the mean of the parts' costs.
func (c Cost) mixtureMean() time.Duration {
	m := 0.0
	for _, p := range c.Parts {
		m += p.Share * p.Mean.Seconds()
	}
	return time.Duration(math.Round(m * float64(time.Second)))
}

// PodEvent changes a pod group at a simulated time: its speed (a noisy neighbour) or its
// replica count (a scale or a rolling restart).
type PodEvent struct {
	At       Duration `json:"at"`
	Speed    *float64 `json:"speed,omitempty"`
	Replicas *int     `json:"replicas,omitempty"`
	// Restart replaces every pod of the group one by one, this far apart.
	Restart *Duration `json:"restart_every,omitempty"`
}

// Client load-balancing policies, named as in Envoy's configuration.
const (
	LBRoundRobin   = "round_robin"
	LBRandom       = "random"
	LBLeastRequest = "least_request"
)

var (
	lbPolicies    = []string{LBRoundRobin, LBRandom, LBLeastRequest}
	distributions = []string{CostConstant, CostExponential, CostLognormal, CostGamma, CostMixture}
	partDists     = []string{CostConstant, CostExponential, CostLognormal, CostGamma}
	arrivals      = []string{"poisson", "constant"}
)

// Duration is a time.Duration written as "600s", "2ms" or "1m30s" in scenario files.
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"600s\" or \"2ms\", got %s", string(b))
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"600s\" or \"2ms\", got %q", s)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// ScenarioError names the file and the field that is wrong, and what is allowed.
type ScenarioError struct {
	File  string
	Field string
	Msg   string
}

func (e *ScenarioError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("scenario %s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("scenario %s: field %s: %s", e.File, e.Field, e.Msg)
}

// LoadScenarioFile reads and validates a scenario file.
func LoadScenarioFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ScenarioError{File: path, Msg: fmt.Sprintf("cannot read it: %v", err)}
	}
	return ParseScenario(data, path)
}

// Builtin returns a scenario embedded in the binary, by name.
func Builtin(name string) (*Scenario, error) {
	data, err := builtins.ReadFile("scenarios/" + name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no built-in scenario %q; built-in scenarios are %v", name, BuiltinNames())
	}
	return ParseScenario(data, "builtin:"+name)
}

// BuiltinNames lists the embedded scenarios.
func BuiltinNames() []string {
	entries, _ := builtins.ReadDir("scenarios")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return names
}

// ParseScenario decodes YAML strictly (unknown fields are errors), fills defaults and validates.
// file names the source in error messages.
func ParseScenario(data []byte, file string) (*Scenario, error) {
	var s Scenario
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &ScenarioError{File: file, Msg: "the file is empty; see docs/simulator.md for the format"}
	}
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, &ScenarioError{File: file, Msg: cleanYAMLError(err)}
	}
	s.applyDefaults()
	if err := s.validate(); err != nil {
		var se *ScenarioError
		if errors.As(err, &se) {
			se.File = file
		}
		return nil, err
	}
	return &s, nil
}

// cleanYAMLError turns the decoder's wording into something a scenario author can act on.
func cleanYAMLError(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: while decoding JSON: ")
	if i := strings.Index(msg, "unknown field "); i >= 0 {
		return msg[i:] + "; check the spelling against docs/simulator.md"
	}
	return msg
}

func (s *Scenario) applyDefaults() {
	if s.Load.Arrival == "" {
		s.Load.Arrival = "poisson"
	}
	if s.Clients.Proxies == 0 {
		s.Clients.Proxies = 1
	}
	if s.Clients.Workers == 0 {
		s.Clients.Workers = 1
	}
	if s.Clients.LB == "" {
		s.Clients.LB = LBLeastRequest
	}
	if s.Clients.ChoiceCount == 0 {
		s.Clients.ChoiceCount = 2
	}
	if s.Clients.ActiveRequestBias == nil {
		one := 1.0
		s.Clients.ActiveRequestBias = &one
	}
	if s.Clients.ProbeRTT.Duration == 0 {
		s.Clients.ProbeRTT.Duration = s.Clients.NetworkLatency.Duration
		if s.Clients.ProbeRTT.Duration == 0 {
			s.Clients.ProbeRTT.Duration = time.Millisecond
		}
	}
	if s.Controller.Interval.Duration == 0 {
		s.Controller.Interval.Duration = 30 * time.Second
	}
	if s.Controller.Window.Duration == 0 {
		s.Controller.Window.Duration = 2 * s.Controller.Interval.Duration
	}
	if m := &s.Controller.Metrics; m.ScrapeInterval.Duration == 0 {
		// A scenario with a window shorter than a stock scrape interval predates the lag model:
		// scrape once per window (at least once a second) so that it still means what it did.
		m.ScrapeInterval.Duration = max(time.Second, min(DefaultScrapeInterval, s.Controller.Window.Truncate(time.Second)))
	}
	if s.Controller.Metrics.LatencyOffset == nil {
		s.Controller.Metrics.LatencyOffset = &Duration{DefaultLatencyOffset}
	}
	if s.Controller.Metrics.QueryLatencyOffset == nil {
		s.Controller.Metrics.QueryLatencyOffset = &Duration{0}
	}
	if s.Controller.Metrics.IngestionDelay == nil {
		s.Controller.Metrics.IngestionDelay = &Duration{DefaultIngestionDelay}
	}
	if s.Controller.FastCheckWindow.Duration == 0 {
		s.Controller.FastCheckWindow.Duration = min(2*s.Controller.Metrics.ScrapeInterval.Duration, s.Controller.Window.Duration)
	}
	if s.Controller.FastCheckInterval == nil {
		// Checking more often than the TSDB gets new samples reads the same data again; checking
		// data half a minute old would relieve a pod after the damage.
		iv := time.Duration(0)
		if m := s.Controller.Metrics; m.QueryLatencyOffset.Duration < m.ScrapeInterval.Duration && m.ScrapeInterval.Duration < s.Controller.Interval.Duration {
			iv = s.Controller.Metrics.ScrapeInterval.Duration
		}
		s.Controller.FastCheckInterval = &Duration{iv}
	}
	if s.Load.History == "" {
		s.Load.History = HistorySame
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Workers == 0 {
			p.Workers = 1
		}
		if p.Cores == 0 {
			p.Cores = float64(p.Workers)
		}
		if p.Speed == 0 {
			p.Speed = 1
		}
		if p.Cost.Dist == "" {
			p.Cost.Dist = "exponential"
		}
		if p.Cost.Dist == CostMixture && p.Cost.Mean.Duration == 0 {
			p.Cost.Mean = Duration{p.Cost.mixtureMean()}
		}
	}
}

func oneOf(v string, allowed []string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

// validateCost checks a pod group's cost; field is its path ("pods[0].cost").
func validateCost(c Cost, field string) error {
	bad := func(name, format string, args ...any) error {
		return &ScenarioError{Field: field + "." + name, Msg: fmt.Sprintf(format, args...)}
	}
	if !oneOf(c.Dist, distributions) {
		return bad("dist", "%q is unknown; allowed: %s", c.Dist, strings.Join(distributions, ", "))
	}
	if c.Dist != CostMixture && len(c.Parts) > 0 {
		return bad("parts", "are for dist: mixture only (dist is %q)", c.Dist)
	}
	if c.Dist == CostMixture {
		if c.CV != 0 {
			return bad("cv", "is each part's in a mixture (parts[i].cv); remove it from the mixture")
		}
		if len(c.Parts) < 2 || len(c.Parts) > maxCostParts {
			return bad("parts", "a mixture needs 2 to %d parts, each {share, mean, dist[, cv]}; got %d", maxCostParts, len(c.Parts))
		}
		total := 0.0
		for j, part := range c.Parts {
			name := fmt.Sprintf("parts[%d]", j)
			if !(part.Share > 0 && part.Share < 1) {
				return bad(name+".share", "%v must lie between 0 and 1 (the part's fraction of the requests)", part.Share)
			}
			total += part.Share
			if err := validateCostShape(part.Mean.Duration, part.Dist, part.CV, partDists, func(n, format string, args ...any) error {
				return bad(name+"."+n, format, args...)
			}); err != nil {
				return err
			}
		}
		if math.Abs(total-1) > shareSumTolerance {
			return bad("parts", "the shares add up to %v; they must add up to 1", total)
		}
		if want := c.mixtureMean(); math.Abs(c.Mean.Seconds()/want.Seconds()-1) > 0.01 {
			return bad("mean", "%v disagrees with the parts' mean %v (the shares times the means); leave cost.mean out of a mixture, or make it agree", c.Mean.Duration, want)
		}
		return nil
	}
	return validateCostShape(c.Mean.Duration, c.Dist, c.CV, distributions, bad)
}

// shareSumTolerance is how far a mixture's shares may add up from 1: shares written with four
// decimals; the sampler divides them by their sum.
const shareSumTolerance = 1e-3

// maxCostParts bounds a mixture.
const maxCostParts = 4

// validateCostShape checks one distribution: its mean and, where it has one, its CV.
func validateCostShape(mean time.Duration, dist string, cv float64, allowed []string, bad func(name, format string, args ...any) error) error {
	if mean <= 0 {
		return bad("mean", "%v must be a positive duration such as 2.7ms", mean)
	}
	if !oneOf(dist, allowed) {
		return bad("dist", "%q is unknown here; allowed: %s", dist, strings.Join(allowed, ", "))
	}
	switch dist {
	case CostLognormal, CostGamma:
		if !(cv > 0 && cv <= maxCostVariation) {
			return bad("cv", "%v must be above 0 and at most %v for a %s cost", cv, maxCostVariation, dist)
		}
	default:
		if cv != 0 {
			return bad("cv", "is for lognormal and gamma costs; the %s family's CV is fixed (remove cv)", dist)
		}
	}
	return nil
}

// maxCostVariation bounds a cost's coefficient of variation: beyond it a gamma's shape is so small that
// nearly every request costs nothing and a few cost everything.
const maxCostVariation = 5

func (s *Scenario) validate() error {
	bad := func(field, format string, args ...any) error {
		return &ScenarioError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if s.Name == "" {
		return bad("name", "must be set")
	}
	if s.Duration.Duration <= 0 {
		return bad("duration", "must be positive, e.g. 600s")
	}
	if s.Warmup.Duration < 0 || s.Warmup.Duration >= s.Duration.Duration {
		return bad("warmup", "%v must be at least 0 and shorter than duration %v", s.Warmup.Duration, s.Duration.Duration)
	}
	if s.Load.RPS <= 0 {
		return bad("load.rps", "%v must be a positive request rate", s.Load.RPS)
	}
	if !oneOf(s.Load.Arrival, arrivals) {
		return bad("load.arrival", "%q is unknown; allowed: %s", s.Load.Arrival, strings.Join(arrivals, ", "))
	}
	if !oneOf(s.Load.History, histories) {
		return bad("load.history", "%q is unknown; allowed: %s (the past days had this run's load shape, its load never rose, or the Service is new)", s.Load.History, strings.Join(histories, ", "))
	}
	for i, ph := range s.Load.Phases {
		if ph.RPS <= 0 {
			return bad(fmt.Sprintf("load.phases[%d].rps", i), "%v must be a positive request rate", ph.RPS)
		}
		if ph.At.Duration < 0 || ph.At.Duration > s.Duration.Duration {
			return bad(fmt.Sprintf("load.phases[%d].at", i), "%v must lie within the run (0 to %v)", ph.At.Duration, s.Duration.Duration)
		}
	}
	c := s.Clients
	if c.Proxies < 1 || c.Proxies > 10000 {
		return bad("clients.proxies", "%d must be between 1 and 10000", c.Proxies)
	}
	if c.Workers < 1 || c.Workers > 256 {
		return bad("clients.workers", "%d must be between 1 and 256", c.Workers)
	}
	if !oneOf(c.LB, lbPolicies) {
		return bad("clients.lb", "%q is unknown; allowed: %s", c.LB, strings.Join(lbPolicies, ", "))
	}
	if c.ChoiceCount < 1 {
		return bad("clients.choice_count", "%d must be at least 1", c.ChoiceCount)
	}
	if b := *c.ActiveRequestBias; b < 0 || b > 10 {
		return bad("clients.active_request_bias", "%v must be between 0 and 10", b)
	}
	if c.NetworkLatency.Duration < 0 {
		return bad("clients.network_latency", "%v must not be negative", c.NetworkLatency.Duration)
	}
	if c.ProbeRTT.Duration < 0 {
		return bad("clients.probe_rtt", "%v must not be negative: a probe cannot come back before it is sent", c.ProbeRTT.Duration)
	}
	ct := s.Controller
	if ct.Interval.Duration < time.Second {
		return bad("controller.interval", "%v must be at least 1s", ct.Interval.Duration)
	}
	if ct.Window.Duration < time.Second {
		return bad("controller.window", "%v must be at least 1s", ct.Window.Duration)
	}
	if ct.ApplyDelay.Duration < 0 || ct.ApplyDelay.Duration >= ct.Interval.Duration {
		return bad("controller.apply_delay", "%v must be at least 0 and shorter than the interval %v", ct.ApplyDelay.Duration, ct.Interval.Duration)
	}
	if err := ct.Metrics.validate(ct.Window.Duration); err != nil {
		return err
	}
	if fc := ct.FastCheckInterval.Duration; fc < 0 || (fc > 0 && (fc < time.Second || fc%time.Second != 0 || fc >= ct.Interval.Duration)) {
		return bad("controller.fast_check_interval", "%v must be 0s (off) or a whole number of seconds from 1s to below the interval %v", fc, ct.Interval.Duration)
	}
	if fw := ct.FastCheckWindow.Duration; fw < ct.Metrics.ScrapeInterval.Duration || fw%time.Second != 0 || fw > ct.Window.Duration {
		return bad("controller.fast_check_window", "%v must be a whole number of seconds from the scrape interval %v to the window %v", fw, ct.Metrics.ScrapeInterval.Duration, ct.Window.Duration)
	}
	if len(s.Pods) == 0 {
		return bad("pods", "at least one pod group is required")
	}
	names := map[string]bool{}
	for i, p := range s.Pods {
		f := func(name string) string { return fmt.Sprintf("pods[%d].%s", i, name) }
		if p.Name == "" {
			return bad(f("name"), "must be set")
		}
		if names[p.Name] {
			return bad(f("name"), "%q is used by two pod groups; names must be unique", p.Name)
		}
		names[p.Name] = true
		if p.Replicas < 0 || p.Replicas > 10000 {
			return bad(f("replicas"), "%d must be between 0 and 10000", p.Replicas)
		}
		if p.Workers < 1 || p.Workers > 4096 {
			return bad(f("workers"), "%d must be between 1 and 4096", p.Workers)
		}
		if p.Cores <= 0 {
			return bad(f("cores"), "%v must be positive", p.Cores)
		}
		if p.CPULimit < 0 {
			return bad(f("cpu_limit"), "%v must not be negative (0 means no limit)", p.CPULimit)
		}
		if p.Speed <= 0 {
			return bad(f("speed"), "%v must be positive (1 = reference hardware)", p.Speed)
		}
		if err := validateCost(p.Cost, f("cost")); err != nil {
			return err
		}
		for j, ev := range p.Events {
			g := func(name string) string { return fmt.Sprintf("pods[%d].events[%d].%s", i, j, name) }
			if ev.At.Duration < 0 || ev.At.Duration > s.Duration.Duration {
				return bad(g("at"), "%v must lie within the run (0 to %v)", ev.At.Duration, s.Duration.Duration)
			}
			n := 0
			if ev.Speed != nil {
				n++
				if *ev.Speed <= 0 {
					return bad(g("speed"), "%v must be positive", *ev.Speed)
				}
			}
			if ev.Replicas != nil {
				n++
				if *ev.Replicas < 0 || *ev.Replicas > 10000 {
					return bad(g("replicas"), "%d must be between 0 and 10000", *ev.Replicas)
				}
			}
			if ev.Restart != nil {
				n++
				if ev.Restart.Duration <= 0 {
					return bad(g("restart_every"), "%v must be positive", ev.Restart.Duration)
				}
			}
			if n != 1 {
				return bad(fmt.Sprintf("pods[%d].events[%d]", i, j), "set exactly one of speed, replicas or restart_every")
			}
		}
	}
	total := 0
	for _, p := range s.Pods {
		total += p.Replicas
	}
	if total == 0 {
		return bad("pods", "the pod groups have zero replicas in total; at least one pod is required")
	}
	return nil
}

// Lagless reports whether m reads metrics without lag, as NoMetricsLag does.
func (m Metrics) Lagless() bool {
	zero := func(d *Duration) bool { return d == nil || d.Duration == 0 }
	return m.ScrapeInterval.Duration == time.Second && zero(m.LatencyOffset) && zero(m.QueryLatencyOffset) && zero(m.IngestionDelay)
}

// validate checks the metrics lag against the controller window.
func (m Metrics) validate(window time.Duration) error {
	bad := func(field, format string, args ...any) error {
		return &ScenarioError{Field: "controller.metrics." + field, Msg: fmt.Sprintf(format, args...)}
	}
	if si := m.ScrapeInterval.Duration; si < time.Second || si%time.Second != 0 || si > window {
		return bad("scrape_interval", "%v must be a whole number of seconds (the simulator keeps the pods' counters once a second) from 1s to the controller window %v: a window shorter than a scrape holds no sample", si, window)
	}
	if lo := m.LatencyOffset.Duration; lo < 0 {
		return bad("latency_offset", "%v must be at least 0 (0s: the TSDB answers for the instant asked, as Prometheus does; a stock VictoriaMetrics answers %v in the past)", lo, DefaultLatencyOffset)
	}
	if lo := m.QueryLatencyOffset.Duration; lo < 0 {
		return bad("query_latency_offset", "%v must be at least 0 (0s: the newest data, what adaptive-lb asks for by default)", lo)
	}
	if d := m.IngestionDelay.Duration; d < 0 {
		return bad("ingestion_delay", "%v must be at least 0", d)
	}
	return nil
}
