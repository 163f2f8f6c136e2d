package weights

import (
	"math"
	"math/rand"
	"strings"
	"testing"
)

// historyOf builds the two series of a rate function over the given seconds: planned rates over
// 60 s every 30 s, short rates over 15 s every 15 s, each counted with Poisson noise.
func historyOf(seconds float64, rate func(t float64) float64, seed int64) HistorySeries {
	noise := rand.New(rand.NewSource(seed))
	counted := func(from, to float64) float64 {
		var sum float64
		for u := from + 0.5; u < to; u++ {
			sum += rate(u)
		}
		return math.Max(0, sum+noise.NormFloat64()*math.Sqrt(sum)) / (to - from)
	}
	h := HistorySeries{ShortSeconds: 15}
	for t := 60.0; t <= seconds; t += 30 {
		h.Planned = append(h.Planned, RateSample{EndSeconds: t, Rate: counted(t-60, t)})
	}
	for t := 15.0; t <= seconds; t += 15 {
		h.Short = append(h.Short, RateSample{EndSeconds: t, Rate: counted(t-15, t)})
	}
	return h
}

const day = 86400

func TestLearnLoadHistory_ASteadyServiceNeverRose(t *testing.T) {
	for _, rps := range []float64{5, 100, 2000} {
		h := LearnLoadHistory(historyOf(3*day, func(float64) float64 { return rps }, 1), 66, 600, 0)
		if !h.Known() || h.MaxRise > 1.05 {
			t.Fatalf("%v rps steady for 3 days: max rise %.3f (known %v), want at most 1.05 (its noise is no surge)", rps, h.MaxRise, h.Known())
		}
		if f, why := SurgeBound(DefaultSettings(AlgorithmTail).Tail, h); f != 1 || !strings.Contains(why, "no surge bound") {
			t.Fatalf("%v rps steady: surge bound %v (%s), want 1", rps, f, why)
		}
	}
}

func TestLearnLoadHistory_FindsTheSurgeWithinTheReactionTime(t *testing.T) {
	// 200 rps, with a crowd to 700 rps for two minutes each afternoon.
	rate := func(t float64) float64 {
		if s := math.Mod(t, day); s >= 50000 && s < 50120 {
			return 700
		}
		return 200
	}
	h := LearnLoadHistory(historyOf(3*day, rate, 2), 66, 600, 0)
	if h.MaxRise < 3.2 || h.MaxRise > 3.5 {
		t.Fatalf("a 3.5× crowd read as a %.2f× rise, want about 3.3 (the short rate less its noise)", h.MaxRise)
	}
	if at := math.Mod(h.RiseAt, day); at < 50000 || at > 50150 {
		t.Fatalf("rise found at %.0f s into a day, want the crowd at 50,000 s", at)
	}
	// Twice the rise over the margin, above the default (4×): the default is no cap.
	f, why := SurgeBound(DefaultSettings(AlgorithmTail).Tail, h)
	if want := h.MaxRise * historySafety / 1.1; math.Abs(f-want) > 1e-9 || f <= 4 || !strings.Contains(why, "3 days") {
		t.Fatalf("surge bound %v (%s), want %v", f, why, want)
	}
}

func TestLearnLoadHistory_ARiseTheRecentPeakCoversIsNoSurge(t *testing.T) {
	// Every 4 minutes the load swings between 300 and 600 rps: each rise returns to a level the
	// last 10 minutes held, which the cycles already plan for.
	rate := func(t float64) float64 {
		if math.Mod(t, 240) < 120 {
			return 600
		}
		return 300
	}
	h := LearnLoadHistory(historyOf(day, rate, 3), 66, 600, 0)
	if h.MaxRise > 1.1 {
		t.Fatalf("a swing back to the recent peak read as a %.2f× rise", h.MaxRise)
	}
}

func TestLearnLoadHistory_UnknownWithoutData(t *testing.T) {
	for name, s := range map[string]HistorySeries{
		"empty":        {ShortSeconds: 15},
		"one sample":   {Planned: []RateSample{{60, 10}}, Short: []RateSample{{15, 10}}, ShortSeconds: 15},
		"no window":    historyOf(3600, func(float64) float64 { return 10 }, 4).withShort(0),
		"only NaN":     {Planned: []RateSample{{60, math.NaN()}, {90, math.NaN()}}, Short: []RateSample{{15, math.Inf(1)}, {30, -1}}, ShortSeconds: 15},
		"out of order": {Planned: []RateSample{{90, 10}, {60, 10}}, Short: []RateSample{{30, 10}, {15, 10}}, ShortSeconds: 15},
	} {
		if h := LearnLoadHistory(s, 66, 600, 0); h.Known() {
			t.Errorf("%s: learned %+v, want unknown", name, h)
		}
	}
	if f, why := SurgeBound(DefaultSettings(AlgorithmTail).Tail, LoadHistory{}); f != 4 || !strings.Contains(why, "no load history") {
		t.Fatalf("without history: %v (%s), want the default 4", f, why)
	}
}

func (h HistorySeries) withShort(seconds float64) HistorySeries { h.ShortSeconds = seconds; return h }

func TestTail_AFlatHistoryPlansAtTheLoadItselfAndWithoutTheSurgeBound(t *testing.T) {
	flat := LoadHistory{MaxRise: 1.0, Seconds: 3 * day, Samples: 20000}
	s := DefaultSettings(AlgorithmTail)
	in := Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500, LoadHistory: flat}
	if got := planningLoad(in, 1500, s); got != 1500 {
		t.Fatalf("planning load %v with a flat history, want the load itself", got)
	}
	in.SurgeFactor, _ = SurgeBound(s.Tail, flat)
	bounded, err := Compute(Input{Endpoints: seedFleet(100), WindowSeconds: 60, RecentPeakRequestRate: 1500}, s)
	if err != nil {
		t.Fatal(err)
	}
	learned, err := Compute(in, s)
	if err != nil {
		t.Fatal(err)
	}
	if b, l := 3*shareOf(bounded, "fast-0"), 3*shareOf(learned, "fast-0"); l < b+0.2 {
		t.Fatalf("fast pods get %.2f of the weight with the default bound and %.2f with a flat history, want the model's split to lean on them far more", b, l)
	}
}

func TestLearnLoadHistory_AHistoryShorterThanItNeedsIsUnknownAndSaysSo(t *testing.T) {
	// Six hours of a flat load: its daily peak has not come yet.
	h := LearnLoadHistory(historyOf(6*3600, func(float64) float64 { return 100 }, 5), 66, 600, MinHistorySeconds(3*day))
	if h.Known() {
		t.Fatalf("six hours of history learned as %+v, want unknown: a day is needed", h)
	}
	f, why := SurgeBound(DefaultSettings(AlgorithmTail).Tail, h)
	if f != 4 || !strings.Contains(why, "6 hours of load history, less than the") {
		t.Fatalf("six hours of history: bound %v (%s), want the default 4 and why", f, why)
	}
	// The same load over a day and a half is known, and flat.
	if h := LearnLoadHistory(historyOf(1.5*day, func(float64) float64 { return 100 }, 5), 66, 600, MinHistorySeconds(3*day)); !h.Known() || h.MaxRise > 1.1 {
		t.Fatalf("a day and a half of a flat load learned as %+v, want known and flat", h)
	}
}

func TestLearnLoadHistory_SeriesThatNeverOverlapMeasureNothing(t *testing.T) {
	// Planned rates for the first day, short rates only for the second: no short rate has a
	// recent peak before it, so no rise was measured, which is not a flat history.
	both := historyOf(2*day, func(float64) float64 { return 100 }, 6)
	var s HistorySeries
	s.ShortSeconds = both.ShortSeconds
	for _, r := range both.Planned {
		if r.EndSeconds < day {
			s.Planned = append(s.Planned, r)
		}
	}
	for _, r := range both.Short {
		if r.EndSeconds > day+3600 {
			s.Short = append(s.Short, r)
		}
	}
	if h := LearnLoadHistory(s, 66, 600, 0); h.Known() {
		t.Fatalf("series that never overlap learned as %+v, want unknown", h)
	}
}

func TestLearnLoadHistory_AnHourThenAndAnHourNowIsNotADay(t *testing.T) {
	// Two hours of a flat load, three days apart: the span is three days, what was seen is two
	// hours. Learning "flat" from it would lift every bound.
	all := historyOf(3*day, func(float64) float64 { return 100 }, 7)
	var s HistorySeries
	s.ShortSeconds = all.ShortSeconds
	keep := func(t float64) bool { return t < 3600 || t > 3*day-3600 }
	for _, r := range all.Planned {
		if keep(r.EndSeconds) {
			s.Planned = append(s.Planned, r)
		}
	}
	for _, r := range all.Short {
		if keep(r.EndSeconds) {
			s.Short = append(s.Short, r)
		}
	}
	h := LearnLoadHistory(s, 66, 600, MinHistorySeconds(3*day))
	if h.Known() || h.TooShortFor == 0 {
		t.Fatalf("two hours three days apart learned as %+v, want unknown: too little of it was seen", h)
	}
	if h := LearnLoadHistory(all, 66, 600, MinHistorySeconds(3*day)); !h.Known() {
		t.Fatalf("the whole three days learned as %+v, want known", h)
	}
}
