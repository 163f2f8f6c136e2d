package sim

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestGenerateScenario_SameSeedAndIndexSameScenario(t *testing.T) {
	a, err := GenerateScenario(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateScenario(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	ya, _ := MarshalScenario(a.Scenario)
	yb, _ := MarshalScenario(b.Scenario)
	if !bytes.Equal(ya, yb) || a.Summary != b.Summary {
		t.Fatalf("two draws of (7, 3) differ:\n%s\n%s", ya, yb)
	}
	c, err := GenerateScenarioWith(7, 3, GenerateOptions{SpeedChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := GenerateScenarioWith(7, 3, GenerateOptions{SpeedChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, d) || !bytes.Equal(mustMarshal(t, c.Scenario), mustMarshal(t, d.Scenario)) {
		t.Fatalf("two draws of (7, 3) with speed changes differ:\n%s\n%s", c.Summary, d.Summary)
	}
	for _, other := range [][2]int64{{7, 4}, {8, 3}} {
		c, err := GenerateScenario(other[0], int(other[1]))
		if err != nil {
			t.Fatal(err)
		}
		if yc, _ := MarshalScenario(c.Scenario); bytes.Equal(ya, yc) {
			t.Fatalf("(7, 3) and %v drew the same scenario", other)
		}
	}
}

func mustMarshal(t *testing.T, sc *Scenario) []byte {
	t.Helper()
	data, err := MarshalScenario(sc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// smallestCapacity is the fleet's smallest capacity (requests per second at the CPU limit) over
// the run, from the scenario alone.
func smallestCapacity(sc *Scenario) float64 {
	capacity := func(replicas []int) float64 {
		total := 0.0
		for i, p := range sc.Pods {
			total += float64(replicas[i]) * p.CPULimit * p.Speed / p.Cost.Mean.Seconds()
		}
		return total
	}
	replicas := make([]int, len(sc.Pods))
	for i, p := range sc.Pods {
		replicas[i] = p.Replicas
	}
	smallest := capacity(replicas)
	for i, p := range sc.Pods {
		for _, ev := range p.Events {
			if ev.Replicas != nil {
				replicas[i] = *ev.Replicas
				smallest = math.Min(smallest, capacity(replicas))
			}
		}
	}
	return smallest
}

func TestGenerateScenario_EveryDrawIsInItsRangeAndEveryKindOccurs(t *testing.T) {
	shapes := map[string]int{}
	scaleOut, scaleIn := 0, 0
	for i := range 300 {
		d, err := GenerateScenario(1, i)
		if err != nil {
			t.Fatal(err)
		}
		sc := d.Scenario
		for _, shape := range LoadShapes {
			if strings.HasPrefix(d.Summary, shape) || strings.HasPrefix(d.Summary, strings.ReplaceAll(shape, "-", " ")) {
				shapes[shape]++
			}
		}
		if n := len(sc.Pods); n < 2 || n > 4 {
			t.Fatalf("%s: %d hardware classes, want 2 to 4", sc.Name, n)
		}
		fastest, slowest := 0.0, math.Inf(1)
		for _, p := range sc.Pods {
			fastest, slowest = math.Max(fastest, p.Speed), math.Min(slowest, p.Speed)
			if p.Cores <= p.CPULimit {
				t.Fatalf("%s: class %s runs on %g cores with a limit of %g; want nodes larger than the limit", sc.Name, p.Name, p.Cores, p.CPULimit)
			}
			if !reflect.DeepEqual(p.Cost, sc.Pods[0].Cost) {
				t.Fatalf("%s: class %s costs %+v, class %s %+v; want one cost for the fleet", sc.Name, p.Name, p.Cost, sc.Pods[0].Name, sc.Pods[0].Cost)
			}
			for _, ev := range p.Events {
				if ev.Replicas != nil && *ev.Replicas > p.Replicas {
					scaleOut++
				} else if ev.Replicas != nil {
					scaleIn++
				}
			}
		}
		if r := fastest / slowest; fastest != 1 || r < 1.4 || r > 3 {
			t.Fatalf("%s: speeds from %g to %g (ratio %.2f), want the fastest at 1 and a ratio from √2 to 3", sc.Name, slowest, fastest, r)
		}
		if p := sc.Clients.Proxies; p < 2 || p > 50 {
			t.Fatalf("%s: %d client proxies, want 2 to 50", sc.Name, p)
		}
		peak := sc.Load.RPS
		for _, ph := range sc.Load.Phases {
			peak = math.Max(peak, ph.RPS)
		}
		if share := peak / smallestCapacity(sc); share < 0.3-0.01 || share > 0.95+0.01 {
			t.Fatalf("%s: peak load %.0f rps is %.2f of the fleet's smallest capacity, want 0.30 to 0.95", sc.Name, peak, share)
		}
		// A run must stay short: at most about three million requests.
		if n := peak * sc.Duration.Seconds(); n > 3e6 {
			t.Fatalf("%s: up to %.1f M requests (%.0f rps for %v), want at most 3 M", sc.Name, n/1e6, peak, sc.Duration.Duration)
		}
	}
	for _, shape := range LoadShapes {
		if shapes[shape] < 30 {
			t.Errorf("load shape %s drawn %d times in 300, want about 60", shape, shapes[shape])
		}
	}
	if scaleOut < 30 || scaleIn < 20 {
		t.Errorf("%d scale-outs and %d scale-ins in 300 draws, want both to occur often", scaleOut, scaleIn)
	}
}

func TestGenerateScenario_WrittenFileReadsBackAsTheSameScenario(t *testing.T) {
	for i := range 20 {
		d, err := GenerateScenario(3, i)
		if err != nil {
			t.Fatal(err)
		}
		data, err := MarshalScenario(d.Scenario)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseScenario(data, "kept.yaml")
		if err != nil {
			t.Fatalf("the file written for %s does not load: %v\n%s", d.Scenario.Name, err, data)
		}
		if !reflect.DeepEqual(back, d.Scenario) {
			t.Fatalf("%s reads back as\n%+v\nwant\n%+v", d.Scenario.Name, back, d.Scenario)
		}
	}
}
