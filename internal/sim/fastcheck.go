package sim

import (
	"math"
	"sort"

	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// This file is the controller's check between two cycles, as the operator runs it: every
// fast_check_interval it reads each pod's newest signals over fast_check_window through the
// modelled TSDB, and weights.Relieve cuts the weight of a pod whose latency or CPU has jumped
// since the last cycle. The write reaches the clients after the apply delay, like a cycle's.

// restoreAfterRelief is how long after a relief the cycle raises the relieved pod's weight only
// slowly (weights.Endpoint.Relieved): five minutes, the Horizontal Pod Autoscaler's default
// stabilization window for scaling down, the slow direction there.
const restoreAfterRelief = 300

// fastChecks reports whether this run checks between cycles: adaptive-lb's own algorithms do,
// when the scenario turns the check on.
func (s *simulation) fastChecks() bool {
	if s.settings == nil || s.sc.Controller.FastCheckInterval.Duration <= 0 {
		return false
	}
	a := s.settings.Algorithm
	return a == weights.AlgorithmCapacity || a == weights.AlgorithmTail
}

// scheduleFastChecks queues a check every fast_check_interval. It is scheduled before the cycles:
// at a cycle's tick the check runs first, as the operator's does, so that a jump is relieved on
// the short window and the cycle, seeing the write, waits for a window that shows it.
func (s *simulation) scheduleFastChecks() {
	if !s.fastChecks() {
		return
	}
	every := s.sc.Controller.FastCheckInterval.Seconds()
	for t := every; t <= s.end; t += every {
		s.q.push(t, evFastCheck, 0, 0)
	}
}

// onFastCheck runs one check: the pods' short-window signals against what the last cycle saw.
func (s *simulation) onFastCheck(t float64) error {
	if len(s.weightOf) == 0 || len(s.lastObserved) == 0 {
		return nil // nothing weighted yet, or no cycle to compare with
	}
	// A pod whose weight a relief or the cycle's overload cut lowered after the middle of the
	// check's window: the window mostly shows the jump that write answered.
	_, visibleTo := s.evalAt(t)
	answeredAfter := visibleTo - s.sc.Controller.FastCheckWindow.Seconds()/2
	answered := map[string]bool{}
	for id, at := range s.lastCutAt {
		if at > answeredAfter {
			answered[s.pods[id].name] = true
		}
	}
	eps := make([]weights.Endpoint, 0, len(s.hosts))
	ids := make([]int32, 0, len(s.hosts))
	baseline := make(map[string]weights.Endpoint, len(s.lastObserved))
	for _, h := range s.hosts {
		p := s.pods[h]
		o := s.observeShort(p, t)
		eps = append(eps, weights.Endpoint{
			ID:                p.name,
			CPUCores:          o.cpu,
			CPULimitCores:     p.limit,
			RequestRate:       o.rps,
			LatencyP99Seconds: o.p99,
			HasMetrics:        o.hasMetrics,
			CurrentWeight:     s.writtenWeight(h),
			NodeCPUCores:      p.cores,
			Relieved:          s.relieved(h, t),
		})
		ids = append(ids, h)
		if base, ok := s.lastObserved[h]; ok {
			baseline[p.name] = base
		}
	}
	window := s.sc.Controller.FastCheckWindow.Seconds()
	settled := s.lastApply <= visibleTo-window-s.sc.Controller.Metrics.ScrapeInterval.Seconds()
	d, err := weights.Relieve(weights.ReliefInput{Endpoints: eps, Baseline: baseline, Answered: answered, WindowSeconds: window, WeightsSettled: settled}, *s.settings)
	if err != nil || !d.Changed {
		return err
	}
	next := make(map[int32]int, len(ids))
	var cut []int32
	for i, r := range d.Endpoints {
		next[ids[i]] = r.Weight
		if r.Weight < eps[i].CurrentWeight {
			s.relievedAt[ids[i]] = t
			cut = append(cut, ids[i])
		}
	}
	s.reliefs++
	s.planReplaced = true
	s.scheduleApply(t, next, s.dataMidpoint(t, window))
	s.pendingAnswers[s.applySeq] = cut
	s.pendingRelief[s.applySeq] = d.Reason
	return nil
}

// relieved reports whether pod id's weight was cut by a check within restoreAfterRelief of t.
func (s *simulation) relieved(id int32, t float64) bool {
	at, ok := s.relievedAt[id]
	return ok && t-at < restoreAfterRelief
}

// overloadAnswered reports whether a relief's cut of pod id reached the clients after the start of
// the cycle's window at t: the window still shows the overload the relief answered.
func (s *simulation) overloadAnswered(id int32, t float64) bool {
	at, ok := s.lastCutAt[id]
	_, visibleTo := s.evalAt(t)
	return ok && at > visibleTo-s.sc.Controller.Window.Seconds()
}

// weightCut is one write that lowered a pod's weight, decided at t on data whose window's middle
// is basis.
type weightCut struct {
	t, basis float64
	id       int32
}

// noteCuts records the pods whose weight a write decided at t on data centred on basis lowers.
func (s *simulation) noteCuts(t, basis float64, next map[int32]int) {
	for id, w := range next {
		if cur := s.writtenWeight(id); cur > 0 && w < cur {
			s.cuts = append(s.cuts, weightCut{t: t, basis: basis, id: id})
		}
	}
}

// dataMidpoint is the middle of the window a query sent at t over window reads: the newest data
// is the older of its evaluation time and the newest scrape the TSDB holds.
func (s *simulation) dataMidpoint(t, window float64) float64 {
	evalAt, visibleTo := s.evalAt(t)
	return math.Min(evalAt, visibleTo) - window/2
}

// reactions measures, for each event that slows a pod group down, how long the controller took
// to write a lower weight for one of the group's pods, decided on data mostly after the event
// (the middle of its window later than the event): a cut the plan made anyway, on a window that
// mostly predates the slowdown, is not a reaction to it.
func (s *simulation) reactions() []Reaction {
	if s.settings == nil {
		return nil
	}
	var out []Reaction
	for g, pg := range s.sc.Pods {
		speed := pg.Speed
		for _, ev := range pg.Events {
			if ev.Speed == nil {
				continue
			}
			slower := *ev.Speed < speed
			speed = *ev.Speed
			if !slower {
				continue
			}
			at := ev.At.Seconds()
			r := Reaction{Group: pg.Name, AtS: at, CutAfterS: -1}
			for _, c := range s.cuts {
				if c.t >= at && c.basis >= at && s.pods[c.id].group == g {
					r.CutAfterS = c.t - at
					break
				}
			}
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].AtS < out[j].AtS })
	return out
}
