package weights

import (
	"fmt"
	"math"
)

// This file learns a Service's caution from its own past. The tail algorithm's surge bound
// (TailParams.SurgeFactor) keeps every split able to carry a sudden rise of the load until the
// loop has seen it; one default for every Service makes the steady ones pay for the surges of
// others. How far a Service's load has risen within the loop's reaction time, over its last days,
// is in the TSDB: LearnLoadHistory reads it from the Service's rate series, and SurgeBound turns
// it into the bound that history needs.

// LoadHistory is what a Service's past load says about how fast it rises.
type LoadHistory struct {
	// MaxRise is the largest factor by which the Service's request rate rose, within the loop's
	// reaction time, above the highest rate it had held over the peak horizon before: the surge
	// the planning load (which covers the recent peak) did not cover. 1.3 is a rise to 30% above
	// the recent peak; at most 1 for a load that never rose above it. 0 means unknown.
	MaxRise float64
	// RiseAt is the end of the window in which MaxRise was reached (seconds, the samples' clock).
	RiseAt float64
	// Seconds is the span of history it was learned from, and Samples the rates in it.
	Seconds float64
	Samples int
	// TooShortFor is set when the history spans less than the learner needs (this many seconds):
	// it is unknown, and says why.
	TooShortFor float64
}

// Known reports whether there is a history to learn from.
func (h LoadHistory) Known() bool { return h.MaxRise > 0 && h.Samples > 0 }

// minHistoryRate is the rate below which the recent peak is taken as this many requests per
// second: a Service that wakes from idle does surge, but a rise from 0.01 rps says nothing more
// than one from 1 rps.
const minHistoryRate = 1

// historyNoiseZ is how many standard deviations of a short rate's Poisson noise a rise must
// exceed to count: the largest of thousands of noisy rates lies about four of them above the
// mean, and a steady Service must not learn a surge from its own noise.
const historyNoiseZ = 5

// HistorySeries is a Service's request rate over its past, as two range queries return it.
type HistorySeries struct {
	// Planned holds the rates the weight cycles plan with: each the Service's rate over the
	// cycles' window (a minute), oldest first.
	Planned []RateSample
	// Short holds the rates over the shortest window the TSDB resolves (a scrape interval, from
	// the last two samples), oldest first: a burst shorter than the cycles' window shows here at
	// close to its height.
	Short []RateSample
	// ShortSeconds is the window of each Short rate, for its noise.
	ShortSeconds float64
}

// LearnLoadHistory returns the largest rise of the Service's short rate, within reactionSeconds
// of any instant, over the highest planned rate of the peakSeconds before it (the recent peak the
// cycles plan for), beyond the short rate's sampling noise. Samples that are not finite, negative
// or out of order are skipped; gaps are allowed. The history is unknown without two usable
// samples in either series, when it spans less than minSpanSeconds (a Service an hour old has
// not shown its daily peak yet) or its compared samples cover less than half of that, and when
// no short rate had a recent peak to be compared with.
func LearnLoadHistory(series HistorySeries, reactionSeconds, peakSeconds, minSpanSeconds float64) LoadHistory {
	planned, short := cleanRates(series.Planned), cleanRates(series.Short)
	if len(planned) < 2 || len(short) < 2 || !(reactionSeconds > 0) || !(peakSeconds > 0) || !(series.ShortSeconds > 0) {
		return LoadHistory{}
	}
	first := math.Min(planned[0].EndSeconds, short[0].EndSeconds)
	last := math.Max(planned[len(planned)-1].EndSeconds, short[len(short)-1].EndSeconds)
	if last-first < minSpanSeconds {
		return LoadHistory{Seconds: last - first, Samples: len(planned) + len(short), TooShortFor: minSpanSeconds}
	}
	h := LoadHistory{Seconds: last - first, Samples: len(planned) + len(short)}
	compared, comparisons := false, 0
	// Monotone queues of the indexes whose rates can still be the maximum of the window behind
	// (planned rates) and of the window ahead (short rates) keep the pass linear: three days are
	// thousands of samples.
	var behind, ahead []int
	nextPlanned, nextShort := 0, 0
	for _, s := range short {
		t := s.EndSeconds
		for nextPlanned < len(planned) && planned[nextPlanned].EndSeconds <= t {
			for len(behind) > 0 && planned[behind[len(behind)-1]].Rate <= planned[nextPlanned].Rate {
				behind = behind[:len(behind)-1]
			}
			behind = append(behind, nextPlanned)
			nextPlanned++
		}
		for len(behind) > 0 && planned[behind[0]].EndSeconds <= t-peakSeconds {
			behind = behind[1:]
		}
		for len(ahead) > 0 && short[ahead[0]].EndSeconds <= t {
			ahead = ahead[1:]
		}
		for nextShort < len(short) && short[nextShort].EndSeconds <= t+reactionSeconds {
			if short[nextShort].EndSeconds > t {
				for len(ahead) > 0 && beyondRateNoise(short[ahead[len(ahead)-1]].Rate, series.ShortSeconds) <= beyondRateNoise(short[nextShort].Rate, series.ShortSeconds) {
					ahead = ahead[:len(ahead)-1]
				}
				ahead = append(ahead, nextShort)
			}
			nextShort++
		}
		if len(behind) == 0 || len(ahead) == 0 {
			continue
		}
		peak := math.Max(minHistoryRate, planned[behind[0]].Rate)
		if rise := beyondRateNoise(short[ahead[0]].Rate, series.ShortSeconds) / peak; !compared || rise > h.MaxRise {
			h.MaxRise, h.RiseAt = rise, short[ahead[0]].EndSeconds
		}
		compared = true
		comparisons++
	}
	if !compared {
		return LoadHistory{} // the two series never overlapped: nothing was measured
	}
	// The span runs from the first sample to the last; an hour three days ago and an hour now
	// span three days but show two hours. Half the span needed must have been compared.
	if covered := float64(comparisons) * series.ShortSeconds; covered < minSpanSeconds/2 {
		return LoadHistory{Seconds: covered, Samples: h.Samples, TooShortFor: minSpanSeconds}
	}
	// A rise below the noise floor is a flat load, not an unknown one.
	h.MaxRise = math.Max(h.MaxRise, 1e-9)
	return h
}

// MinHistorySeconds is the span a load history must cover to be learned from when lookback
// seconds were asked for: a whole day, where a daily peak lies, or most of the lookback when it is
// shorter; a tenth is left for the edges (the first scrape, the newest sample's lag).
func MinHistorySeconds(lookback float64) float64 { return 0.9 * math.Min(lookback, 86400) }

// beyondRateNoise is a rate counted over seconds less historyNoiseZ standard deviations of its
// Poisson noise.
func beyondRateNoise(rate, seconds float64) float64 {
	return math.Max(0, rate-historyNoiseZ*math.Sqrt(rate/seconds))
}

// cleanRates keeps the finite, non-negative samples in increasing time.
func cleanRates(samples []RateSample) []RateSample {
	var xs []RateSample
	for _, s := range samples {
		if finite(s.EndSeconds) && finite(s.Rate) && s.Rate >= 0 && (len(xs) == 0 || s.EndSeconds > xs[len(xs)-1].EndSeconds) {
			xs = append(xs, s)
		}
	}
	return xs
}

// historySafety is the margin over the largest rise a history shows. The TSDB resolves a rise no
// finer than a scrape interval, so a burst shorter than that shows at only part of its height (a
// 10 s burst to twice the load reads as 1.4 times in 15 s rates), and the next surge may exceed the
// largest of the last days. 1.25 and 1.5 left the suite's 10 s bursts (bursts-scale-in) above
// least_request; 2 covers them.
const historySafety = 2.0

// SurgeBound is the surge factor the tail algorithm plans with, and why: without a history, the
// default (TailParams.SurgeFactor); with one, the rise it shows, with historySafety's margin,
// beyond what the planning load's own margin (BurstMargin) covers, or 1 (no bound: the model's
// split) for a Service whose load never rose beyond that margin. The bound may exceed the default:
// the default is what a Service without history gets, not a cap. Capping a 3.1× rise's 5.6 at
// the default 4 put bursts-one-fast-pod above least_request (94.8 against 83.8 ms), though it
// helped one random flash crowd (random-s1-141: 217.5 → 170.5 ms).
func SurgeBound(p TailParams, h LoadHistory) (float64, string) {
	if h.TooShortFor > 0 {
		return p.SurgeFactor, fmt.Sprintf("%s of load history, less than the %s needed: the default surge bound %s", formatSpan(h.Seconds), formatSpan(h.TooShortFor), formatFactor(p.SurgeFactor))
	}
	if !h.Known() {
		return p.SurgeFactor, fmt.Sprintf("no load history: the default surge bound %s", formatFactor(p.SurgeFactor))
	}
	span := formatSpan(h.Seconds)
	if h.MaxRise <= p.BurstMargin {
		return 1, fmt.Sprintf("over %s its load never rose more than %s above its recent peak within the loop's reaction time, inside the planning margin %s: no surge bound", span, formatFactor(h.MaxRise), formatFactor(p.BurstMargin))
	}
	f := h.MaxRise * historySafety / p.BurstMargin
	return f, fmt.Sprintf("over %s its load rose up to %s its recent peak within the loop's reaction time: surge bound %s (twice that rise, over the planning margin %s)", span, formatFactor(h.MaxRise), formatFactor(f), formatFactor(p.BurstMargin))
}

// firstPlanMargin is the margin over the current rate the tail algorithm plans with while the
// recent peak is unknown: unknownPeakMargin without a history; with one, the largest rise it
// shows (at least BurstMargin), since the load has not risen faster than that before.
func firstPlanMargin(p TailParams, h LoadHistory) float64 {
	if !h.Known() {
		return math.Max(p.BurstMargin, unknownPeakMargin)
	}
	return math.Max(PlanningMargin(p, h), math.Min(unknownPeakMargin, h.MaxRise))
}

// PlanningMargin is the margin over the recent peak (and the projected rate) the tail algorithm
// plans with: BurstMargin, or less for a Service whose history shows no rise that large. A
// margin the load never needed costs the fast pods their share at high load: on three-gens-85
// (85% of capacity, a flat history) planning at 1.1 times the load gave a p99 of 197 – 209 ms
// over three seeds, at the load itself 177 – 186 ms.
func PlanningMargin(p TailParams, h LoadHistory) float64 {
	if !h.Known() {
		return p.BurstMargin
	}
	return math.Max(1, math.Min(p.BurstMargin, h.MaxRise))
}

func formatFactor(f float64) string { return fmt.Sprintf("%.3g×", f) }

func formatSpan(seconds float64) string {
	switch {
	case seconds >= 2*86400:
		return fmt.Sprintf("%.0f days", seconds/86400)
	case seconds >= 2*3600:
		return fmt.Sprintf("%.0f hours", seconds/3600)
	default:
		return fmt.Sprintf("%.0f minutes", seconds/60)
	}
}
