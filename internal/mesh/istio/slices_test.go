package istio

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
)

func entry(i int, weight uint32) *apinetworkingv1.WorkloadEntry {
	return &apinetworkingv1.WorkloadEntry{
		Address: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256),
		Ports:   map[string]uint32{"http": 8080},
		Labels:  map[string]string{"app": "web"},
		Weight:  weight,
	}
}

// applyPlan carries out plan on slices (name → endpoints) one step at a time, calling check
// after each step, and returns the result.
func applyPlan(slices map[string][]*apinetworkingv1.WorkloadEntry, plan SlicePlan, check func(step string, state map[string][]*apinetworkingv1.WorkloadEntry)) map[string][]*apinetworkingv1.WorkloadEntry {
	state := maps.Clone(slices)
	if state == nil {
		state = map[string][]*apinetworkingv1.WorkloadEntry{}
	}
	for i, w := range plan.Writes {
		state[w.Name] = w.Endpoints
		check(fmt.Sprintf("write %d (%s)", i, w.Name), state)
	}
	for _, name := range plan.Deletes {
		delete(state, name)
		check("delete "+name, state)
	}
	return state
}

// checkStep asserts the invariants that hold at every moment of a plan's write order: an
// address wanted before and after is in some slice, and never in two with different content.
func checkStep(t *testing.T, step string, state map[string][]*apinetworkingv1.WorkloadEntry, before, after map[string]*apinetworkingv1.WorkloadEntry) {
	t.Helper()
	seen := map[string]*apinetworkingv1.WorkloadEntry{}
	for name, eps := range state {
		for _, e := range eps {
			if other, ok := seen[e.Address]; ok && !proto.Equal(other, e) {
				t.Fatalf("%s: %s is in two slices with different content (weights %d and %d; one in %s)", step, e.Address, other.Weight, e.Weight, name)
			}
			seen[e.Address] = e
		}
	}
	for addr := range before {
		if _, still := after[addr]; still && seen[addr] == nil {
			t.Fatalf("%s: %s, wanted before and after, is in no slice", step, addr)
		}
	}
}

// checkFinal asserts the plan's end state: exactly the desired endpoints, each in one slice
// with its desired content, no slice over the bound, the primary present, and Slices equal to
// what the writes leave.
func checkFinal(t *testing.T, primary string, state map[string][]*apinetworkingv1.WorkloadEntry, plan SlicePlan, desired []*apinetworkingv1.WorkloadEntry, maxPer int) {
	t.Helper()
	want := map[string]*apinetworkingv1.WorkloadEntry{}
	for _, e := range desired {
		want[e.Address] = e
	}
	got := map[string]string{}
	for name, eps := range state {
		if _, ok := SliceIndex(primary, name); !ok {
			t.Fatalf("slice %q is not named as one of %s's", name, primary)
		}
		if len(eps) > maxPer {
			t.Fatalf("slice %s has %d endpoints, above the bound of %d", name, len(eps), maxPer)
		}
		if !slices.IsSortedFunc(eps, byAddress) {
			t.Fatalf("slice %s is not sorted by address", name)
		}
		for _, e := range eps {
			if other, dup := got[e.Address]; dup {
				t.Fatalf("%s is in slices %s and %s", e.Address, other, name)
			}
			got[e.Address] = name
			if w, ok := want[e.Address]; !ok {
				t.Fatalf("%s (slice %s) is not wanted", e.Address, name)
			} else if !proto.Equal(w, e) {
				t.Fatalf("%s in slice %s has weight %d, want %d", e.Address, name, e.Weight, w.Weight)
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d endpoints in the slices, want %d", len(got), len(want))
	}
	if _, ok := state[primary]; !ok {
		t.Fatalf("the primary slice %s is missing", primary)
	}
	if len(state) != len(plan.Slices) {
		t.Fatalf("the writes leave %d slices, the plan says %d", len(state), len(plan.Slices))
	}
	for name, eps := range plan.Slices {
		if !slices.EqualFunc(state[name], eps, entriesEqual) {
			t.Fatalf("slice %s after the writes differs from the plan's", name)
		}
	}
}

// TestPlanSlices_RandomChurnLosesNothingAndTouchesOnlyWhatChanged drives the planner through
// seeded random churn (additions, removals, weight changes, single and in bulk) and checks,
// after every plan and at every step of its write order, that no endpoint is lost or
// duplicated; and for a single change, that it costs one write unless a rare merge runs.
func TestPlanSlices_RandomChurnLosesNothingAndTouchesOnlyWhatChanged(t *testing.T) {
	const primary, maxPer = "web", 20
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		state := map[string][]*apinetworkingv1.WorkloadEntry{}
		live := map[int]uint32{} // endpoint number → weight
		next := 0
		merges := 0
		for step := range 150 {
			before := desiredOf(live)
			single := false
			switch op := rng.IntN(10); {
			case op < 3 || len(live) == 0: // one new endpoint
				live[next] = 100
				next++
				single = true
			case op < 6: // one endpoint leaves
				delete(live, pick(rng, live))
				single = true
			case op < 8: // one weight changes
				k := pick(rng, live)
				live[k] = live[k] + 1 + uint32(rng.IntN(50))
				single = true
			case op < 9: // a rollout: many leave, many arrive
				for range rng.IntN(30) {
					if len(live) > 0 {
						delete(live, pick(rng, live))
					}
				}
				for range rng.IntN(40) {
					live[next] = 100 + uint32(rng.IntN(100))
					next++
				}
			default: // a weight cycle: most weights move
				for k := range live {
					if rng.IntN(4) > 0 {
						live[k] = 1 + uint32(rng.IntN(1000))
					}
				}
			}
			desired := desiredOf(live)
			list := slices.Collect(maps.Values(desired))
			rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
			plan := PlanSlices(primary, state, list, maxPer)
			beforeByAddr := byAddr(before)
			after := applyPlan(state, plan, func(s string, st map[string][]*apinetworkingv1.WorkloadEntry) {
				checkStep(t, fmt.Sprintf("seed %d step %d %s", seed, step, s), st, beforeByAddr, desired)
			})
			checkFinal(t, primary, after, plan, list, maxPer)
			merged := mergedAny(state, plan, desired)
			if merged {
				merges++
			}
			if ops := len(plan.Writes) + len(plan.Deletes); single && !merged && ops > 1 {
				t.Fatalf("seed %d step %d: one change cost %d writes and %d deletes: %+v", seed, step, len(plan.Writes), len(plan.Deletes), plan)
			}
			// Planning again with nothing changed writes nothing.
			if again := PlanSlices(primary, after, list, maxPer); len(again.Writes)+len(again.Deletes) != 0 {
				t.Fatalf("seed %d step %d: an unchanged Service plans %d writes and %d deletes", seed, step, len(again.Writes), len(again.Deletes))
			}
			state = after
		}
		if merges > 15 {
			t.Errorf("seed %d: %d merges in 150 plans; rebalancing must be rare", seed, merges)
		}
	}
}

// mergedAny reports whether plan moved a still-wanted address out of a slice, a rebalance.
func mergedAny(state map[string][]*apinetworkingv1.WorkloadEntry, plan SlicePlan, desired map[string]*apinetworkingv1.WorkloadEntry) bool {
	for name, eps := range state {
		home := map[string]bool{}
		for _, e := range plan.Slices[name] {
			home[e.Address] = true
		}
		for _, e := range eps {
			if desired[e.Address] != nil && !home[e.Address] {
				return true
			}
		}
	}
	return false
}

func desiredOf(live map[int]uint32) map[string]*apinetworkingv1.WorkloadEntry {
	out := map[string]*apinetworkingv1.WorkloadEntry{}
	for k, w := range live {
		e := entry(k, w)
		out[e.Address] = e
	}
	return out
}

func byAddr(m map[string]*apinetworkingv1.WorkloadEntry) map[string]*apinetworkingv1.WorkloadEntry {
	return maps.Clone(m)
}

func pick(rng *rand.Rand, live map[int]uint32) int {
	keys := slices.Sorted(maps.Keys(live))
	return keys[rng.IntN(len(keys))]
}

func TestPlanSlices_MembershipChangeRewritesOnlyItsSlice(t *testing.T) {
	var desired []*apinetworkingv1.WorkloadEntry
	for i := range 2000 {
		desired = append(desired, entry(i, 100))
	}
	plan := PlanSlices("web", nil, desired, 500)
	if len(plan.Slices) != 4 {
		t.Fatalf("2,000 endpoints in %d slices, want 4 of 500", len(plan.Slices))
	}
	state := applyPlan(nil, plan, func(string, map[string][]*apinetworkingv1.WorkloadEntry) {})

	// Pod 1234 leaves: only its slice is written.
	leaving := entry(1234, 100).Address
	var home string
	for name, eps := range state {
		if slices.ContainsFunc(eps, func(e *apinetworkingv1.WorkloadEntry) bool { return e.Address == leaving }) {
			home = name
		}
	}
	rest := slices.DeleteFunc(slices.Clone(desired), func(e *apinetworkingv1.WorkloadEntry) bool { return e.Address == leaving })
	plan = PlanSlices("web", state, rest, 500)
	if len(plan.Writes) != 1 || plan.Writes[0].Name != home || len(plan.Deletes) != 0 {
		t.Fatalf("one endpoint leaving slice %s planned writes %v and deletes %v; want one write of %s", home, names(plan.Writes), plan.Deletes, home)
	}
	state = applyPlan(state, plan, func(string, map[string][]*apinetworkingv1.WorkloadEntry) {})

	// Its replacement arrives at a new address: it fills the hole, one write.
	rest = append(rest, entry(5000, 100))
	plan = PlanSlices("web", state, rest, 500)
	if len(plan.Writes) != 1 || len(plan.Deletes) != 0 {
		t.Fatalf("one new endpoint planned writes %v and deletes %v; want one write", names(plan.Writes), plan.Deletes)
	}
	state = applyPlan(state, plan, func(string, map[string][]*apinetworkingv1.WorkloadEntry) {})

	// A weight change in two slices writes those two only.
	changed := slices.Clone(rest)
	changed[10] = entry(10, 300)   // slice web
	changed[1900] = entry(1900, 7) // slice web.3
	plan = PlanSlices("web", state, changed, 500)
	if got := names(plan.Writes); !slices.Equal(got, []string{"web", "web.3"}) || len(plan.Deletes) != 0 {
		t.Fatalf("weights changed in web and web.3, planned writes %v and deletes %v", got, plan.Deletes)
	}
}

// TestPlanSlices_OneBigServiceEntrySplitsWithoutAGap is the upgrade: one ServiceEntry of 2,000
// endpoints (written before slices existed), whose weights change in the same plan. The new
// slices take their endpoints with the weights they have before the primary lets them go, and
// get the new weights last.
func TestPlanSlices_OneBigServiceEntrySplitsWithoutAGap(t *testing.T) {
	var old, desired []*apinetworkingv1.WorkloadEntry
	for i := range 2000 {
		old = append(old, entry(i, 100))
		desired = append(desired, entry(i, 100+uint32(i%3)))
	}
	state := map[string][]*apinetworkingv1.WorkloadEntry{"web": old}
	plan := PlanSlices("web", state, desired, 500)
	before, after := map[string]*apinetworkingv1.WorkloadEntry{}, map[string]*apinetworkingv1.WorkloadEntry{}
	for _, e := range old {
		before[e.Address] = e
	}
	for _, e := range desired {
		after[e.Address] = e
	}
	got := applyPlan(state, plan, func(step string, st map[string][]*apinetworkingv1.WorkloadEntry) {
		checkStep(t, step, st, before, after)
	})
	checkFinal(t, "web", got, plan, desired, 500)
	want := []string{"web.1", "web.2", "web.3", "web", "web.1", "web.2", "web.3"}
	if !slices.Equal(names(plan.Writes), want) {
		t.Fatalf("writes %v, want %v: the new homes, the primary, then the moved endpoints' new weights", names(plan.Writes), want)
	}
}

// TestPlanSlices_SparseSlicesMergeRarelyAndSafely: after most pods of a large Service leave, a
// sparse slice is merged into the others, the others written before it is deleted.
func TestPlanSlices_SparseSlicesMergeRarelyAndSafely(t *testing.T) {
	var desired []*apinetworkingv1.WorkloadEntry
	for i := range 60 {
		desired = append(desired, entry(i, 100))
	}
	state := applyPlan(nil, PlanSlices("web", nil, desired, 20), func(string, map[string][]*apinetworkingv1.WorkloadEntry) {})
	// Keep 10 endpoints of web, 3 of web.1 and 4 of web.2.
	var rest []*apinetworkingv1.WorkloadEntry
	for name, n := range map[string]int{"web": 10, "web.1": 3, "web.2": 4} {
		rest = append(rest, state[name][:n]...)
	}
	plan := PlanSlices("web", state, rest, 20)
	before, after := map[string]*apinetworkingv1.WorkloadEntry{}, map[string]*apinetworkingv1.WorkloadEntry{}
	for _, e := range desired {
		before[e.Address] = e
	}
	for _, e := range rest {
		after[e.Address] = e
	}
	got := applyPlan(state, plan, func(step string, st map[string][]*apinetworkingv1.WorkloadEntry) {
		checkStep(t, step, st, before, after)
	})
	checkFinal(t, "web", got, plan, rest, 20)
	if len(plan.Deletes) != 1 || plan.Deletes[0] != "web.1" {
		t.Fatalf("deletes %v, want the sparsest slice web.1 merged away", plan.Deletes)
	}
	if len(got) != 2 {
		t.Fatalf("%d slices after one merge, want 2 (one merge per plan)", len(got))
	}
}

func TestSliceName_RoundTripsAndNeverNamesAnotherService(t *testing.T) {
	for n := range 30 {
		name := SliceName("web", n)
		if got, ok := SliceIndex("web", name); !ok || got != n {
			t.Fatalf("SliceIndex(%q) = %d, %v; want %d", name, got, ok, n)
		}
	}
	for _, name := range []string{"web-1", "web.", "web.01", "web.x", "webs", "web.-1", "web.1.2", "api"} {
		if _, ok := SliceIndex("web", name); ok {
			t.Errorf("%q counted as one of web's slices", name)
		}
	}
}

func TestSliceSpec_EverySliceCarriesTheWholeSpec(t *testing.T) {
	in := largeInput(1200, 100, func() map[string]string { return map[string]string{"app": "web"} })
	in.Service.Spec.Ports = append(in.Service.Spec.Ports, in.Service.Spec.Ports[0])
	in.Service.Spec.Ports[1].Name, in.Service.Spec.Ports[1].Port = "grpc", 9090
	whole, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	whole.SubjectAltNames = []string{"spiffe://x"} // every field set, so that one left out shows
	whole.WorkloadSelector = &apinetworkingv1.WorkloadSelector{Labels: map[string]string{"a": "b"}}
	plan := PlanSlices("web", nil, whole.Endpoints, 0)
	head := proto.Clone(whole).(*apinetworkingv1.ServiceEntry)
	head.Endpoints = nil
	var union int
	for name, eps := range plan.Slices {
		spec := SliceSpec(whole, eps)
		union += len(spec.Endpoints)
		spec.Endpoints = nil
		if !proto.Equal(spec, head) {
			t.Fatalf("slice %s's spec differs from the whole one's beyond its endpoints:\n%v\n%v", name, spec, head)
		}
	}
	if union != len(whole.Endpoints) {
		t.Fatalf("the slices carry %d endpoints, want %d", union, len(whole.Endpoints))
	}
}

func names(ws []SliceWrite) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.Name
	}
	return out
}
