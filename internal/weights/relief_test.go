package weights

import (
	"fmt"
	"strings"
	"testing"
)

// reliefFleet is eight pods of one kind at 100 rps each, 8 ms of CPU per request (80% of a 1-core
// limit would be 125 rps), all weighted 100, with a p99 of 40 ms: the last cycle's view and,
// unchanged, a quiet short window.
func reliefFleet() []Endpoint {
	var eps []Endpoint
	for i := range 8 {
		e := ep(fmt.Sprintf("pod-%d", i), 0.5, 100, 1, 100)
		e.LatencyP99Seconds = 0.04
		e.NodeCPUCores = 4
		eps = append(eps, e)
	}
	return eps
}

func baselineOf(eps []Endpoint) map[string]Endpoint {
	m := map[string]Endpoint{}
	for _, e := range eps {
		m[e.ID] = e
	}
	return m
}

func TestRelieve_ASteadyFleetIsLeftAlone(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	// Noise: some pods a little busier or slower than at the last cycle, none beyond a jump.
	now[1].CPUCores, now[2].LatencyP99Seconds, now[3].RequestRate = 0.56, 0.07, 110
	for _, alg := range []Algorithm{AlgorithmTail, AlgorithmCapacity} {
		d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(alg))
		if err != nil {
			t.Fatal(err)
		}
		if d.Changed {
			t.Fatalf("%s: a steady fleet was relieved: %s %v", alg, d.Reason, weightsOf(d))
		}
	}
}

func TestRelieve_APodWhoseLatencyJumpedIsCutAtOnce(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	// A neighbour took half of pod-3's node: every request costs twice the CPU, it runs at its
	// limit, and a queue stretches its p99 to seconds.
	now[3].CPUCores, now[3].RequestRate, now[3].LatencyP99Seconds = 1, 62, 1.5
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed {
		t.Fatalf("no relief for a pod whose p99 went from 40 ms to 1.5 s: %s", d.Reason)
	}
	if w := d.Endpoints[3].Weight; w > 50 {
		t.Fatalf("pod-3 weighted %d after the relief, want at most half its 100", w)
	}
	if r := d.Endpoints[3].Reason; r != ReasonRelievedLatency {
		t.Fatalf("pod-3's reason %q, want %q", r, ReasonRelievedLatency)
	}
	if !strings.Contains(d.Reason, "pod-3") || !strings.Contains(d.Reason, "1.5s") {
		t.Fatalf("the decision's reason %q does not name the pod and its evidence", d.Reason)
	}
	for i, r := range d.Endpoints {
		if i != 3 && r.Weight < 100 {
			t.Fatalf("%s was cut too (%d): only the jumped pod gives up traffic", r.ID, r.Weight)
		}
	}
}

func TestRelieve_APodThatGotSlowerWithoutAQueueFollowsItsCapacityDown(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	// 40% more CPU per request, no queue yet: its weight follows its capacity, the others stay.
	now[5].CPUCores = 0.7
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Endpoints[5]; !d.Changed || got.Weight != 71 || got.Reason != ReasonRelievedCost {
		t.Fatalf("pod-5 %+v (changed %v), want 71 = 100 / 1.4 for %q", got, d.Changed, ReasonRelievedCost)
	}
	for i, r := range d.Endpoints {
		if i != 5 && r.Weight != 100 {
			t.Fatalf("%s moved to %d; a slower pod without a queue moves alone", r.ID, r.Weight)
		}
	}
	// The same rise seen over too few requests, or while the pod's own load moved, is not a jump.
	few := reliefFleet()
	few[5].CPUCores = 0.7
	if d, _ := Relieve(ReliefInput{Endpoints: few, Baseline: baselineOf(base), WindowSeconds: 4, WeightsSettled: true}, DefaultSettings(AlgorithmCapacity)); d.Changed {
		t.Fatalf("relieved on 400 requests: %s", d.Reason)
	}
	moved := reliefFleet()
	moved[5].CPUCores, moved[5].RequestRate = 0.7*1.3, 130
	if d, _ := Relieve(ReliefInput{Endpoints: moved, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmCapacity)); d.Changed && d.Endpoints[5].Reason == ReasonRelievedCost {
		t.Fatalf("relieved for its CPU per request while its rate moved 30%%: %s", d.Reason)
	}
}

func TestRelieve_ALoadThatRoseForEveryPodIsTheCyclesToPlan(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	for i := range now {
		// Every pod 70% busier, two of them at 92% of their limit: a surge, not a sick pod.
		now[i].CPUCores, now[i].RequestRate = 0.85, 170
	}
	now[0].CPUCores, now[1].CPUCores = 0.92, 0.92
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("relieved pods for a load that rose for all: %s", d.Reason)
	}
}

func TestRelieve_AnOverloadMovesEveryPodTowardTheCapacitySplit(t *testing.T) {
	// A fast pair the plan leans on and six slow pods: one fast pod's CPU jumps to its limit
	// (its twin died). Cutting it alone would hand its load to the other fast pod.
	base := []Endpoint{}
	for i := range 2 {
		e := ep(fmt.Sprintf("fast-%d", i), 0.6, 300, 1, 400)
		e.LatencyP99Seconds = 0.02
		base = append(base, e)
	}
	for i := range 6 {
		e := ep(fmt.Sprintf("slow-%d", i), 0.1, 10, 1, 10)
		e.LatencyP99Seconds = 0.1
		base = append(base, e)
	}
	now := append([]Endpoint(nil), base...)
	now[0].CPUCores, now[0].RequestRate = 1, 480
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[0].Reason != ReasonRelievedCPU {
		t.Fatalf("fast-0 at its limit not relieved: %s %+v", d.Reason, d.Endpoints[0])
	}
	if d.Endpoints[1].Weight >= 400 {
		t.Fatalf("fast-1 kept %d: the relief must not hand fast-0's load to its twin", d.Endpoints[1].Weight)
	}
	if d.Endpoints[2].Weight <= 10 || d.Endpoints[2].Reason != ReasonReliefSafeSplit {
		t.Fatalf("slow-0 %+v, want more weight, moved to the capacity split", d.Endpoints[2])
	}
}

func TestRelieve_AJumpAWriteAlreadyAnsweredIsNotCutTwice(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	now[3].CPUCores, now[3].RequestRate, now[3].LatencyP99Seconds = 1, 62, 1.5
	now[3].CurrentWeight = 40 // the last relief's cut, which the window mostly predates
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true, Answered: map[string]bool{"pod-3": true}}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("pod-3 cut again for the jump its last cut answered: %s", d.Reason)
	}
}

func TestRelieve_OnlyAdaptiveLBsOwnAlgorithms(t *testing.T) {
	now := reliefFleet()
	now[3].CPUCores, now[3].RequestRate, now[3].LatencyP99Seconds = 1, 62, 1.5
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(reliefFleet()), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmCPUDistance))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatal("cpu-distance relieved: the published operator's rule has no check between cycles")
	}
}

func TestCompute_ARelievedPodIsRestoredSlowly(t *testing.T) {
	// Two kinds at 40% of capacity; fast-0 was relieved to 20 and has recovered: the cycle
	// would take it straight back, but raises it by at most half per cycle.
	eps := seedFleet(100)
	for i := range eps {
		eps[i].CurrentWeight = 100 + 10*(i%2) // adapted: not a first step
	}
	eps[0].CurrentWeight = 20
	free, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, RecentPeakRequestRate: 1500, WindowCoverage: 1}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	if free.Endpoints[0].Weight <= 30 {
		t.Fatalf("without the flag fast-0 goes from 20 to %d; the test needs a larger step", free.Endpoints[0].Weight)
	}
	eps[0].Relieved = true
	slow, err := Compute(Input{Endpoints: eps, WindowSeconds: 60, RecentPeakRequestRate: 1500, WindowCoverage: 1}, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	if w := slow.Endpoints[0].Weight; w > 30 {
		t.Fatalf("a relieved pod went from 20 to %d in one cycle, want at most 30", w)
	}
}

func TestCompute_TheCycleDoesNotHalveAgainAnOverloadAReliefAnswered(t *testing.T) {
	eps := reliefFleet()
	for i := range eps {
		eps[i].CurrentWeight = 100 + i // adapted
	}
	eps[3].LatencyP99Seconds, eps[3].CurrentWeight = 2, 40 // the window still shows the queue
	in := Input{Endpoints: eps, WindowSeconds: 60, WindowCoverage: 0.6}
	d, err := Compute(in, DefaultSettings(AlgorithmCapacity))
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoints[3].Reason != ReasonOverloaded {
		t.Fatalf("without the flag pod-3 is not halved (%+v); the test needs the overload", d.Endpoints[3])
	}
	eps[3].OverloadAnswered = true
	if d, err = Compute(in, DefaultSettings(AlgorithmCapacity)); err != nil {
		t.Fatal(err)
	}
	if d.Endpoints[3].Weight != 40 {
		t.Fatalf("pod-3 halved again to %d for the queue the relief answered", d.Endpoints[3].Weight)
	}
}

func TestRelieve_AReliefThatCannotLowerAJumpedPodsShareIsNotWritten(t *testing.T) {
	// pod-3 already sits at capacity's minimum weight and queues: no split lowers its share,
	// and moving the others (pod-0 is twice as fast as the split in force says) would write on
	// every check for nothing.
	s := DefaultSettings(AlgorithmCapacity)
	base := reliefFleet()
	for i := range base {
		base[i].CurrentWeight = 200
	}
	base[0].CPUCores = 0.25
	base[3].CurrentWeight, base[3].RequestRate, base[3].CPUCores = s.MinWeight, 6, 0.05
	now := append([]Endpoint(nil), base...)
	now[3].CPUCores, now[3].LatencyP99Seconds = 0.95, 2
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, s)
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("a relief that leaves pod-3 at its floor was written: %s %v", d.Reason, weightsOf(d))
	}
	if !strings.Contains(d.Reason, "pod-3") {
		t.Fatalf("the reason %q does not say which jump went unrelieved", d.Reason)
	}

	// The control: the same jump above the floor is relieved.
	base[3].CurrentWeight, now[3].CurrentWeight = 40, 40
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, s)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[3].Weight >= 40 {
		t.Fatalf("pod-3 above its floor was not relieved: %s %v", d.Reason, weightsOf(d))
	}
}

func TestRelieve_APodTheCycleRaisedRunsHotterByDesign(t *testing.T) {
	// The last cycle doubled pod-2's weight (it observed 100 before its write): its CPU rising
	// to 95% of its limit is the plan, not a jump, while its latency holds.
	base := reliefFleet()
	now := reliefFleet()
	now[2].CurrentWeight, now[2].CPUCores, now[2].RequestRate = 200, 0.95, 190
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("the pod the cycle raised was cut for the CPU it was given: %s %v", d.Reason, weightsOf(d))
	}

	// The control: the same CPU on an unchanged weight is a jump.
	now[2].CurrentWeight = 100
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[2].Reason != ReasonRelievedCPU {
		t.Fatalf("pod-2 at 95%% of its limit on an unchanged weight was not relieved: %s %+v", d.Reason, d.Endpoints[2])
	}
}

func TestRelieve_AQueueTheCycleAlreadyCutIsLeftToDrain(t *testing.T) {
	// The last cycle saw pod-3 queue (p99 1.5 s) and halved its weight; the short window shows
	// the queue draining (p99 0.9 s). Cutting it again would answer twice.
	base := reliefFleet()
	base[3].CPUCores, base[3].RequestRate, base[3].LatencyP99Seconds = 1, 62, 1.5
	now := append([]Endpoint(nil), base...)
	now[3].CurrentWeight, now[3].LatencyP99Seconds = 50, 0.9
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("the queue the cycle cut was cut again: %s %v", d.Reason, weightsOf(d))
	}

	// The control: a queue the cycle left alone, not shrinking, is relieved.
	now[3].CurrentWeight, now[3].LatencyP99Seconds = 100, 1.6
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[3].Weight >= 100 {
		t.Fatalf("a queue that outlived a cycle which left it alone was not relieved: %s %v", d.Reason, weightsOf(d))
	}
}

func TestRelieve_APodSlowingTooTakesOnNoLoad(t *testing.T) {
	// pod-3 overloads; pod-5's p99 went from 40 to 90 ms, short of a jump (three times). The
	// safe split's capacities come from the last cycle, which may overstate pod-5's: it must not
	// take pod-3's load.
	base := reliefFleet()
	now := reliefFleet()
	now[3].CPUCores, now[3].RequestRate, now[3].LatencyP99Seconds = 1, 62, 1.5
	now[5].LatencyP99Seconds = 0.09
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed {
		t.Fatalf("pod-3 not relieved: %s", d.Reason)
	}
	if r := d.Endpoints[5]; r.Weight > 100 || r.Reason == ReasonRelievedLatency || r.Reason == ReasonRelievedCost {
		t.Fatalf("pod-5, slowing short of a jump, was raised or relieved itself: %+v", r)
	}
	// The control: a pod that is not slowing takes on load.
	now[5].LatencyP99Seconds = 0.04
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if w := d.Endpoints[5].Weight; w <= 100 {
		t.Fatalf("pod-5, healthy, kept %d: the control does not show the safe split raising anyone", w)
	}
}

func TestRelieve_APodThatQueuesWithItsCPUFlatIsCutOnEnoughRequests(t *testing.T) {
	// A neighbour took pod-4's cores: its CPU reads as before (throttled at what it gets), its
	// p99 went from 40 ms to 600 ms. 100 rps over 30 s is 3,000 requests: enough to judge.
	base := reliefFleet()
	now := reliefFleet()
	now[4].LatencyP99Seconds = 0.6
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[4].Reason != ReasonRelievedLatency || d.Endpoints[4].Weight > 50 {
		t.Fatalf("pod-4 queueing with its CPU flat was not relieved: %s %+v", d.Reason, d.Endpoints[4])
	}

	// The control: the same p99 on a trickle (2 rps, 60 requests in the window) is noise.
	for i := range base {
		base[i].RequestRate, now[i].RequestRate = 2, 2
		base[i].CPUCores, now[i].CPUCores = 0.01, 0.01
	}
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("a p99 over 60 requests cut a pod that is not busier than its peers: %s %v", d.Reason, weightsOf(d))
	}
}

func TestRelieve_ALatencyJumpOnAPodNoBusierThanItsPeersNeedsASteadyLoad(t *testing.T) {
	// pod-4's p99 went from 40 to 600 ms with its CPU flat, while the fleet's rate rose by 30%: a
	// burst queues the pod the clients prefer for a moment. Only a busy pod is judged then.
	base := reliefFleet()
	now := reliefFleet()
	for i := range now {
		now[i].RequestRate, now[i].CPUCores = 130, 0.65
	}
	now[4].LatencyP99Seconds = 0.6
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("a pod no busier than its peers was relieved for its p99 while the load rose 30%%: %s %v", d.Reason, weightsOf(d))
	}
}

func TestRelieve_ACostRiseShortOfAJumpIsNoise(t *testing.T) {
	// A steady seed-fib pod's short window read its CPU per request 17% above its cycle's: below
	// the 20% jump, nothing is relieved; at 25%, its weight follows its capacity down.
	base := reliefFleet()
	now := reliefFleet()
	now[6].CPUCores = 0.585
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Fatalf("a 17%% rise of CPU per request was relieved: %s %v", d.Reason, weightsOf(d))
	}
	now[6].CPUCores = 0.625
	d, err = Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[6].Reason != ReasonRelievedCost || d.Endpoints[6].Weight != 80 {
		t.Fatalf("a 25%% rise of CPU per request: %s %+v, want pod-6 at 100/1.25 = 80", d.Reason, d.Endpoints[6])
	}
}
