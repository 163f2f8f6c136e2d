package weights

import "testing"

// This file holds the relief's judgement of how each pod's weight moved since the last cycle:
// against the median pod's move, so that another pod's raise or cut does not read as one.

// A pod the last cycle raised from weight 0 (a newcomer weighted for the first time) runs hot by
// design, like the raised pod of TestRelieve_APodTheCycleRaisedRunsHotterByDesign.
func TestRelieve_APodRaisedFromZeroRunsHotterByDesign(t *testing.T) {
	base := reliefFleet()
	base[7].CurrentWeight, base[7].RequestRate, base[7].CPUCores = 0, 2, 0.01
	now := reliefFleet()
	now[7].CurrentWeight, now[7].CPUCores, now[7].RequestRate = 200, 0.95, 190
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if d.Changed {
		t.Errorf("pod-7, raised from 0 to 200 by the cycle, was cut: %s %v", d.Reason, weightsOf(d))
	}
}

// A newcomer's weight lowers every other pod's share (100/800 -> 100/900), not their weights: a
// queue the cycle left alone (the control case of TestRelieve_AQueueTheCycleAlreadyCutIsLeftToDrain)
// is still relieved.
func TestRelieve_ANewcomerDoesNotHideAQueueTheCycleLeftAlone(t *testing.T) {
	base := reliefFleet()
	base[3].CPUCores, base[3].RequestRate, base[3].LatencyP99Seconds = 1, 62, 1.5
	now := append([]Endpoint(nil), base...)
	now[3].LatencyP99Seconds = 1.6
	run := func(label string) {
		d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Changed || d.Endpoints[3].Weight >= 100 {
			t.Errorf("%s: pod-3's queue, weight left at 100 by the cycle, not relieved: %s %v", label, d.Reason, weightsOf(d))
		}
	}
	run("control")
	base[7].CurrentWeight = 0 // pod-7 had no weight at the last cycle; the cycle gave it 100
	run("newcomer weighted from 0")
}

// A pod a relief cut (weight 100 -> 25) has drained (p99 back to 60 ms, CPU per request
// unchanged: its cores are still taken). Another pod jumps: the safe split, which takes pod-3's
// capacity from the last cycle (before its slowdown), must not raise it: restoring it is the
// cycles' to do, slowly.
func TestRelieve_AnotherPodsReliefDoesNotUndoARecentRelief(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	for i := range now {
		now[i].RequestRate, now[i].CPUCores = 110.3, 0.5515
	}
	now[3].CurrentWeight, now[3].RequestRate, now[3].CPUCores, now[3].LatencyP99Seconds = 25, 27.6, 0.138, 0.06
	now[5].CPUCores, now[5].RequestRate, now[5].LatencyP99Seconds = 1, 62, 1.5
	now[3].Relieved = true // relieved within the restore window
	for _, answered := range []bool{true, false} {
		d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true,
			Answered: map[string]bool{"pod-3": answered}}, DefaultSettings(AlgorithmTail))
		if err != nil {
			t.Fatal(err)
		}
		if d.Endpoints[3].Weight > 25 {
			t.Errorf("answered=%v: pod-3, relieved to 25, raised to %d by pod-5's relief: %s %v", answered, d.Endpoints[3].Weight, d.Reason, weightsOf(d))
		}
	}
}

// The cycle raised one pod (pod-0: 100 -> 160): every other pod's share fell 7% (100/800 ->
// 100/860), their weights did not. pod-3, whose queue outlived a cycle that left its weight alone
// and did not shrink, is relieved.
func TestRelieve_RaisingAnotherPodDoesNotHideAQueue(t *testing.T) {
	base := reliefFleet()
	base[3].CPUCores, base[3].RequestRate, base[3].LatencyP99Seconds = 1, 62, 1.5
	now := append([]Endpoint(nil), base...)
	now[3].LatencyP99Seconds = 1.6
	now[0].CurrentWeight = 160
	d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30, WeightsSettled: true}, DefaultSettings(AlgorithmTail))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Changed || d.Endpoints[3].Weight >= 100 {
		t.Errorf("pod-3's queue (weight left at 100) not relieved because pod-0 was raised: %s %v", d.Reason, weightsOf(d))
	}
}

// The last cycle halved pod-0 (100 -> 50): every other pod's share rose 6.7% (100/800 ->
// 100/750), their weights did not. pod-2, whose CPU per request nearly doubled at an unchanged
// weight and which now runs at 95% of its limit, is relieved as without the cut.
func TestRelieve_CuttingOnePodLeavesTheCPURuleToTheOthers(t *testing.T) {
	base := reliefFleet()
	now := reliefFleet()
	now[2].CPUCores, now[2].LatencyP99Seconds = 0.95, 0.1
	run := func(label string) {
		d, err := Relieve(ReliefInput{Endpoints: now, Baseline: baselineOf(base), WindowSeconds: 30}, DefaultSettings(AlgorithmTail))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Changed || d.Endpoints[2].Weight >= 100 {
			t.Errorf("%s: pod-2 at 95%% of its limit (was 50%%) not relieved: %s %v", label, d.Reason, weightsOf(d))
		}
	}
	run("control")
	now[0].CurrentWeight, now[0].RequestRate, now[0].CPUCores = 50, 53, 0.265
	run("after the cycle halved pod-0")
}
