package istio

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	apinetworkingv1 "istio.io/api/networking/v1"
)

// A Service's weighted endpoints are split across several ServiceEntries of the same host, its
// slices, the way Kubernetes splits a Service's endpoints across EndpointSlices. istiod merges
// same-host ServiceEntries in EDS (the union, weights kept; CDS, LDS and RDS unchanged, as long
// as every slice carries the same ports: test/istiod TestSlicedServiceEntriesMergeLikeOne), so a
// membership change rewrites one slice instead of the whole list, and a Service of any size fits
// etcd's object limit.

// MaxSliceEndpoints is the most endpoints one slice carries: 100, as in an EndpointSlice. The
// API server's CPU for a ServiceEntry update grows with its endpoints, not per object: Istio's
// CRD validates every endpoint (its OpenAPI schema and CEL rules), about 0.35-0.5 ms of CPU per
// endpoint on the test machine, while no fixed cost per object showed. Measured per endpoint
// change of a 2,000-pod Service (BenchmarkServiceEntrySlices_EndpointChange, docs/benchmarks.md):
// one ServiceEntry of 2,000 endpoints cost 1,020 ms and 601 KB written, slices of 500 cost
// 192-237 ms and 148 KB, slices of 100 36 ms and 31 KB. A weight write that moves every weight
// costs about the same in all three (every endpoint is validated once), in more but smaller
// writes: 100 for a 10,000-pod Service, half a second of the client's default 200 requests/s.
// Smaller slices would cut the membership cost further but multiply the objects istiod and the
// watchdog handle for a large Service.
const MaxSliceEndpoints = 100

// sliceSeparator joins the Service's name and a slice's number. A Service name is a DNS-1035
// label, which has no dot, so no slice name is ever another Service's first slice.
const sliceSeparator = "."

// SliceName is the name of slice n of the Service whose first slice is primary: the first keeps
// the Service's name (so that a Service with one slice is what it was before slices existed),
// the others are primary.n.
func SliceName(primary string, n int) string {
	if n == 0 {
		return primary
	}
	return primary + sliceSeparator + strconv.Itoa(n)
}

// SliceIndex is the number of the slice named name, when it is one of primary's slices.
func SliceIndex(primary, name string) (int, bool) {
	if name == primary {
		return 0, true
	}
	rest, ok := strings.CutPrefix(name, primary+sliceSeparator)
	if !ok || rest == "" || rest[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// SliceWrite is one create or update: the slice's whole endpoint list, sorted by address.
type SliceWrite struct {
	Name      string
	Endpoints []*apinetworkingv1.WorkloadEntry
}

// SlicePlan is how to go from the current slices to the desired endpoints.
type SlicePlan struct {
	// Slices are every slice once the plan is carried out, by name (an empty primary included).
	Slices map[string][]*apinetworkingv1.WorkloadEntry
	// Writes are the creates and updates, in the order to make them: an address that moves
	// between slices is written into its new home before it leaves its old one, so it is never
	// in no slice; and it moves with the content it had, so that an address in two slices for
	// the moment between two writes has the same weight in both. Its new content, if any, is
	// written in a last step. A slice may appear twice only in that case.
	Writes []SliceWrite
	// Deletes are the slices to delete once every write has landed.
	Deletes []string
}

// PlanSlices plans the slices of desired (the Service's endpoints, any order, one per address)
// given current (the slices that exist, by name; primary's slices only), with at most
// maxPerSlice endpoints per slice (0: MaxSliceEndpoints). Like the EndpointSlice controller:
//   - an endpoint stays in the slice that holds it, so a membership or weight change rewrites
//     only the slices it touches;
//   - a new endpoint goes into a slice already being written, else into the existing slice with
//     most room, else into new slices at the lowest free numbers;
//   - slices are rebalanced rarely: an emptied slice other than the primary is deleted, and a
//     sparse one (a quarter full or less, while the Service has more slices than it needs) is
//     merged into the others, one per plan, and only in a plan that writes anyway.
//
// The primary slice always exists in the plan, with no endpoints if need be.
func PlanSlices(primary string, current map[string][]*apinetworkingv1.WorkloadEntry, desired []*apinetworkingv1.WorkloadEntry, maxPerSlice int) SlicePlan {
	if maxPerSlice <= 0 {
		maxPerSlice = MaxSliceEndpoints
	}
	want := make(map[string]*apinetworkingv1.WorkloadEntry, len(desired))
	for _, e := range desired {
		want[e.Address] = e
	}
	p := planner{primary: primary, max: maxPerSlice, want: want, slices: map[string]*plannedSlice{}}
	p.keep(current)
	p.placeNew(desired)
	p.merge(len(desired))
	return p.plan()
}

// plannedSlice is one slice while planning.
type plannedSlice struct {
	index   int
	exists  bool
	before  []*apinetworkingv1.WorkloadEntry          // as it is, sorted by address
	kept    map[string]*apinetworkingv1.WorkloadEntry // after the plan, by address
	changed bool                                      // its endpoints or their content change
	sheds   bool                                      // gives still-wanted addresses to other slices
	gets    map[string]*apinetworkingv1.WorkloadEntry // addresses moved in, with the content they had
}

type planner struct {
	primary string
	max     int
	want    map[string]*apinetworkingv1.WorkloadEntry
	slices  map[string]*plannedSlice
	placed  map[string]string // address → slice
	moving  []*apinetworkingv1.WorkloadEntry
}

// keep leaves every wanted address in the slice that holds it (the first by number, if two do),
// with its wanted content. A slice over the bound (the bound was lowered, or one ServiceEntry
// from before slices) sheds its excess to other slices.
func (p *planner) keep(current map[string][]*apinetworkingv1.WorkloadEntry) {
	p.placed = map[string]string{}
	names := make([]string, 0, len(current))
	for name := range current {
		if _, ok := SliceIndex(p.primary, name); ok {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(p.index(a), p.index(b)) })
	for _, name := range names {
		s := &plannedSlice{index: p.index(name), exists: true, kept: map[string]*apinetworkingv1.WorkloadEntry{}}
		s.before = slices.Clone(current[name])
		slices.SortFunc(s.before, byAddress)
		for _, e := range s.before {
			w, ok := p.want[e.Address]
			_, elsewhere := p.placed[e.Address]
			switch {
			case !ok || elsewhere:
				s.changed = true
			case len(s.kept) >= p.max:
				s.changed, s.sheds = true, true
				p.moving = append(p.moving, e)
				p.placed[e.Address] = "" // moves: placed by placeNew
			default:
				s.kept[e.Address] = w
				p.placed[e.Address] = name
				if !proto.Equal(e, w) {
					s.changed = true
				}
			}
		}
		p.slices[name] = s
	}
	if p.slices[p.primary] == nil {
		p.slices[p.primary] = &plannedSlice{kept: map[string]*apinetworkingv1.WorkloadEntry{}, changed: true}
	}
}

func (p *planner) index(name string) int {
	n, _ := SliceIndex(p.primary, name)
	return n
}

// placeNew finds a home for every wanted address no slice keeps: the addresses shed by full
// slices first (with the content they had), then the new ones in address order.
func (p *planner) placeNew(desired []*apinetworkingv1.WorkloadEntry) {
	var fresh []*apinetworkingv1.WorkloadEntry
	for _, e := range desired {
		if _, ok := p.placed[e.Address]; !ok {
			fresh = append(fresh, e)
		}
	}
	slices.SortFunc(fresh, byAddress)
	pending := append(slices.Clone(p.moving), fresh...)
	moved := make(map[string]bool, len(p.moving))
	for _, e := range p.moving {
		moved[e.Address] = true
	}
	for len(pending) > 0 {
		s := p.home(len(pending))
		room := p.max - s.size()
		take := pending[:min(room, len(pending))]
		pending = pending[len(take):]
		for _, e := range take {
			p.put(s, e, moved[e.Address])
		}
	}
}

// home picks the slice the next of n unplaced addresses go to: a slice already being written
// that has room (no extra write), else the existing slice with most room if all n fit in it
// (one write instead of a new object), else a new slice at the lowest free number. A slice that
// sheds addresses takes none: its write must come after theirs have landed elsewhere.
func (p *planner) home(n int) *plannedSlice {
	var best *plannedSlice
	for _, s := range p.ordered() {
		if s.sheds || s.size() >= p.max {
			continue
		}
		if s.changed {
			return s
		}
		if best == nil || p.max-s.size() > p.max-best.size() {
			best = s
		}
	}
	if best != nil && p.max-best.size() >= n {
		return best
	}
	if best != nil && n > p.max {
		return best // more than a new slice holds anyway: fill what exists first
	}
	for i := 1; ; i++ {
		name := SliceName(p.primary, i)
		if p.slices[name] == nil {
			s := &plannedSlice{index: i, kept: map[string]*apinetworkingv1.WorkloadEntry{}, changed: true}
			p.slices[name] = s
			return s
		}
	}
}

// put places e in s; a moved address keeps its current content until its old slice has let it
// go.
func (p *planner) put(s *plannedSlice, e *apinetworkingv1.WorkloadEntry, moved bool) {
	s.kept[e.Address] = p.want[e.Address]
	s.changed = true
	if moved {
		if s.gets == nil {
			s.gets = map[string]*apinetworkingv1.WorkloadEntry{}
		}
		s.gets[e.Address] = e
	}
	p.placed[e.Address] = SliceName(p.primary, s.index)
}

// merge empties the sparsest slice other than the primary into the others, when the Service
// has more slices than it needs and that slice is a quarter full or less, provided none of its
// endpoints changes content in this plan (so each moves with the one content it has).
func (p *planner) merge(total int) {
	needed := max(1, (total+p.max-1)/p.max)
	var occupied int
	var source *plannedSlice
	for _, s := range p.ordered() {
		if s.size() == 0 {
			continue
		}
		occupied++
		if s.index == 0 || s.sheds || s.gets != nil || s.size() > p.max/4 {
			continue
		}
		if source == nil || s.size() < source.size() {
			source = s
		}
	}
	if source == nil || occupied <= needed || !p.changing() {
		return // a plan with nothing else to write never writes only to rebalance
	}
	oldContent := map[string]*apinetworkingv1.WorkloadEntry{}
	for _, e := range source.before {
		oldContent[e.Address] = e
	}
	room := 0
	for _, s := range p.ordered() {
		if s != source && !s.sheds {
			room += max(0, p.max-s.size())
		}
	}
	if room < source.size() {
		return
	}
	for _, w := range source.kept {
		if old := oldContent[w.Address]; old == nil || !proto.Equal(old, w) {
			return
		}
	}
	movers := sortedEntries(source.kept)
	source.kept = map[string]*apinetworkingv1.WorkloadEntry{}
	source.changed, source.sheds = true, true
	for len(movers) > 0 {
		var dest *plannedSlice
		for _, s := range p.ordered() {
			if s == source || s.sheds || s.size() >= p.max {
				continue
			}
			if dest == nil || (s.changed && !dest.changed) || (s.changed == dest.changed && s.size() > dest.size()) {
				dest = s // a slice being written anyway, else the fullest: fewest writes, densest slices
			}
		}
		take := movers[:min(p.max-dest.size(), len(movers))]
		movers = movers[len(take):]
		for _, e := range take {
			p.put(dest, e, true)
		}
	}
}

// plan orders the writes: slices that take moved addresses (with the content they had), then
// every other changed slice, then the moved addresses' new content, then the deletes.
func (p *planner) plan() SlicePlan {
	out := SlicePlan{Slices: map[string][]*apinetworkingv1.WorkloadEntry{}}
	var homes, rest, after []SliceWrite
	for _, s := range p.ordered() {
		name := SliceName(p.primary, s.index)
		if s.size() == 0 && s.index != 0 {
			if s.exists {
				out.Deletes = append(out.Deletes, name)
			}
			continue
		}
		final := sortedEntries(s.kept)
		out.Slices[name] = final
		if !s.changed || (s.exists && slices.EqualFunc(s.before, final, entriesEqual)) {
			continue
		}
		if s.gets == nil {
			rest = append(rest, SliceWrite{Name: name, Endpoints: final})
			continue
		}
		first := make([]*apinetworkingv1.WorkloadEntry, len(final))
		differs := false
		for i, e := range final {
			first[i] = e
			if old, ok := s.gets[e.Address]; ok {
				first[i] = old
				differs = differs || !proto.Equal(old, e)
			}
		}
		homes = append(homes, SliceWrite{Name: name, Endpoints: first})
		if differs {
			after = append(after, SliceWrite{Name: name, Endpoints: final})
		}
	}
	out.Writes = append(append(homes, rest...), after...)
	return out
}

// ordered lists the slices by number.
func (p *planner) ordered() []*plannedSlice {
	out := make([]*plannedSlice, 0, len(p.slices))
	for _, s := range p.slices {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *plannedSlice) int { return cmp.Compare(a.index, b.index) })
	return out
}

// changing reports whether the plan writes or deletes anything.
func (p *planner) changing() bool {
	for _, s := range p.slices {
		if s.changed {
			return true
		}
	}
	return false
}

func (s *plannedSlice) size() int { return len(s.kept) }

func sortedEntries(m map[string]*apinetworkingv1.WorkloadEntry) []*apinetworkingv1.WorkloadEntry {
	out := make([]*apinetworkingv1.WorkloadEntry, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, byAddress)
	return out
}

func byAddress(a, b *apinetworkingv1.WorkloadEntry) int { return strings.Compare(a.Address, b.Address) }

func entriesEqual(a, b *apinetworkingv1.WorkloadEntry) bool { return proto.Equal(a, b) }

// SliceSpec is the spec of one slice of whole (the Service's ServiceEntry with all endpoints):
// the same host, addresses, ports, location, resolution and exportTo, with endpoints of its own.
// A slice with other ports than the others would lose its weights on the ports it lacks
// (test/istiod), so every slice is cut from the one spec.
func SliceSpec(whole *apinetworkingv1.ServiceEntry, endpoints []*apinetworkingv1.WorkloadEntry) *apinetworkingv1.ServiceEntry {
	// Built field by field rather than cloned: a clone would copy every endpoint of whole once
	// per slice. TestSliceSpec_EverySliceCarriesTheWholeSpec fails if a field is left out here.
	head := &apinetworkingv1.ServiceEntry{
		Hosts: whole.Hosts, Addresses: whole.Addresses, Ports: whole.Ports, Location: whole.Location,
		Resolution: whole.Resolution, ExportTo: whole.ExportTo, SubjectAltNames: whole.SubjectAltNames,
		WorkloadSelector: whole.WorkloadSelector,
	}
	out := proto.Clone(head).(*apinetworkingv1.ServiceEntry)
	out.Endpoints = endpoints
	return out
}
