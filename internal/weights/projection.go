package weights

import "math"

// RateSample is the Service's request rate averaged over one metrics window, and when that window
// ended (seconds on any clock the caller keeps consistent).
type RateSample struct {
	EndSeconds float64
	Rate       float64
}

// maxProjectionGrowth bounds a projection as a multiple of the latest rate: a trend drawn from a
// few windows must not plan for a load the Service has never seen the like of.
const maxProjectionGrowth = 2

// ProjectRequestRate extrapolates a rising request rate to horizonSeconds after the end of the
// latest window: the slope is the least-squares fit over the samples given (oldest first; the
// caller passes the last few cycles' windows). A falling or flat rate projects to the latest rate:
// the recent peak already covers a load that comes back. Fewer than two samples, or samples that
// do not move forward in time, give 0 (unknown).
//
// The horizon is how far ahead the weights decided now must hold: half a window (the window's
// average lags its end by that much for a steady ramp), the TSDB's delay in answering (its latency
// offset), the time until the next cycle, and the push.
func ProjectRequestRate(samples []RateSample, horizonSeconds float64) float64 {
	if len(samples) < 2 || !(horizonSeconds >= 0) {
		return 0
	}
	// Times relative to the latest window's end: wall-clock seconds (about 1.8e9) squared would
	// leave float64 no digits for the differences the slope is made of.
	latest := samples[len(samples)-1]
	var n, sx, sy, sxx, sxy float64
	for _, s := range samples {
		if !finite(s.EndSeconds) || !finite(s.Rate) || s.Rate < 0 {
			return 0
		}
		x := s.EndSeconds - latest.EndSeconds
		n++
		sx += x
		sy += s.Rate
		sxx += x * x
		sxy += x * s.Rate
	}
	den := n*sxx - sx*sx
	if !(den > 0) {
		return 0
	}
	slope := (n*sxy - sx*sy) / den
	if !(slope > 0) {
		return latest.Rate
	}
	return math.Min(latest.Rate+slope*horizonSeconds, maxProjectionGrowth*latest.Rate)
}

// risingLoadFraction is how far above the current rate the projected rate must be for the load to
// count as rising.
const risingLoadFraction = 0.1

// rising reports whether the tail algorithm plans for a load still rising: the projected rate lies
// well above the window's. The target shares then answer a known change, not noise, and the
// feedback takes its whole correction at once: a ramp outruns a correction halved every cycle.
func rising(in Input, totalRate float64) bool {
	return in.ProjectedRequestRate > totalRate*(1+risingLoadFraction)
}
