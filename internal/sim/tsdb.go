package sim

import (
	"math"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// This file is the TSDB between the simulated pods and the simulated controller: what the
// operator's queries would return at a cycle, given how the pods are scraped and how far in the
// past the TSDB answers (Scenario.Controller.Metrics).
//
// Every pod has two scrape jobs, its sidecar (istio_requests_total and the
// istio_request_duration_milliseconds histogram) and cAdvisor (container_cpu_usage_seconds_total),
// each sampled every scrape interval at its own phase, from the first scrape after the pod
// started. A query the operator sends at T is evaluated at E = T - latency_offset over the window
// (E - window, E], seeing only the samples already ingested (scraped at or before T -
// ingestion_delay). rate() and increase() follow VictoriaMetrics (MetricsQL), which does not
// extrapolate:
//   - rate() is (last sample in the window - the last sample before it) / (their time apart).
//     VictoriaMetrics takes the sample before the window when it lies within 1.25 to 5 scrape
//     intervals of the window's start, which a regularly scraped series always has.
//   - A series that began inside the window has no sample before it: rate() runs from its first
//     sample in the window and needs two; increase() counts from zero (VictoriaMetrics assumes a
//     new counter started at 0 when its first value is small against its growth, as a new pod's
//     counters are).
//   - A window that holds no sample while one lies before it gives 0 ("the value did not
//     change").
//   - histogram_quantile over rate() of the buckets is the quantile of the same bucket
//     differences as rate(), since the quantile does not depend on the divisor.
//
// The operator judges a pod's metrics fresh when its newest sample is at most 2 × interval old
// (weightcycle.go), and counts a pod's signals only when it spent at least half the window in
// the ServiceEntry (minMembershipShare); a simulated pod is in the host set from its birth.

// scrapeJob names a pod's two scrape jobs; each has its own phase.
type scrapeJob uint64

const (
	jobSidecar scrapeJob = iota + 1
	jobCAdvisor
)

// maxMetricsAgeIntervals is the operator's freshness limit, in controller intervals: a pod whose
// newest sample is older has no usable metrics.
const maxMetricsAgeIntervals = 2

// minMembershipShare is the share of the window a pod must have spent in the host set for its
// signals to count (the operator's minMembershipShare).
const minMembershipShare = 0.5

// scrapePhase is the second within the scrape interval at which job scrapes pod id: a hash of
// the seed, the pod and the job, so that it is the same under every policy (Prometheus too
// spreads its targets' scrapes by a hash of the target).
func (s *simulation) scrapePhase(id int32, job scrapeJob) int {
	interval := int(s.sc.Controller.Metrics.ScrapeInterval.Seconds())
	return int(splitmix64(uint64(s.sc.Seed)^uint64(id)<<20^uint64(job)<<52) % uint64(interval))
}

// sampleSpan is which two samples of one series rate() and increase() take at one evaluation.
type sampleSpan struct {
	base, last int // the samples' times in whole seconds; equal when the window holds no sample
	// fromZero: the series began inside the window, so increase() counts from zero, not base.
	fromZero bool
	// ok: rate() has a value.
	ok bool
	// newest is the time of the newest visible sample, for freshness; -1 when there is none.
	newest int
}

// span works out the samples one scrape job's series of pod p offers a query evaluated at
// evalAt over the window, when the samples visible are those scraped at or before visibleTo.
func (s *simulation) span(p *pod, job scrapeJob, evalAt, visibleTo, window float64) sampleSpan {
	interval := int(s.sc.Controller.Metrics.ScrapeInterval.Seconds())
	phase := s.scrapePhase(p.id, job)
	// latestAt is the latest scrape at or before t; first is the pod's first scrape.
	latestAt := func(t float64) int {
		k := int(math.Floor((t - float64(phase)) / float64(interval)))
		return phase + k*interval
	}
	if len(s.snapCPU[p.id]) == 0 {
		return sampleSpan{newest: -1} // no counters kept yet
	}
	first := latestAt(p.born) + interval
	for first < s.snapFrom[p.id] {
		first += interval // the pod's first counters were kept after that scrape
	}
	last := latestAt(math.Min(evalAt, visibleTo))
	sp := sampleSpan{newest: -1}
	if last < first {
		return sp // not scraped yet
	}
	sp.newest = last
	start := evalAt - window
	if before := latestAt(start); before >= first {
		// The sample before the window: VictoriaMetrics' rate() starts from it.
		sp.base, sp.last, sp.ok = before, last, true
		if float64(last) <= start {
			sp.base = last // nothing in the window: the counter did not change
		}
		return sp
	}
	// The series began inside the window.
	sp.base, sp.last, sp.fromZero = first, last, true
	sp.ok = last > first
	return sp
}

// tsdbObservation is what one cycle's queries tell the controller about one pod.
type tsdbObservation struct {
	cpu, rps, p99 float64
	buckets       []weights.LatencyBucket
	// rateUsable: the request rate has a fresh value (it counts toward the Service's rate).
	rateUsable bool
	hasMetrics bool
}

// observe is what the operator's cycle queries sent at t return for pod p.
func (s *simulation) observe(p *pod, t float64) tsdbObservation {
	return s.observeOver(p, t, s.sc.Controller.Window.Seconds(), maxMetricsAgeIntervals*s.sc.Controller.Interval.Seconds())
}

// observeShort is what the fast check's queries sent at t return for pod p: its rates over the
// short window, judged fresh when the newest sample is at most two scrape intervals old.
func (s *simulation) observeShort(p *pod, t float64) tsdbObservation {
	return s.observeOver(p, t, s.sc.Controller.FastCheckWindow.Seconds(), maxShortAgeScrapes*s.sc.Controller.Metrics.ScrapeInterval.Seconds())
}

// maxShortAgeScrapes is the fast check's freshness limit, in scrape intervals.
const maxShortAgeScrapes = 2

// evalAt is the time the TSDB evaluates a query sent at t, and visibleTo the newest scrape it
// holds then: the policy's queries ask for an offset, and a sample needs the ingestion delay to
// become searchable.
func (s *simulation) evalAt(t float64) (evalAt, visibleTo float64) {
	m := s.sc.Controller.Metrics
	return t - m.OffsetFor(s.policy).Seconds(), t - m.IngestionDelay.Seconds()
}

// observeOver is what a query sent at t over window returns for pod p; maxAge is the freshness
// limit of its newest sample.
func (s *simulation) observeOver(p *pod, t, window, maxAge float64) tsdbObservation {
	evalAt, visibleTo := s.evalAt(t)
	fresh := func(sp sampleSpan) bool { return sp.ok && t-float64(sp.newest) <= maxAge }

	var o tsdbObservation
	side, cadv := s.span(p, jobSidecar, evalAt, visibleTo, window), s.span(p, jobCAdvisor, evalAt, visibleTo, window)
	if fresh(cadv) && cadv.last > cadv.base {
		o.cpu = (s.cpuAt(p.id, cadv.last) - s.cpuAt(p.id, cadv.base)) / float64(cadv.last-cadv.base)
	}
	o.rateUsable = fresh(side)
	if o.rateUsable {
		hist := s.snapLatency[p.id]
		lastH := &hist[side.last-s.snapFrom[p.id]]
		if side.last > side.base {
			baseH := &hist[side.base-s.snapFrom[p.id]]
			o.rps = float64(s.servedAt(p.id, side.last)-s.servedAt(p.id, side.base)) / float64(side.last-side.base)
			o.p99 = lastH.quantileSince(baseH, 0.99)
		}
		if side.fromZero {
			o.buckets = lastH.bucketsSince(&latencyHistogram{})
		} else {
			o.buckets = lastH.bucketsSince(&hist[side.base-s.snapFrom[p.id]])
		}
	}
	membership := (evalAt - math.Max(p.born, evalAt-window)) / window
	o.hasMetrics = fresh(cadv) && o.rateUsable && membership >= minMembershipShare
	return o
}

// cpuAt and servedAt are a pod's counters at second t, which must be kept (t ≥ snapFrom).
func (s *simulation) cpuAt(id int32, t int) float64   { return s.snapCPU[id][t-s.snapFrom[id]] }
func (s *simulation) servedAt(id int32, t int) uint64 { return s.snapServed[id][t-s.snapFrom[id]] }

// windowCoverage is the fraction of the window the TSDB answered for at t, (t - offset - window,
// t - offset], that lies after the current weights reached the clients: the part of the
// observation that reflects them. The engine takes 0 to mean unknown and treats it as 1, so a
// window wholly before the write is passed as the smallest positive fraction instead.
func (s *simulation) windowCoverage(t float64) float64 {
	return s.coverageOver(t, s.sc.Controller.Window.Seconds())
}

// coverageOver is windowCoverage for a window of the given length. The window ends at the newest
// data the TSDB holds for the query, as the operator's dataEnd does: the evaluation time, or the
// newest searchable scrape when that is earlier.
func (s *simulation) coverageOver(t, window float64) float64 {
	if s.lastApply == 0 {
		return 1
	}
	evalAt, visibleTo := s.evalAt(t)
	end := math.Min(evalAt, visibleTo)
	return math.Max(minCoverage, math.Min(1, (end-s.lastApply)/window))
}

// minCoverage stands for "nothing of the window was observed under the current weights".
const minCoverage = 1e-9

// peakRateHorizon is how far back the recent peak request rate reaches (the operator's
// peakRateWindow), in seconds.
const peakRateHorizon = 600

// rateObservation is the Service's request rate one cycle observed.
type rateObservation struct{ at, rate float64 }

// recordPeak keeps this cycle's Service rate, when some pod's rate was usable, drops the
// observations older than peakRateHorizon and returns the highest left; 0 (unknown) while no
// observation predates this cycle. This is the operator's rule (WeightCycle.recentPeak): the
// peak is the highest of the rates its cycles saw, each the sum of the pods' rate() over one
// window as the TSDB answered.
func (s *simulation) recordPeak(t, rate float64, observed bool) float64 {
	drop := 0
	for drop < len(s.rateHistory) && s.rateHistory[drop].at <= t-peakRateHorizon {
		drop++
	}
	s.rateHistory = s.rateHistory[drop:]
	if observed {
		s.rateHistory = append(s.rateHistory, rateObservation{at: t, rate: rate})
	}
	if len(s.rateHistory) == 0 || s.rateHistory[0].at >= t {
		return 0
	}
	peak := 0.0
	for _, o := range s.rateHistory {
		peak = math.Max(peak, o.rate)
	}
	return peak
}
