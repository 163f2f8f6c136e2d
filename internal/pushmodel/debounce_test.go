package pushmodel

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms ...int) []time.Time {
	out := make([]time.Time, len(ms))
	for i, m := range ms {
		out[i] = t0.Add(time.Duration(m) * time.Millisecond)
	}
	return out
}

func TestPushes_DebounceRule(t *testing.T) {
	cases := map[string]struct {
		events     []time.Time
		wantPushes []int // push times, ms after t0
		wantEvents []int
	}{
		"a single write is pushed after the quiet period": {
			events: at(0), wantPushes: []int{100}, wantEvents: []int{1},
		},
		"a burst inside one quiet window costs one push": {
			events: at(0, 10, 50, 99), wantPushes: []int{199}, wantEvents: []int{4},
		},
		"writes further apart than the quiet period each cost a push": {
			events: at(0, 150, 300), wantPushes: []int{100, 250, 400}, wantEvents: []int{1, 1, 1},
		},
		"a trickle just under the quiet period holds the push until DebounceMax": {
			// One write every 90 ms for 20 s never lets the timer go quiet.
			events: trickle(90, 20_000),
			// Checks fall at 100, 190, 280, …; the first at or past 10 s (10 000 ms) pushes the 112
			// events so far, and the next period ends on the quiet after the last write at 19 980 ms.
			wantPushes: []int{10_000, 20_080},
			wantEvents: []int{112, 111},
		},
		"order of input does not matter": {
			events: at(99, 0, 50), wantPushes: []int{199}, wantEvents: []int{3},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pushes := Pushes(tc.events, DefaultConfig())
			if len(pushes) != len(tc.wantPushes) {
				t.Fatalf("got %d pushes %+v, want %d", len(pushes), pushes, len(tc.wantPushes))
			}
			for i, p := range pushes {
				if got := int(p.At.Sub(t0) / time.Millisecond); got != tc.wantPushes[i] {
					t.Errorf("push %d at %d ms, want %d ms", i, got, tc.wantPushes[i])
				}
				if p.Events != tc.wantEvents[i] {
					t.Errorf("push %d merged %d events, want %d", i, p.Events, tc.wantEvents[i])
				}
			}
		})
	}
}

func trickle(everyMs, untilMs int) []time.Time {
	var ms []int
	for m := 0; m < untilMs; m += everyMs {
		ms = append(ms, m)
	}
	return at(ms...)
}

func TestExtraDelay(t *testing.T) {
	cases := map[string]struct {
		writes []time.Time
		change time.Time
		want   time.Duration
	}{
		"no other writes: no extra delay": {
			writes: nil, change: t0, want: 0,
		},
		"a burst that ended before the change adds nothing": {
			writes: at(0, 20, 40), change: t0.Add(500 * time.Millisecond), want: 0,
		},
		"a change landing inside a burst waits for the burst's quiet period": {
			writes: at(0, 20, 40, 60, 80), change: t0.Add(10 * time.Millisecond), want: 70 * time.Millisecond,
		},
		"a trickle of weight writes delays an endpoint removal by seconds": {
			writes: trickle(90, 20_000), change: t0.Add(1 * time.Second),
			want: 10*time.Second - 1*time.Second - 100*time.Millisecond,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ExtraDelay(tc.writes, tc.change, DefaultConfig()); got != tc.want {
				t.Fatalf("extra delay %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDebouncer_OnlineMatchesBatch(t *testing.T) {
	events := append(at(0, 30, 60), at(500, 520, 1000)...)
	d := NewDebouncer(DefaultConfig())
	var online []Push
	for _, e := range events {
		online = append(online, d.Observe(e)...)
	}
	online = append(online, d.Advance(t0.Add(time.Minute))...)
	batch := Pushes(events, DefaultConfig())
	if len(online) != len(batch) {
		t.Fatalf("online %d pushes, batch %d", len(online), len(batch))
	}
	for i := range online {
		if !online[i].At.Equal(batch[i].At) || online[i].Events != batch[i].Events {
			t.Fatalf("push %d differs: online %+v batch %+v", i, online[i], batch[i])
		}
	}
	if d.Pending() {
		t.Fatal("debouncer still pending after a minute of quiet")
	}
}
