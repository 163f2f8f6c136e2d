package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// MetricsRecorder records a run the way a real mesh's monitoring would scrape it: every scrape
// interval of simulated time, each pod's cumulative CPU (cAdvisor), its completed requests and
// their latency histogram as its sidecar reports them (Istio, reporter="destination"), every
// client proxy's requests and latency histogram (reporter="source"), the weight each pod had,
// and the facts kube-state-metrics would publish (CPU limits, nodes and their CPU counts). The
// counters are the simulator's own, so what the series say is what the run did. WriteText writes
// the series with timestamps; Summary reads a stretch of them back as increase() would.
//
// Pass one recorder to one sim.Run through Options.Metrics.
type MetricsRecorder struct {
	labels   MeshLabels
	interval int // seconds between scrapes

	started  bool
	weighted bool // the policy writes weights: record adaptivelb_endpoint_weight
	proxies  int
	times    []float64 // simulated seconds of each scrape
	pods     []recordedPod
	// clients holds the client proxies' counters as they stand, clientSamples one copy per
	// scrape.
	clients       []clientCounters
	clientSamples [][]clientCounters
}

// MeshLabels names the simulated Service in the exported series.
type MeshLabels struct {
	// Namespace holds the Service, its pods and the client pods; default "sim".
	Namespace string
	// Service is the Service's name; default the scenario's name.
	Service string
	// ClientWorkload names the client pods' workload; default "client".
	ClientWorkload string
	// ScrapeInterval is how often the series are sampled, in whole seconds; default DefaultScrapeInterval
	// (scenario.go), the interval the simulated controller reads at.
	ScrapeInterval time.Duration
}

// NewMetricsRecorder returns a recorder for one run. An interval that is not a whole number of
// seconds is an error: the simulator samples its counters once per simulated second.
func NewMetricsRecorder(l MeshLabels) (*MetricsRecorder, error) {
	if l.Namespace == "" {
		l.Namespace = "sim"
	}
	if l.ClientWorkload == "" {
		l.ClientWorkload = "client"
	}
	if l.ScrapeInterval == 0 {
		l.ScrapeInterval = DefaultScrapeInterval
	}
	if l.ScrapeInterval < time.Second || l.ScrapeInterval%time.Second != 0 {
		return nil, fmt.Errorf("scrape interval %v must be a whole number of seconds, at least 1s", l.ScrapeInterval)
	}
	return &MetricsRecorder{labels: l, interval: int(l.ScrapeInterval / time.Second)}, nil
}

// recordedPod is one pod's series.
type recordedPod struct {
	name, group, node, ip string
	cores, limit          float64
	first                 int // index of the pod's first scrape in times
	samples               []podSample
	done                  bool // left the host set and drained: no more samples
}

// podSample is a pod's cumulative counters at one scrape.
type podSample struct {
	cpu     float64 // CPU-seconds
	served  uint64
	sumMS   float64
	buckets latencyHistogram // per bucket, not cumulative
	weight  int              // 0: no weight written for it yet
}

// clientCounters are one client proxy's cumulative counters.
type clientCounters struct {
	count   uint64
	sumMS   float64
	buckets latencyHistogram
}

// startRecording attaches opts.Metrics to the run and takes the first scrape, at time 0.
func (s *simulation) startRecording() error {
	r := s.opts.Metrics
	if r == nil {
		return nil
	}
	if r.started {
		return errors.New("a MetricsRecorder records one run; pass a new one to each sim.Run")
	}
	r.started = true
	if r.labels.Service == "" {
		r.labels.Service = s.sc.Name
	}
	r.weighted = s.settings != nil || len(s.opts.StaticWeights) > 0
	r.proxies = s.sc.Clients.Proxies
	r.clients = make([]clientCounters, r.proxies)
	s.recorder = r
	r.scrape(s, 0)
	return nil
}

// observeClient counts one response as client proxy `proxy` saw it.
func (r *MetricsRecorder) observeClient(proxy int32, ms float64) {
	c := &r.clients[proxy]
	c.count++
	c.sumMS += ms
	c.buckets.observe(ms)
}

// maybeScrape scrapes at every whole multiple of the interval; the simulation calls it once per
// simulated second, after bringing every pod's counters up to t.
func (r *MetricsRecorder) maybeScrape(s *simulation, t float64) {
	if sec := int(math.Round(t)); sec%r.interval == 0 {
		r.scrape(s, t)
	}
}

func (r *MetricsRecorder) scrape(s *simulation, t float64) {
	at := len(r.times)
	r.times = append(r.times, t)
	for _, p := range s.pods {
		if int(p.id) == len(r.pods) {
			pg := s.sc.Pods[p.group]
			r.pods = append(r.pods, recordedPod{
				// Node names carry the namespace: two runs imported side by side into one TSDB
				// under namespaces of their own must not share nodes, as pods of one cluster's
				// namespaces do not share a node name with another cluster's.
				name: p.name, group: pg.Name, node: "node-" + r.labels.Namespace + "-" + p.name,
				ip:    fmt.Sprintf("10.%d.%d.%d", 1+p.group%250, p.id/250, 1+p.id%250),
				cores: p.cores, limit: p.limit, first: at,
			})
		}
		rp := &r.pods[p.id]
		if rp.done {
			continue
		}
		w := 0
		if r.weighted {
			w = s.weightOf[p.id]
		}
		rp.samples = append(rp.samples, podSample{cpu: p.cpu, served: p.served, sumMS: p.latencySumMS, buckets: p.latencies, weight: w})
		// A pod that left is scraped until it has answered its last request, then its series end.
		if !p.inHostSet && p.inSystem() == 0 {
			rp.done = true
		}
	}
	r.clientSamples = append(r.clientSamples, append([]clientCounters(nil), r.clients...))
}

// Histogram is a latency histogram as Prometheus keeps it: cumulative counts per upper bound
// (milliseconds, the last +Inf) and the sum of the observations.
type Histogram struct {
	BoundsMS   []float64 `json:"bounds_ms"`
	Cumulative []float64 `json:"cumulative"`
	SumMS      float64   `json:"sum_ms"`
}

// Count is the number of observations.
func (h Histogram) Count() float64 {
	if len(h.Cumulative) == 0 {
		return 0
	}
	return h.Cumulative[len(h.Cumulative)-1]
}

// Add returns the bucket-wise sum of h and o, which must have the same bounds (or h none).
func (h Histogram) Add(o Histogram) Histogram {
	if len(h.BoundsMS) == 0 {
		return Histogram{BoundsMS: append([]float64(nil), o.BoundsMS...), Cumulative: append([]float64(nil), o.Cumulative...), SumMS: o.SumMS}
	}
	out := Histogram{BoundsMS: h.BoundsMS, Cumulative: append([]float64(nil), h.Cumulative...), SumMS: h.SumMS + o.SumMS}
	for i := range out.Cumulative {
		if i < len(o.Cumulative) {
			out.Cumulative[i] += o.Cumulative[i]
		}
	}
	return out
}

// IstioBucketsMS returns the bounds of Istio's default istio_request_duration_milliseconds
// histogram, without +Inf.
func IstioBucketsMS() []float64 { return append([]float64(nil), istioBucketsMS[:]...) }

// increase turns the difference of two per-bucket counts into a cumulative Histogram.
func increase(later, earlier *latencyHistogram, sumMS float64) Histogram {
	h := Histogram{BoundsMS: make([]float64, len(later)), Cumulative: make([]float64, len(later)), SumMS: sumMS}
	var cum uint64
	for i := range later {
		cum += later[i] - earlier[i]
		h.Cumulative[i] = float64(cum)
		h.BoundsMS[i] = math.Inf(1)
		if i < len(istioBucketsMS) {
			h.BoundsMS[i] = istioBucketsMS[i]
		}
	}
	return h
}

// MeshSummary is what the recorded series say about a stretch of the run.
type MeshSummary struct {
	// Pods holds every pod with samples in the stretch, in creation order.
	Pods []PodSummary
	// Clients is the latency every client proxy saw, summed over proxies.
	Clients Histogram
	// Seconds is the stretch's length.
	Seconds float64
}

// PodSummary is one pod's CPU, rate and latency over a stretch: the increase of its counters
// between its first and last sample in the stretch, rates divided by the whole stretch, as
// rate() over the stretch gives them for a pod present throughout.
type PodSummary struct {
	Name        string
	Group       string
	CPUCores    float64
	RequestRate float64
	Latency     Histogram
}

// Summary reads the recorded series between two scrape times (simulated time since the start).
func (r *MetricsRecorder) Summary(from, to time.Duration) (MeshSummary, error) {
	i, j := r.scrapeIndex(from), r.scrapeIndex(to)
	if i < 0 || j < 0 || j <= i {
		return MeshSummary{}, fmt.Errorf("no recorded stretch from %v to %v: both must be scrape times (every %v) within the run, the first before the second", from, to, r.labels.ScrapeInterval)
	}
	span := r.times[j] - r.times[i]
	out := MeshSummary{Seconds: span}
	for _, p := range r.pods {
		lo, hi := max(i, p.first), min(j, p.first+len(p.samples)-1)
		if hi <= lo {
			continue
		}
		a, b := &p.samples[lo-p.first], &p.samples[hi-p.first]
		out.Pods = append(out.Pods, PodSummary{
			Name: p.name, Group: p.group,
			CPUCores:    (b.cpu - a.cpu) / span,
			RequestRate: float64(b.served-a.served) / span,
			Latency:     increase(&b.buckets, &a.buckets, b.sumMS-a.sumMS),
		})
	}
	for q := 0; q < r.proxies; q++ {
		a, b := &r.clientSamples[i][q], &r.clientSamples[j][q]
		out.Clients = out.Clients.Add(increase(&b.buckets, &a.buckets, b.sumMS-a.sumMS))
	}
	return out, nil
}

// scrapeIndex returns the index of the scrape at d, or -1.
func (r *MetricsRecorder) scrapeIndex(d time.Duration) int {
	for i, t := range r.times {
		if math.Abs(t-d.Seconds()) < 1e-6 {
			return i
		}
	}
	return -1
}

// Duration is the simulated time of the last scrape: the span the series cover.
func (r *MetricsRecorder) Duration() time.Duration {
	if len(r.times) == 0 {
		return 0
	}
	return time.Duration(r.times[len(r.times)-1] * float64(time.Second))
}
