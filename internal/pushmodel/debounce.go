// Package pushmodel estimates what a stream of config writes costs istiod.
//
// istiod does not push once per config event: it debounces. The first event starts a debounce
// period; every later event restarts the quiet timer. A push happens at the first timer check where
// either the stream has been quiet for DebounceAfter (PILOT_DEBOUNCE_AFTER, 100 ms by default) or
// the period has lasted DebounceMax (PILOT_DEBOUNCE_MAX, 10 s by default). Writes bunched inside one
// quiet window therefore cost one push, while a trickle of writes spaced just under DebounceAfter
// apart holds every push in the mesh back for up to DebounceMax.
//
// The model treats pushes as instantaneous (istiod's own push time and PILOT_PUSH_THROTTLE are not
// modelled), so the delays it reports are lower bounds. It takes the time of every event as an
// argument and never reads a clock.
package pushmodel

import (
	"sort"
	"time"
)

// Istio's defaults for PILOT_DEBOUNCE_AFTER and PILOT_DEBOUNCE_MAX.
const (
	DefaultDebounceAfter = 100 * time.Millisecond
	DefaultDebounceMax   = 10 * time.Second
)

// Config holds istiod's debounce settings.
type Config struct {
	DebounceAfter time.Duration
	DebounceMax   time.Duration
}

// DefaultConfig returns istiod's default debounce settings.
func DefaultConfig() Config {
	return Config{DebounceAfter: DefaultDebounceAfter, DebounceMax: DefaultDebounceMax}
}

// Push is one debounced push and the events it merged.
type Push struct {
	At time.Time
	// First and Last are the first and last events merged into this push.
	First, Last time.Time
	Events      int
}

// Debouncer replays istiod's debounce rule over events fed in time order.
type Debouncer struct {
	cfg       Config
	pending   bool
	start     time.Time // first event of the open debounce period
	last      time.Time // latest event of the open period
	nextCheck time.Time // when istiod's timer next fires
	events    int
}

// NewDebouncer returns a Debouncer with cfg; zero fields take Istio's defaults.
func NewDebouncer(cfg Config) *Debouncer {
	if cfg.DebounceAfter <= 0 {
		cfg.DebounceAfter = DefaultDebounceAfter
	}
	if cfg.DebounceMax <= 0 {
		cfg.DebounceMax = DefaultDebounceMax
	}
	return &Debouncer{cfg: cfg}
}

// Observe records a config event at t and returns the pushes that fired before it.
// Events must be fed in non-decreasing time order; an earlier t is treated as arriving now.
func (d *Debouncer) Observe(t time.Time) []Push {
	pushes := d.Advance(t)
	if !d.pending {
		d.pending = true
		d.start, d.last, d.events = t, t, 1
		d.nextCheck = t.Add(d.cfg.DebounceAfter)
		return pushes
	}
	if t.After(d.last) {
		d.last = t
	}
	d.events++
	return pushes
}

// Advance runs the debounce timer up to and including now and returns the pushes that fired.
func (d *Debouncer) Advance(now time.Time) []Push {
	var pushes []Push
	for d.pending && !d.nextCheck.After(now) {
		c := d.nextCheck
		if c.Sub(d.start) >= d.cfg.DebounceMax || c.Sub(d.last) >= d.cfg.DebounceAfter {
			pushes = append(pushes, Push{At: c, First: d.start, Last: d.last, Events: d.events})
			d.pending = false
			break
		}
		d.nextCheck = d.last.Add(d.cfg.DebounceAfter)
	}
	return pushes
}

// Pending reports whether events are waiting for a push.
func (d *Debouncer) Pending() bool { return d.pending }

// Pushes replays events (in any order) and returns every push they cause, including the last one.
func Pushes(events []time.Time, cfg Config) []Push {
	if len(events) == 0 {
		return nil
	}
	sorted := append([]time.Time(nil), events...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	d := NewDebouncer(cfg)
	var pushes []Push
	for _, t := range sorted {
		pushes = append(pushes, d.Observe(t)...)
	}
	// Past the last event plus DebounceMax every open period has been pushed.
	return append(pushes, d.Advance(sorted[len(sorted)-1].Add(d.cfg.DebounceMax+d.cfg.DebounceAfter))...)
}

// ExtraDelay is how much later a config change made at change reaches the push queue because of
// the other writes, compared with the same change made alone (which waits DebounceAfter).
func ExtraDelay(writes []time.Time, change time.Time, cfg Config) time.Duration {
	d := NewDebouncer(cfg)
	all := append(append([]time.Time(nil), writes...), change)
	for _, p := range Pushes(all, d.cfg) {
		if !p.First.After(change) && !p.Last.Before(change) {
			return p.At.Sub(change) - d.cfg.DebounceAfter
		}
	}
	return 0
}
