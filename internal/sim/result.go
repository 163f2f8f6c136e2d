package sim

import (
	"math"
	"slices"
	"sort"
)

// Result is one policy's outcome. JSON field names are a public format: add, never rename.
type Result struct {
	Policy       string      `json:"policy"`
	Latency      Percentiles `json:"latency_ms"`
	TotalCPU     float64     `json:"total_cpu"`
	Requests     int64       `json:"requests"`
	WeightWrites int         `json:"weight_writes"`
	// ModelOverrules counts the cycles whose measurements overruled the tail algorithm's model.
	ModelOverrules int         `json:"model_overrules,omitempty"`
	Pods           []PodResult `json:"pods"`
	// Timeline holds the latency of each 10 s of the run, warm-up included.
	Timeline []TimelinePoint `json:"timeline"`
	// Weights holds every weight write as it reached the clients.
	Weights []WeightPoint `json:"weights,omitempty"`
	// ThrottledSeconds sums, over pods, the time spent stalled by the CPU limit with work waiting.
	ThrottledSeconds float64 `json:"throttled_seconds"`
	// MeanInSystem is the time-average number of requests inside pods (for Little's law).
	MeanInSystem float64 `json:"mean_in_system"`
	// SteadyAfterS is the first time from which the 10 s p99 stays within a factor 1.5 of the
	// second half's median p99: how long the policy took to settle.
	SteadyAfterS float64 `json:"steady_after_s"`
	// Recoveries holds, for each speed change of the scenario, how long the p99 took to return
	// to its level before the change.
	Recoveries []Recovery `json:"recoveries,omitempty"`
	// Reliefs counts the writes made by checks between cycles (weights.Relieve).
	Reliefs int `json:"reliefs,omitempty"`
	// Reactions holds, for each event that slows a pod group down, when the controller first
	// wrote a lower weight for one of its pods.
	Reactions []Reaction `json:"reactions,omitempty"`
	// Surge is the tail algorithm's surge bound in force and why, as learned from the scenario's
	// load history (weights.SurgeBound); empty for the other policies.
	Surge *SurgeBound `json:"surge,omitempty"`
}

// Reaction is the controller's first answer to a slowdown.
type Reaction struct {
	Group string  `json:"group"`
	AtS   float64 `json:"at_s"`
	// CutAfterS is the time from the slowdown to the first weight write that lowered the weight
	// of a pod of the group (the write, not its arrival at the clients); -1 if none did before
	// the end of the run.
	CutAfterS float64 `json:"cut_after_s"`
}

// SurgeBound is the surge bound a run planned with.
type SurgeBound struct {
	Factor float64 `json:"factor"`
	Reason string  `json:"reason"`
	// MaxRise is the load history's largest rise (weights.LoadHistory.MaxRise); 0 when unknown.
	MaxRise float64 `json:"max_rise"`
}

// Recovery measures the reaction to one speed change at AtS. The p99 of the responses received
// in the minute before the change is the level to return to; the time after the change is cut
// into controller intervals, and the p99 has recovered from the first interval whose p99, and
// that of every later interval up to the next change (or the end), stays within recoveryBand of
// that level.
type Recovery struct {
	AtS       float64 `json:"at_s"`
	BeforeP99 float64 `json:"before_p99_ms"`
	// IntervalP99 is the p99 of each controller interval after the change.
	IntervalP99 []float64 `json:"interval_p99_ms"`
	// Intervals is how many whole intervals passed before the recovered stretch began; -1 if
	// the p99 never recovered before the next change.
	Intervals int `json:"intervals"`
	// SettledP99 is the median p99 of the second half of the intervals after the change: the
	// level the policy settles at. When the change took capacity away, the level before it may
	// be out of reach for any policy; IntervalsToSettle measures the reaction against this one.
	SettledP99        float64 `json:"settled_p99_ms"`
	IntervalsToSettle int     `json:"intervals_to_settle"`
}

// recoveryBand is how far above its earlier level an interval's p99 may be and count as recovered.
const recoveryBand = 1.1

// recoveryLookback is the stretch before a change whose p99 sets the level to return to.
const recoveryLookback = 60

// recoveries measures every speed event of the scenario from the warm responses.
func (s *simulation) recoveries() []Recovery {
	changes := speedChanges(s.sc)
	interval := s.sc.Controller.Interval.Seconds()
	if interval <= 0 {
		return nil
	}
	window := func(from, to float64) []float32 {
		var xs []float32
		for i, at := range s.latencyAt {
			if float64(at) >= from && float64(at) < to {
				xs = append(xs, s.latencies[i])
			}
		}
		return xs
	}
	var out []Recovery
	for i, at := range changes {
		if at-recoveryLookback < s.warmup {
			continue // no warm level to return to
		}
		next := s.end
		if i+1 < len(changes) {
			next = changes[i+1]
		}
		rec := Recovery{AtS: at, BeforeP99: percentiles(window(at-recoveryLookback, at)).P99, Intervals: -1}
		for from := at; from+interval <= next+1e-9; from += interval {
			rec.IntervalP99 = append(rec.IntervalP99, percentiles(window(from, from+interval)).P99)
		}
		rec.Intervals = firstStretchWithin(rec.IntervalP99, rec.BeforeP99*recoveryBand)
		if n := len(rec.IntervalP99); n > 0 {
			rec.SettledP99 = medianOf(rec.IntervalP99[n/2:])
			rec.IntervalsToSettle = firstStretchWithin(rec.IntervalP99, rec.SettledP99*recoveryBand)
		}
		out = append(out, rec)
	}
	return out
}

// speedChanges returns when the scenario changes a pod group's speed, in order.
func speedChanges(sc *Scenario) []float64 {
	var changes []float64
	for _, pg := range sc.Pods {
		for _, ev := range pg.Events {
			if ev.Speed != nil {
				changes = append(changes, ev.At.Seconds())
			}
		}
	}
	sort.Float64s(changes)
	return changes
}

// Percentiles are latency percentiles in milliseconds.
type Percentiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Mean float64 `json:"mean"`
}

// PodResult summarises one pod over the measured period.
type PodResult struct {
	Name        string         `json:"name"`
	RPS         float64        `json:"rps"`
	CPU         float64        `json:"cpu"`
	Latency     PodPercentiles `json:"latency_ms"`
	FinalWeight int            `json:"final_weight"`
}

// PodPercentiles are a pod's own latency percentiles in milliseconds.
type PodPercentiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// TimelinePoint is the latency of the responses received in the 10 s ending at TimeS.
type TimelinePoint struct {
	TimeS float64 `json:"t_s"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	RPS   float64 `json:"rps"`
}

// WeightPoint is the weight of every pod at a moment.
type WeightPoint struct {
	TimeS   float64        `json:"t_s"`
	Weights map[string]int `json:"weights"`
	// ModelOverruled says why the write moved toward the capacity split when the tail
	// algorithm's measurements overruled its model (weights.Decision.ModelOverruled).
	ModelOverruled string `json:"model_overruled,omitempty"`
	// Relief says which pods a check between cycles relieved, and on what evidence
	// (weights.Relieve's reason); empty for a cycle's write.
	Relief string `json:"relief,omitempty"`
}

// timelineBucket is the width of one timeline point.
const timelineBucket = 10

func (s *simulation) result() *Result {
	r := &Result{Policy: s.policy, WeightWrites: s.weightWrites, ModelOverrules: s.modelOverrules, Weights: s.weightLog, Reliefs: s.reliefs, Reactions: s.reactions(), Surge: s.surge}
	latency := mergeSketches(s.podLat, s.latencySum)
	r.Requests = int64(latency.n)
	r.Latency = latency.percentiles()
	measured := s.end - s.warmup
	for i, p := range s.pods {
		var cpu0, from float64
		var served0 uint64
		if i < len(s.warmAt) {
			cpu0, served0, from = s.warmCPU[i], s.warmServed[i], s.warmAt[i]
		} else {
			from = p.born
		}
		span := s.end - from
		r.TotalCPU += (p.cpu - cpu0) / measured
		r.ThrottledSeconds += p.throttledFor
		r.MeanInSystem += p.area / s.end
		if span <= 0 {
			continue
		}
		pl := s.podLat[i].percentiles()
		w := s.weightOf[p.id]
		if !p.inHostSet {
			w = 0
		} else if w == 0 {
			w = 1
		}
		r.Pods = append(r.Pods, PodResult{
			Name:        p.name,
			RPS:         float64(p.served-served0) / span,
			CPU:         (p.cpu - cpu0) / span,
			Latency:     PodPercentiles{P50: pl.P50, P99: pl.P99},
			FinalWeight: w,
		})
	}
	r.Timeline = s.timeline
	r.SteadyAfterS = steadyAfter(r.Timeline)
	r.Recoveries = s.recoveries()
	return r
}

// percentiles sorts a copy of xs; the nearest-rank method matches what load generators report.
// The run's own percentiles come from latencySketch; this serves short lists.
func percentiles(xs []float32) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	c := append([]float32(nil), xs...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	var sum float64
	for _, v := range c {
		sum += float64(v)
	}
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(c)))) - 1
		if i < 0 {
			i = 0
		}
		return float64(c[i])
	}
	return Percentiles{P50: at(0.5), P90: at(0.9), P95: at(0.95), P99: at(0.99), P999: at(0.999), Mean: sum / float64(len(c))}
}

// steadyBand is how far a 10 s p99 may stray from the steady level and still count as steady.
const steadyBand = 1.5

// steadyAfter returns the start of the final stretch of the timeline in which every point's p99
// (as a moving median of three) lies within steadyBand of the median p99 of the second half.
func steadyAfter(tl []TimelinePoint) float64 {
	if len(tl) < 2 {
		return 0
	}
	var second []float32
	for _, p := range tl[len(tl)/2:] {
		second = append(second, float32(p.P99))
	}
	level := percentiles(second).P50
	// Single 10 s p99s are noisy; judge the moving median of three.
	smooth := func(i int) float64 {
		lo, hi := max(0, i-1), min(len(tl)-1, i+1)
		var w []float32
		for j := lo; j <= hi; j++ {
			w = append(w, float32(tl[j].P99))
		}
		return percentiles(w).P50
	}
	at := tl[len(tl)-1].TimeS
	for i := len(tl) - 1; i >= 0; i-- {
		p := smooth(i)
		if p > level*steadyBand || p < level/steadyBand {
			break
		}
		// The bucket ending at TimeS started timelineBucket earlier.
		at = tl[i].TimeS - timelineBucket
	}
	return at
}

// firstStretchWithin returns the first index from which every value stays at or below limit,
// or -1.
func firstStretchWithin(values []float64, limit float64) int {
	for k := range values {
		if !slices.ContainsFunc(values[k:], func(v float64) bool { return v > limit }) {
			return k
		}
	}
	return -1
}

func medianOf(xs []float64) float64 {
	c := slices.Clone(xs)
	slices.Sort(c)
	if len(c) == 0 {
		return 0
	}
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}
