package sim

import (
	"math"
	"math/rand"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// This file is the Service's past as the controller finds it in the TSDB (Scenario.Load.History):
// the series of its request rate over the last days, which the operator reads once and learns its
// caution from (weights.LearnLoadHistory, weights.SurgeBound). The simulator builds that series
// from the scenario: HistorySame repeats the run's offered load over historyDays, HistorySteady
// holds the run's first rate, both with the Poisson noise of a rate measured over a window;
// HistoryNone is a new Service.

// historyDays is how much history the operator reads (its --load-history).
const historyDays = 3

// loadHistory builds the scenario's history series and learns from it. The planned series is the
// Service's rate over the controller window at every interval, as `sum(rate(...[1m]))` over a
// range at a 30 s step returns it; the short series its rate over one scrape interval at every
// scrape, as `sum(irate(...[1m]))` at a 15 s step does.
func (s *simulation) loadHistory() weights.LoadHistory {
	if s.sc.Load.History == HistoryNone {
		return weights.LoadHistory{}
	}
	c := s.sc.Controller
	rateAt := s.offeredRate
	if s.sc.Load.History == HistorySteady {
		first := s.sc.Load.RPS
		rateAt = func(float64) float64 { return first }
	}
	// The noise of a rate counted over a window: Poisson, from its own generator so that it is
	// the same under every policy.
	noise := rand.New(rand.NewSource(s.sc.Seed ^ 0x415f0123))
	counted := func(from, to float64) float64 {
		var sum float64
		for u := from + 0.5; u < to; u++ {
			sum += rateAt(u)
		}
		n := math.Max(0, sum+noise.NormFloat64()*math.Sqrt(sum))
		return n / (to - from)
	}
	// Copies of the run, each after a gap longer than the peak horizon and the reaction time, so
	// that the jump from one copy's end to the next one's start is not taken for a surge.
	gap := float64(peakRateHorizon) + s.reactionSeconds() + c.Window.Seconds()
	span := s.end + gap
	copies := int(math.Ceil(historyDays * 86400 / span))
	window, interval, scrape := c.Window.Seconds(), c.Interval.Seconds(), c.Metrics.ScrapeInterval.Seconds()
	series := weights.HistorySeries{ShortSeconds: scrape}
	for k := 0; k < copies; k++ {
		offset := float64(k) * span
		for t := window; t <= s.end; t += interval {
			series.Planned = append(series.Planned, weights.RateSample{EndSeconds: offset + t, Rate: counted(t-window, t)})
		}
		for t := scrape; t <= s.end; t += scrape {
			series.Short = append(series.Short, weights.RateSample{EndSeconds: offset + t, Rate: counted(t-scrape, t)})
		}
	}
	// A real Service's series run on between copies; the simulator leaves gaps so that one copy's
	// end and the next one's start are not read as a surge. The span the learner asks for shrinks
	// with the part of the three days the copies fill: the gaps are the construction's, not data
	// the TSDB lacks.
	filled := math.Min(1, float64(copies)*s.end/(historyDays*86400))
	return weights.LearnLoadHistory(series, s.reactionSeconds(), peakRateHorizon, filled*weights.MinHistorySeconds(historyDays*86400))
}

// offeredRate is the scenario's offered request rate at simulated time t.
func (s *simulation) offeredRate(t float64) float64 {
	rate := s.sc.Load.RPS
	at := -1.0
	for _, ph := range s.sc.Load.Phases {
		if a := ph.At.Seconds(); a <= t && a >= at {
			rate, at = ph.RPS, a
		}
	}
	return rate
}

// reactionSeconds is how long the weights decided at a cycle must hold before the next cycle's
// replace them: half a window (a window's average lags its end), the data's lag, the next cycle
// and the push. The rate projection looks this far ahead, and the load history measures rises
// over it.
func (s *simulation) reactionSeconds() float64 {
	c := s.sc.Controller
	return c.Window.Seconds()/2 + s.dataLag() + c.Interval.Seconds() + c.ApplyDelay.Seconds()
}

// dataLag is how old the newest data a policy's queries read is: the offset they are evaluated
// at, or the ingestion delay when that is longer.
func (s *simulation) dataLag() float64 {
	m := s.sc.Controller.Metrics
	return math.Max(m.OffsetFor(s.policy).Seconds(), m.IngestionDelay.Seconds())
}

// learnSurge fills the run's surge bound from the history, for the tail algorithm.
func (s *simulation) learnSurge() {
	if s.settings == nil || s.settings.Algorithm != weights.AlgorithmTail {
		return
	}
	s.history = s.loadHistory()
	f, why := weights.SurgeBound(s.settings.Tail, s.history)
	s.surgeFactor = f
	s.surge = &SurgeBound{Factor: f, Reason: why, MaxRise: s.history.MaxRise}
}
