package sim

import (
	"math"
	"math/rand"
	"sort"
)

// Client-side peers of adaptive-lb, each modelled from its published description (docs/simulator.md,
// "Peers"). They replace the client balancer; adaptive-lb's controller is off.
const (
	// PolicyORCAWRR is Envoy's client-side weighted round robin fed by ORCA load reports, as
	// Istio 1.32's DestinationRule backendUtilization load balancer configures it: weight = qps /
	// (utilization + errorPenalty × eps/qps), with Istio's error penalty of 0.
	PolicyORCAWRR = "orca-wrr"
	// PolicyPeakEWMA is power-of-two-choices over cost = peak-EWMA latency × (active + 1)
	// (Finagle, Linkerd, Envoy contrib).
	PolicyPeakEWMA = "peak-ewma"
	// PolicyPrequal is Google's Prequal: asynchronous probes of requests-in-flight and latency,
	// and the hot/cold rule.
	PolicyPrequal = "prequal"
)

// Published defaults.
const (
	orcaUpdatePeriod   = 1.0   // s, weight_update_period
	orcaBlackout       = 10.0  // s, blackout_period
	orcaExpiration     = 180.0 // s, weight_expiration_period
	orcaErrorPenalty   = 0.0   // error_utilization_penalty as Istio sends it (Envoy's own default is 1.0)
	peakEWMADecay      = 10.0  // s, Linkerd's default decay
	peakEWMAPenalty    = 1e6   // cost of a host with requests in flight and no RTT sample yet
	prequalProbes      = 3     // probes sent per query (r_probe)
	prequalPoolSize    = 16    // probe pool capacity
	prequalMaxAge      = 1.0   // s, probes older than this are dropped
	prequalReuse       = 2     // a probe serves at most this many queries (b_reuse)
	prequalQuantileRIF = 0.84  // Q_RIF: above this quantile of pooled RIFs a replica is hot
)

// orcaHost is what one client proxy knows of one backend from its ORCA reports.
type orcaHost struct {
	qps, utilization, eps float64
	nonEmptySince         float64 // first report of the current streak; -1 when none
	lastUpdate            float64
}

// orcaWeight is Envoy's client-side WRR weight for a host at time now, or 0 when it has none
// (no report yet, still in the blackout period, or expired).
func orcaWeight(h orcaHost, now float64) float64 {
	if h.nonEmptySince < 0 || now-h.nonEmptySince < orcaBlackout || now-h.lastUpdate > orcaExpiration {
		return 0
	}
	if h.qps <= 0 || h.utilization <= 0 {
		return 0
	}
	return h.qps / (h.utilization + orcaErrorPenalty*h.eps/h.qps)
}

// orcaWeights turns per-host weights into the ones the scheduler uses: hosts without a valid
// weight get the median of the valid ones; with none valid, all are equal.
func orcaWeights(raw []float64) []float64 {
	var valid []float64
	for _, w := range raw {
		if w > 0 {
			valid = append(valid, w)
		}
	}
	out := make([]float64, len(raw))
	if len(valid) == 0 {
		for i := range out {
			out[i] = 1
		}
		return out
	}
	sort.Float64s(valid)
	med := valid[len(valid)/2]
	for i, w := range raw {
		if w > 0 {
			out[i] = w
		} else {
			out[i] = med
		}
	}
	return out
}

// peakEWMA is one client proxy's latency estimates per backend.
type peakEWMA struct {
	ewma  []float64 // seconds, by pod id
	stamp []float64
}

func (p *peakEWMA) grow(n int) {
	for len(p.ewma) < n {
		p.ewma = append(p.ewma, 0)
		p.stamp = append(p.stamp, 0)
	}
}

// observe folds an RTT sample in: a sample above the estimate replaces it (the peak), a lower one
// decays it with a time constant of peakEWMADecay.
func (p *peakEWMA) observe(pod int32, now, rtt float64) {
	p.grow(int(pod) + 1)
	if rtt > p.ewma[pod] {
		p.ewma[pod] = rtt
	} else {
		w := math.Exp(-(now - p.stamp[pod]) / peakEWMADecay)
		p.ewma[pod] = p.ewma[pod]*w + rtt*(1-w)
	}
	p.stamp[pod] = now
}

// cost is the estimate decayed to now, times the requests the proxy has in flight plus one.
func (p *peakEWMA) cost(pod int32, now float64, active int32) float64 {
	p.grow(int(pod) + 1)
	e := p.ewma[pod] * math.Exp(-(now-p.stamp[pod])/peakEWMADecay)
	if e == 0 && active > 0 {
		return peakEWMAPenalty + float64(active)
	}
	return e * float64(active+1)
}

// pick is power of two choices on cost.
func (p *peakEWMA) pick(hosts []int32, active []int32, now float64, r *rand.Rand) int32 {
	a := hosts[r.Intn(len(hosts))]
	b := hosts[r.Intn(len(hosts))]
	if p.cost(b, now, active[b]) < p.cost(a, now, active[a]) {
		return b
	}
	return a
}

// prequalProbe is one probe result in a client's pool.
type prequalProbe struct {
	pod     int32
	rif     int
	latency float64
	at      float64
	uses    int
}

// prequalPool is one client proxy's probe pool.
type prequalPool struct{ probes []prequalProbe }

func (q *prequalPool) add(p prequalProbe) {
	if len(q.probes) >= prequalPoolSize {
		// Drop the oldest probe to make room.
		oldest := 0
		for i := range q.probes {
			if q.probes[i].at < q.probes[oldest].at {
				oldest = i
			}
		}
		q.probes = append(q.probes[:oldest], q.probes[oldest+1:]...)
	}
	q.probes = append(q.probes, p)
}

// pick applies the hot/cold rule to the live probes: a replica whose RIF is above the Q_RIF
// quantile of the pool's RIFs is hot; among the cold ones the lowest latency wins. ok is false
// when the pool is empty (the caller picks at random).
func (q *prequalPool) pick(now float64, alive func(int32) bool) (int32, bool) {
	kept := q.probes[:0]
	for _, p := range q.probes {
		if now-p.at <= prequalMaxAge && p.uses < prequalReuse && alive(p.pod) {
			kept = append(kept, p)
		}
	}
	q.probes = kept
	if len(kept) == 0 {
		return 0, false
	}
	rifs := make([]int, len(kept))
	for i, p := range kept {
		rifs[i] = p.rif
	}
	sort.Ints(rifs)
	threshold := rifs[int(prequalQuantileRIF*float64(len(rifs)-1))]
	best := -1
	for i, p := range kept {
		if p.rif > threshold {
			continue
		}
		if best < 0 || p.latency < kept[best].latency {
			best = i
		}
	}
	q.probes[best].uses++
	return q.probes[best].pod, true
}
