package sim

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// withoutSpeedEvents is sc without its speed events.
func withoutSpeedEvents(sc *Scenario) *Scenario {
	c := *sc
	c.Pods = slices.Clone(sc.Pods)
	for i := range c.Pods {
		c.Pods[i].Events = slices.DeleteFunc(slices.Clone(c.Pods[i].Events), func(ev PodEvent) bool { return ev.Speed != nil })
		if len(c.Pods[i].Events) == 0 {
			c.Pods[i].Events = nil
		}
	}
	return &c
}

func TestGenerateScenarioWith_SpeedChangesOnlyAddASlowdownToAShareOfTheScenarios(t *testing.T) {
	slowed := 0
	const n = 200
	for i := range n {
		plain, err := GenerateScenario(2, i)
		if err != nil {
			t.Fatal(err)
		}
		d, err := GenerateScenarioWith(2, i, GenerateOptions{SpeedChanges: true})
		if err != nil {
			t.Fatal(err)
		}
		if plain.SlowedClass != "" || !reflect.DeepEqual(withoutSpeedEvents(plain.Scenario), plain.Scenario) {
			t.Fatalf("%s: speed changes drawn without GenerateOptions.SpeedChanges", plain.Scenario.Name)
		}
		// The slowdown has a stream of its own: the rest of the scenario is the one drawn without.
		if !reflect.DeepEqual(withoutSpeedEvents(d.Scenario), plain.Scenario) || !strings.HasPrefix(d.Summary, plain.Summary) || d.CostFamily != plain.CostFamily {
			t.Fatalf("%s: with speed changes the rest of the scenario changed too:\n%s\nwithout:\n%s", d.Scenario.Name, d.Summary, plain.Summary)
		}
		if d.SlowedClass == "" {
			if d.Summary != plain.Summary {
				t.Fatalf("%s: no class slows down but the summary changed: %s", d.Scenario.Name, d.Summary)
			}
			continue
		}
		slowed++
		checkSlowdown(t, d)
	}
	if slowed < n*15/100 || slowed > n*45/100 {
		t.Errorf("%d of %d scenarios have a slowdown, want about 30%%", slowed, n)
	}
}

// checkSlowdown checks the speed steps of d's slowed class against the ranges of the draws.
func checkSlowdown(t *testing.T, d Drawn) {
	t.Helper()
	sc := d.Scenario
	var pg PodGroup
	for _, p := range sc.Pods {
		if p.Name == d.SlowedClass {
			pg = p
		}
		for _, ev := range p.Events {
			if ev.Speed != nil && p.Name != d.SlowedClass {
				t.Fatalf("%s: class %s changes speed, but the slowed class is %s", sc.Name, p.Name, d.SlowedClass)
			}
		}
	}
	if n := len(pg.Events); n < minSpeedSteps || n > maxSpeedSteps {
		t.Fatalf("%s: class %s has %d events, want %d to %d speed steps and no scaling", sc.Name, pg.Name, n, minSpeedSteps, maxSpeedSteps)
	}
	speed, at := pg.Speed, time.Duration(0)
	for k, ev := range pg.Events {
		if ev.Speed == nil {
			t.Fatalf("%s: the slowed class %s also scales (%+v)", sc.Name, pg.Name, ev)
		}
		gap := ev.At.Duration - at
		if k == 0 {
			gap = ev.At.Duration - sc.Warmup.Duration
		}
		if lo, hi := time.Duration(minStepGap)*time.Second, time.Duration(maxStepGap)*time.Second; k == 0 {
			lo, hi = time.Duration(minFirstStep)*time.Second, time.Duration(maxFirstStep)*time.Second
			if gap < lo || gap > hi {
				t.Fatalf("%s: first step %v after the warm-up, want %v to %v", sc.Name, gap, lo, hi)
			}
		} else if gap < lo || gap > hi {
			t.Fatalf("%s: step %d comes %v after the one before, want %v to %v", sc.Name, k+1, gap, lo, hi)
		}
		if ev.At.Duration > sc.Duration.Duration-stepMargin {
			t.Fatalf("%s: a step at %v in a run of %v, want none in the last %v", sc.Name, ev.At.Duration, sc.Duration.Duration, stepMargin)
		}
		// Speeds are rounded up to a thousandth.
		if drop := 1 - *ev.Speed/speed; drop < minSpeedDrop-0.001/speed || drop > maxSpeedDrop {
			t.Fatalf("%s: step %d from %v to %v lowers the speed by %.1f%%, want %.0f%% to %.0f%%", sc.Name, k+1, speed, *ev.Speed, 100*drop, 100*minSpeedDrop, 100*maxSpeedDrop)
		}
		speed, at = *ev.Speed, ev.At.Duration
	}
	// At its slowest the fleet still serves the peak.
	slowest := *sc
	slowest.Pods = slices.Clone(sc.Pods)
	for i := range slowest.Pods {
		if slowest.Pods[i].Name == pg.Name {
			slowest.Pods[i].Speed = speed
		}
	}
	peak := sc.Load.RPS
	for _, ph := range sc.Load.Phases {
		peak = math.Max(peak, ph.RPS)
	}
	if share := peak / smallestCapacity(&slowest); share > maxLoad+1e-9 {
		t.Fatalf("%s: at its slowest the fleet serves its peak at %.3f of its capacity, want at most %v", sc.Name, share, maxLoad)
	}
}
