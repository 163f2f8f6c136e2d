package controller

import (
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// rateObservation is the Service's total request rate one cycle observed.
type rateObservation struct {
	at   time.Time
	rate float64
}

// peakRateWindow is how far back the recent peak request rate reaches: long enough to remember
// a burst through a few quiet cycles, short enough that a Service whose traffic fell for good
// is soon planned for its new level.
const peakRateWindow = 10 * time.Minute

// recentPeak records this cycle's rate of the Service (when observed), drops the observations
// older than peakRateWindow and returns the highest left. It returns 0, unknown, while the history
// holds nothing from before this cycle: one rate cannot tell a steady load from the quiet half of a
// burst, and the engine plans with its margin for an unknown peak instead. The simulator's
// controller does the same (its first cycle has no full window). The cycle holds w.mu.
func (w *WeightCycle) recentPeak(key types.NamespacedName, now time.Time, rate float64, observed bool) float64 {
	if w.rateHistory == nil {
		w.rateHistory = map[types.NamespacedName][]rateObservation{}
	}
	h := w.rateHistory[key]
	drop := 0
	for drop < len(h) && !h[drop].at.After(now.Add(-peakRateWindow)) {
		drop++
	}
	h = slices.Delete(h, 0, drop)
	if observed {
		h = append(h, rateObservation{at: now, rate: rate})
	}
	if len(h) == 0 {
		delete(w.rateHistory, key)
		return 0
	}
	w.rateHistory[key] = h
	if !h[0].at.Before(now) {
		return 0
	}
	peak := 0.0
	for _, o := range h {
		peak = max(peak, o.rate)
	}
	return peak
}

// trendCycles is how many cycles' rates the Service's rate trend is fitted over.
const trendCycles = 3

// pushDelay is how long a weight write takes to reach the proxies (istiod's debounce and push),
// for the projection's horizon.
const pushDelay = time.Second

// projectedRate extrapolates the Service's rate, as the last trendCycles cycles observed it, to
// when the weights decided now will have been replaced: half a window (a window's average lags
// its end), how far in the past the TSDB answered (lag), the next cycle and the push. The
// simulator's controller does the same. 0 (unknown) with fewer than two observations. The
// cycle holds w.mu.
func (w *WeightCycle) projectedRate(key types.NamespacedName, lag, interval time.Duration) float64 {
	h := w.rateHistory[key]
	h = h[max(0, len(h)-trendCycles):]
	samples := make([]weights.RateSample, len(h))
	for i, o := range h {
		samples[i] = weights.RateSample{EndSeconds: float64(o.at.UnixMilli()) / 1000, Rate: o.rate}
	}
	window := 2 * interval
	horizon := window/2 + max(0, lag) + interval + pushDelay
	return weights.ProjectRequestRate(samples, horizon.Seconds())
}

// peakObservation is the highest rate in key's history (the latest of equal ones). The cycle
// holds w.mu.
func (w *WeightCycle) peakObservation(key types.NamespacedName) (rateObservation, bool) {
	h := w.rateHistory[key]
	if len(h) == 0 {
		return rateObservation{}, false
	}
	peak := h[0]
	for _, o := range h[1:] {
		if o.rate >= peak.rate {
			peak = o
		}
	}
	return peak, true
}

// seedPeak starts key's rate history from status.recentPeak, which the previous leader wrote,
// when it is still within peakRateWindow: otherwise a new leader would plan for its first
// cycle's rate for the next ten minutes, less cautiously than for an unknown peak. A time
// ahead of this process's clock (the other node's clock runs ahead) counts as now. The cycle
// holds w.mu.
func (w *WeightCycle) seedPeak(key types.NamespacedName, alb *adlbv1.AdaptiveLoadBalancer, now time.Time) {
	p := alb.Status.RecentPeak
	if p == nil || len(w.rateHistory[key]) > 0 {
		return
	}
	rate, err := strconv.ParseFloat(string(p.RequestRate), 64)
	if err != nil || rate <= 0 {
		return
	}
	at := p.ObservedAt.Time
	if at.After(now) {
		at = now
	}
	if !at.After(now.Add(-peakRateWindow)) {
		return
	}
	if w.rateHistory == nil {
		w.rateHistory = map[types.NamespacedName][]rateObservation{}
	}
	w.rateHistory[key] = []rateObservation{{at: at, rate: rate}}
}

// recentPeakStatus is status.recentPeak for the observation peak, or nil when there is none or
// its rate does not fit the schema's Decimal (a negative rate or one of 10^14 per second and
// more, which only a wrong query gives): the API server would refuse the whole status write,
// conditions and all, every cycle while that rate is in the window.
func recentPeakStatus(peak rateObservation, observed bool) *adlbv1.RecentPeak {
	if !observed || !(peak.rate >= 0) {
		return nil
	}
	rate := strconv.FormatFloat(peak.rate, 'f', 1, 64)
	if len(rate) > maxDecimalLength {
		return nil
	}
	return &adlbv1.RecentPeak{RequestRate: adlbv1.Decimal(rate), ObservedAt: metav1.NewTime(peak.at)}
}

// maxDecimalLength is the schema's MaxLength of a Decimal (api/v1alpha1).
const maxDecimalLength = 16

// peakRewriteFactor is how far the recent peak must rise above the one in status to be written
// at once.
const peakRewriteFactor = 1.1

// minorPeakChange reports whether the recent peak went from old to updated without rising by
// more than peakRewriteFactor; a first peak is no minor change.
func minorPeakChange(old, updated *adlbv1.RecentPeak) bool {
	if updated == nil {
		return true
	}
	if old == nil {
		return false
	}
	o, errO := strconv.ParseFloat(string(old.RequestRate), 64)
	u, errU := strconv.ParseFloat(string(updated.RequestRate), 64)
	return errO == nil && errU == nil && u <= o*peakRewriteFactor
}
