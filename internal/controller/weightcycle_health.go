package controller

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// metricsHealth sums up one target's metrics for its condition, its log lines and its events.
type metricsHealth struct {
	pods int
	// complete counts the pods with every signal the algorithm needs, usable (present, finite
	// and fresh). None at all is a metrics outage.
	complete int
	// stale counts the pods whose needed signals are all present, some of them too old; age
	// is the youngest of their stale samples' ages and threshold the limit.
	stale          int
	age, threshold time.Duration
	// unscraped counts the pods with no series at all for a needed signal (the TSDB has
	// nothing for them: not scraped yet, or never).
	unscraped int
	// failed lists the signals whose query failed for every pod (not a per-pod fault such as
	// no series, NaN or a stale sample), and failure one of those errors.
	failed  []metrics.Signal
	failure error
	// detail is every distinct error seen, for the log and the event; never in a condition.
	detail []string
	// rateObserved: some pod's request rate was usable, and serviceRate sums them.
	rateObserved bool
	// histogramFailure is the failure of the latency-histogram query, when it failed for the
	// Service's pods: the engine does without the histograms.
	histogramFailure error
	// dataEnd is when the window the TSDB answered for ends (see dueTarget.dataEnd).
	dataEnd time.Time
}

// dataEnd is when the metrics window the TSDB answered for ends: the newest time up to which
// some pod's request series all have samples, or now when none says. A TSDB that answers in the
// past (VictoriaMetrics' -search.latencyOffset, 30 s by default, when no latency_offset is sent)
// evaluates the queries sent now as of that long ago, so the window is (dataEnd - window,
// dataEnd], not (now - window, now]: a write made after dataEnd is not in it at all. Reading the
// newest data (--tsdb-latency-offset=0s), dataEnd trails now by the scrape interval and the
// ingestion delay only. A pod whose newest scrape is not visible yet is not read as quieter for
// it: rate() in VictoriaMetrics is the increase from the last sample before the window to the
// last one in it over their time apart, so the pod's rate covers a window ending one scrape
// earlier; and a pod with a request series that has no sample in the window at all (a scrape
// made only part visible, when the window holds a single scrape) is stale through the freshness
// probe (metrics.DefaultIstioFreshnessQuery) rather than summed without that series.
func (d *dueTarget) dataEnd(now time.Time, res fetchResult) time.Time {
	var end time.Time
	for _, ip := range d.podOrder {
		pod, ok := d.pods[ip]
		if !ok {
			continue
		}
		o, found := res.observations[observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}]
		if ts := o.RequestRate.Timestamp; found && o.RequestRate.Present && ts.After(end) {
			end = ts
		}
	}
	if end.IsZero() || end.After(now) {
		return now
	}
	return end
}

// windowCoverage is the fraction of the window ending at dataEnd that lies after the last
// weight write: the part of the observation made under the weights now in force. The engine
// reads 0 as unknown (and treats it as 1), so a window wholly before the write gets the smallest
// positive fraction instead.
func windowCoverage(dataEnd, lastWrite time.Time, window time.Duration) float64 {
	if lastWrite.IsZero() {
		return 1
	}
	return math.Max(minWindowCoverage, math.Min(1, dataEnd.Sub(lastWrite).Seconds()/window.Seconds()))
}

// minWindowCoverage stands for "nothing of the window was observed under the current weights".
const minWindowCoverage = 1e-9

// minMembershipShare is the share of the metrics window an endpoint must have spent in the
// ServiceEntry for its signals to count; below it the endpoint is treated as without metrics.
const minMembershipShare = 0.5

// neededSignals are the signals the weight engine cannot do without: the CPU cost per request
// needs both. Error rate and latency only refine it.
var neededSignals = []metrics.Signal{metrics.SignalCPU, metrics.SignalRequestRate}

// queryFailure reports whether a sample's error is the failure of its whole query rather than
// a fault of one pod's data.
func queryFailure(err error) bool {
	// No series at all is not a failure of the query: a Service without latency histograms
	// has no p99, and a missing needed signal is an outage anyway.
	return err != nil && !errors.Is(err, metrics.ErrNoData) && !errors.Is(err, metrics.ErrStale) &&
		!errors.Is(err, metrics.ErrNonFinite) && !errors.Is(err, metrics.ErrDuplicateSeries)
}

// target turns a due AdaptiveLoadBalancer and the batch, its rates over window, into the
// planner's input. A metrics outage, for the hold/fallback policy, is "no pod has every signal
// the algorithm needs": one missing signal (only the Istio series, or only CPU) is as much an
// outage as a TSDB down.
func (d *dueTarget) target(now time.Time, res fetchResult, window time.Duration, holdIntervals int, known map[string]bool, membership *Membership) (cycle.Target, metricsHealth) {
	t := cycle.Target{
		Key:        d.key.String(),
		Settings:   d.settings,
		HoldTime:   time.Duration(holdIntervals) * d.interval,
		DryRun:     d.alb.Spec.Mode == adlbv1.ModeDryRun,
		PeerGroups: d.peerGroup,
		Known:      known,
		Slices:     d.sliceOf(),
	}
	t.WindowSeconds = window.Seconds()
	h := metricsHealth{threshold: 2 * d.interval, dataEnd: d.dataEnd(now, res)}
	t.WindowCoverage = windowCoverage(h.dataEnd, d.lastWrite, window)
	seen := map[string]bool{}
	note := func(err error) {
		if err == nil {
			return
		}
		if msg := err.Error(); !seen[msg] && len(h.detail) < 20 {
			seen[msg] = true
			h.detail = append(h.detail, msg)
		}
	}
	signalOK := map[metrics.Signal]bool{}
	var signalErr map[metrics.Signal]error
	for _, ip := range d.podOrder {
		ep := weights.Endpoint{ID: ip, CurrentWeight: d.current[ip]}
		pod, ok := d.pods[ip]
		if !ok {
			t.Endpoints = append(t.Endpoints, ep)
			continue
		}
		h.pods++
		ep.CPULimitCores = cpuLimit(pod)
		ep.NodeCPUCores = d.nodeCPU[ip]
		warming := d.warmup > 0 && pod.Status.StartTime != nil && now.Sub(pod.Status.StartTime.Time) < d.warmup
		o, found := res.observations[observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}]
		if !found {
			// The whole fetch failed (an invalid request, a freshness template that does not render).
			failure := res.err
			if failure == nil {
				failure = errors.New("the metrics source returned nothing for this pod")
			}
			o = metrics.Observation{CPUCores: metrics.Sample{Err: failure}, RequestRate: metrics.Sample{Err: failure}, ErrorRate: metrics.Sample{Err: failure}, LatencyP99Seconds: metrics.Sample{Err: failure}}
		}
		for _, sig := range metrics.Signals {
			sample := o.Sample(sig)
			note(sample.Err)
			if !queryFailure(sample.Err) {
				signalOK[sig] = true
			} else if signalErr == nil || signalErr[sig] == nil {
				if signalErr == nil {
					signalErr = map[metrics.Signal]error{}
				}
				signalErr[sig] = sample.Err
			}
		}
		ep.CPUCores, ep.RequestRate = o.CPUCores.Value, o.RequestRate.Value
		ep.LatencyBuckets = latencyBuckets(o.LatencyBuckets)
		if queryFailure(o.LatencyBucketsErr) {
			note(o.LatencyBucketsErr) // for the log; the engine does without the histogram
			if h.histogramFailure == nil {
				h.histogramFailure = o.LatencyBucketsErr
			}
		}
		if o.RequestRate.Usable() {
			// The whole window's rate, whatever the pod's time in the ServiceEntry: it is
			// what the Service served.
			d.serviceRate += o.RequestRate.Value
			h.rateObserved = true
		}
		ep.ErrorRate, ep.LatencyP99Seconds = o.ErrorRate.Value, o.LatencyP99Seconds.Value
		complete, stale, unscraped := true, false, false
		for _, sig := range neededSignals {
			sample := o.Sample(sig)
			if sample.Usable() {
				continue
			}
			complete = false
			unscraped = unscraped || (!sample.Present && errors.Is(sample.Err, metrics.ErrNoData))
			var se *metrics.StaleError
			if sample.Present && errors.As(sample.Err, &se) {
				stale = true
				if !se.Unknown && (h.age == 0 || se.Age < h.age) {
					h.age = se.Age
				}
			} else {
				stale = false
				break
			}
		}
		if complete {
			h.complete++
		} else if stale {
			h.stale++
		}
		if unscraped {
			h.unscraped++
		}
		// Only the time in the ServiceEntry counts: a pod out of it for part of the window
		// (readiness flapping, just joined) served nothing then, which is no sign of spare
		// capacity. Its rates are taken over its time in; too little time in says too little.
		inWindow := membership.Share(d.key, ip, h.dataEnd.Add(-window), h.dataEnd)
		if inWindow < 1 && inWindow >= minMembershipShare {
			ep.CPUCores, ep.RequestRate, ep.ErrorRate = ep.CPUCores/inWindow, ep.RequestRate/inWindow, ep.ErrorRate/inWindow
		}
		// A pod still in its DestinationRule warm-up keeps its weight: Envoy is ramping its
		// traffic up, so its signals say nothing about its capacity yet.
		ep.HasMetrics = complete && !warming && inWindow >= minMembershipShare
		t.Endpoints = append(t.Endpoints, ep)
	}
	for _, sig := range metrics.Signals {
		if h.pods > 0 && !signalOK[sig] {
			h.failed = append(h.failed, sig)
			if h.failure == nil {
				h.failure = signalErr[sig]
			}
		}
	}
	if h.complete == 0 && h.pods > 0 {
		t.MetricsErr = errors.New(h.outageSummary(d.settings.Algorithm))
	}
	return t, h
}

// outageSummary says in one short line why no pod has usable metrics; the full errors go to
// the log and an event.
func (h metricsHealth) outageSummary(alg weights.Algorithm) string {
	needed := fmt.Sprintf("no pod has every signal the %s algorithm needs (%s)", alg, signalList(neededSignals))
	switch {
	case h.stale == h.pods:
		return fmt.Sprintf("%s: every pod's newest sample is too old (%s, limit %s = 2× interval); %s", needed, h.age.Round(time.Second), h.threshold, staleHint)
	case len(h.failed) > 0:
		return fmt.Sprintf("%s: %s query failed: %s", needed, signalList(h.failed), shorten(h.failure.Error(), 160))
	}
	return needed + ": " + shorten(strings.Join(h.detail, "; "), 200)
}

// staleHint says what to change when samples arrive too old: with the newest data asked for,
// a scrape too rare for the interval; otherwise, or on a TSDB that ignores the argument, the
// TSDB answering in the past.
const staleHint = "check --tsdb-latency-offset (0s reads the newest data; with none, or a TSDB that ignores it, VictoriaMetrics answers 30s in the past: lower its -search.latencyOffset), scrape more often or raise spec.interval; see docs/metrics.md"

func signalList(sigs []metrics.Signal) string {
	names := make([]string, len(sigs))
	for i, s := range sigs {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// sliceOf says which of the ServiceEntry slices holds each address, for the write budget, which
// counts the objects a write patches; nil for a Service in one object.
func (d *dueTarget) sliceOf() map[string]int {
	if len(d.slices) < 2 {
		return nil
	}
	out := map[string]int{}
	for i, se := range d.slices {
		for _, e := range se.Spec.Endpoints {
			out[e.Address] = i
		}
	}
	return out
}
