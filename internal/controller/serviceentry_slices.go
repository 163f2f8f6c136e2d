package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// ServiceLabel names, on every slice of a managed ServiceEntry, the Service it mirrors: a
// slice's name (web.1) is not a Service's, and the watchdog finds the Service by this label.
const ServiceLabel = "adaptivelb.io/service"

// serviceEntrySlices are the ServiceEntry slices of one Service that an AdaptiveLoadBalancer
// controls (istio.PlanSlices), by name: the newest version known of each, to base a write on,
// and the informer's, to tell a lagging cache from someone else's edit.
type serviceEntrySlices struct {
	primary string
	newest  map[string]*networkingv1.ServiceEntry
	cached  map[string]*networkingv1.ServiceEntry
}

// sliceReads says where ownedSlices reads a Service's slices from. The zero value: the informer
// cache and the versions this operator wrote (the cache may not list a slice it created a
// moment ago), which is all a reconcile needs, also after a conflict.
type sliceReads struct {
	// listLive lists the slices from the API server: for when the cache itself is what fails
	// (the stale ServiceEntry's removal), never on the mirror's path.
	listLive bool
	// live are slices read from the API server, by name, after a write to them failed (nil: the
	// API server had none of that name): one get per failed slice, the others from the cache.
	// Each is also remembered in Versions, which then follows the operator's writes to it.
	live map[string]*networkingv1.ServiceEntry
}

// ownedSlices gathers the slices of alb's target: primary (its newest version and the cache's,
// either may be nil) and every further slice alb controls, from where reads says.
func (r *AdaptiveLoadBalancerReconciler) ownedSlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, primary, primaryCached *networkingv1.ServiceEntry, reads sliceReads) (serviceEntrySlices, error) {
	name := alb.Spec.TargetRef.Name
	set := serviceEntrySlices{primary: name, newest: map[string]*networkingv1.ServiceEntry{}, cached: map[string]*networkingv1.ServiceEntry{}}
	if primary != nil {
		set.newest[name] = primary
	}
	if primaryCached != nil {
		set.cached[name] = primaryCached
	}
	var items []*networkingv1.ServiceEntry
	if reads.listLive {
		live, err := r.liveSlices(ctx, alb)
		if err != nil {
			return set, err
		}
		items = live
	} else {
		var list networkingv1.ServiceEntryList
		if err := r.List(ctx, &list, client.InNamespace(alb.Namespace), client.MatchingFields{indexServiceEntryController: string(alb.UID)}, client.UnsafeDisableDeepCopy); err != nil {
			return set, fmt.Errorf("list the ServiceEntry slices of AdaptiveLoadBalancer %s/%s: %w", alb.Namespace, alb.Name, err)
		}
		items = list.Items
	}
	for _, se := range items {
		if n, ok := istio.SliceIndex(name, se.Name); !ok || n == 0 || !metav1.IsControlledBy(se, alb) {
			continue
		}
		if !reads.listLive && r.Versions.deleted(se) {
			continue // the operator deleted it; the cache has not seen the deletion yet
		}
		set.cached[se.Name] = se
		if reads.listLive {
			r.Versions.forget(client.ObjectKeyFromObject(se))
			set.newest[se.Name] = se
		} else {
			set.newest[se.Name] = r.Versions.newest(client.ObjectKeyFromObject(se), se)
		}
	}
	if reads.listLive {
		return set, nil
	}
	for _, se := range r.Versions.slicesOf(alb.Namespace, name) {
		if set.newest[se.Name] == nil && metav1.IsControlledBy(se, alb) {
			set.newest[se.Name] = se
		}
	}
	// What was read live stands for the cache's version, which lags or was edited by someone
	// else. The version to write on is the newest known: the operator's own write since the read
	// (a create, or the takeover of an earlier incarnation's slice), else the read itself. One
	// someone else controls is no slice of alb's (sliceTaken decides on it).
	for sliceName, se := range reads.live {
		if sliceName == name {
			continue // the primary came as an argument
		}
		key := types.NamespacedName{Namespace: alb.Namespace, Name: sliceName}
		delete(set.cached, sliceName)
		if se != nil && r.Versions.deleted(se) {
			se = nil // deleted by the operator since the read
		}
		newest := r.Versions.newest(key, se)
		if newest == nil || !metav1.IsControlledBy(newest, alb) {
			delete(set.newest, sliceName)
			continue
		}
		set.newest[sliceName] = newest
		if se != nil && se.UID == newest.UID && metav1.IsControlledBy(se, alb) {
			set.cached[sliceName] = se
		}
	}
	return set, nil
}

// liveSlices reads from the API server the ServiceEntries that may be slices of alb's target:
// those labelled with alb as their owner, those labelled with its target as their Service (a
// slice someone stripped of one label still has the other), and those the cache holds under
// alb's controller reference (stripped of both), each read by name. Which of them alb controls
// is for the caller to check.
func (r *AdaptiveLoadBalancerReconciler) liveSlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer) ([]*networkingv1.ServiceEntry, error) {
	byName := map[string]*networkingv1.ServiceEntry{}
	for _, selector := range []client.MatchingLabels{{ServiceEntryOwnerLabel: alb.Name}, {ServiceLabel: alb.Spec.TargetRef.Name}} {
		var list networkingv1.ServiceEntryList
		if err := r.apiReader.List(ctx, &list, client.InNamespace(alb.Namespace), selector); err != nil {
			return nil, fmt.Errorf("list the ServiceEntry slices of AdaptiveLoadBalancer %s/%s labelled %v: %w", alb.Namespace, alb.Name, selector, err)
		}
		for _, se := range list.Items {
			byName[se.Name] = se
		}
	}
	// The cache may be what fails; what it holds still names slices the labels missed.
	var cached networkingv1.ServiceEntryList
	if err := r.List(ctx, &cached, client.InNamespace(alb.Namespace), client.MatchingFields{indexServiceEntryController: string(alb.UID)}, client.UnsafeDisableDeepCopy); err == nil {
		for _, c := range cached.Items {
			if _, found := byName[c.Name]; found {
				continue
			}
			se := &networkingv1.ServiceEntry{}
			switch err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(c), se); {
			case err == nil:
				byName[se.Name] = se
			case !apierrors.IsNotFound(err):
				return nil, fmt.Errorf("get ServiceEntry %s/%s: %w", c.Namespace, c.Name, err)
			}
		}
	}
	out := make([]*networkingv1.ServiceEntry, 0, len(byName))
	for _, name := range sortedSliceNames(alb.Spec.TargetRef.Name, slices.Collect(maps.Keys(byName))) {
		out = append(out, byName[name])
	}
	return out, nil
}

// sliceWriteError is a failed write (or a refusal to write on a view that disagrees) of one
// slice, named so that a retry reads that slice, and only that one, from the API server.
type sliceWriteError struct {
	name string
	err  error
}

func (e sliceWriteError) Error() string { return e.err.Error() }
func (e sliceWriteError) Unwrap() error { return e.err }

// failedSlice names the slice whose write failed with err, and primary when err names none.
func failedSlice(err error, primary string) string {
	var failed sliceWriteError
	if errors.As(err, &failed) {
		return failed.name
	}
	return primary
}

// names are the slices in number order, the primary first.
func (s serviceEntrySlices) names() []string {
	return sortedSliceNames(s.primary, slices.Collect(maps.Keys(s.newest)))
}

func sortedSliceNames(primary string, names []string) []string {
	slices.SortFunc(names, func(a, b string) int {
		i, _ := istio.SliceIndex(primary, a)
		j, _ := istio.SliceIndex(primary, b)
		return i - j
	})
	return names
}

// view is the union of the slices as one ServiceEntry, for what reads the Service's endpoints
// and the operator's record as a whole (the weights the mirror keeps, the re-plan); nil when
// there is no slice. It shares the slices' endpoints: read only.
func (s serviceEntrySlices) view() *networkingv1.ServiceEntry {
	var list []*networkingv1.ServiceEntry
	for _, name := range s.names() {
		list = append(list, s.newest[name])
	}
	return unionView(list)
}

// unionView is the union of slices (in order) as one ServiceEntry: every endpoint, the records
// of applied weights merged (none when a slice has none: then the weights are read by address,
// as for a ServiceEntry older than the record), and the latest re-plan.
func unionView(list []*networkingv1.ServiceEntry) *networkingv1.ServiceEntry {
	if len(list) == 0 {
		return nil
	}
	if len(list) == 1 {
		return list[0]
	}
	out := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: list[0].Namespace, Name: list[0].Name, Annotations: map[string]string{}}}
	record, recorded := appliedWeights{}, true
	var latest time.Time
	for _, se := range list {
		out.Spec.Endpoints = append(out.Spec.Endpoints, se.Spec.Endpoints...)
		applied, ok := readApplied(se)
		recorded = recorded && ok
		maps.Copy(record, applied)
		if t := replannedAt(se); t.After(latest) {
			latest = t
		}
	}
	if recorded {
		out.Annotations[AppliedWeightsAnnotation] = record.String()
	}
	if !latest.IsZero() {
		out.Annotations[ReplannedAtAnnotation] = formatReplannedAt(latest)
	}
	return out
}

// sliceBound is the most endpoints per slice: SliceEndpoints, else istio.MaxSliceEndpoints.
func (r *AdaptiveLoadBalancerReconciler) sliceBound() int {
	if r.SliceEndpoints > 0 {
		return r.SliceEndpoints
	}
	return istio.MaxSliceEndpoints
}

// errForeignSlice: a slice the plan needs exists and belongs to someone else.
type errForeignSlice struct{ se *networkingv1.ServiceEntry }

func (e errForeignSlice) Error() string {
	return fmt.Sprintf("ServiceEntry %s/%s exists and is not owned by this AdaptiveLoadBalancer; adaptive-lb never overwrites it. Rename or delete it to let adaptive-lb manage the Service.", e.se.Namespace, e.se.Name)
}

// writeSlices writes whole (the Service's ServiceEntry with every endpoint) as slices: it
// plans them against the slices there are, checks each against etcd's size limit and that no
// one else owns a name it creates, then writes them in the plan's order (no address is ever in
// no slice, none in two with different weights) and deletes the slices no longer needed. Each
// slice carries its own record of the weights of its own endpoints. It returns the number of
// slices.
func (r *AdaptiveLoadBalancerReconciler) writeSlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, set serviceEntrySlices, whole *apinetworkingv1.ServiceEntry, endpoints []istio.Endpoint, replannedAt time.Time, reads sliceReads, reason string) (int, error) {
	current := make(map[string][]*apinetworkingv1.WorkloadEntry, len(set.newest))
	for name, se := range set.newest {
		current[name] = se.Spec.Endpoints
	}
	plan := istio.PlanSlices(set.primary, current, whole.Endpoints, r.sliceBound())
	podAt := make(map[string]string, len(endpoints))
	for _, e := range endpoints {
		podAt[e.IP] = e.Pod
	}
	want := func(name string, eps []*apinetworkingv1.WorkloadEntry, replanned time.Time) desiredServiceEntry {
		applied := make(appliedWeights, len(eps))
		for _, e := range eps {
			applied[podAt[e.Address]] = e.Weight
		}
		return desiredServiceEntry{name: name, owner: alb.Name, service: alb.Spec.TargetRef.Name, spec: istio.SliceSpec(whole, eps), applied: applied, replannedAt: replanned}
	}

	// Checks before any write: a refusal must not leave half the slices written.
	writes := slices.Clone(plan.Writes)
	planned := map[string]bool{}
	for _, w := range plan.Writes {
		planned[w.Name] = true
	}
	for _, name := range sortedSliceNames(set.primary, slices.Collect(maps.Keys(plan.Slices))) {
		d := want(name, plan.Slices[name], time.Time{})
		newest, cached := set.newest[name], set.cached[name]
		if newest != nil && cached != nil && newest.ResourceVersion != cached.ResourceVersion && !r.Versions.lagging(cached) &&
			r.upToDate(newest, d) && !r.upToDate(cached, d) {
			// Not the cache lagging behind the operator's own writes: someone else's edit.
			return 0, sliceWriteError{name: name, err: errStaleView}
		}
		rewrite := !planned[name] && newest != nil && !r.upToDate(newest, d)
		if rewrite {
			// Same endpoints, but the ports, host, labels or record changed: every slice must
			// carry exactly the Service's ports, or istiod drops the weights on those it lacks.
			writes = append(writes, istio.SliceWrite{Name: name, Endpoints: plan.Slices[name]})
		}
		if planned[name] || rewrite {
			// Only what is written: the others were checked when they were.
			if err := istio.CheckSliceSize(d.spec, recordBytes(d.applied)); err != nil {
				return 0, fmt.Errorf("Service %s/%s, ServiceEntry %s: %w", alb.Namespace, set.primary, name, err)
			}
		}
		if newest == nil && name != set.primary {
			taken, err := r.sliceTaken(ctx, alb, name, reads)
			if err != nil {
				return 0, err
			}
			if taken != nil {
				set.newest[name] = taken // an earlier incarnation's: taken over by the write
			}
		}
	}

	if onlyCreates(writes, set) {
		if err := r.createSlices(ctx, alb, set, writes, func(w istio.SliceWrite) desiredServiceEntry { return want(w.Name, w.Endpoints, replannedAt) }, reason); err != nil {
			return 0, err
		}
	} else {
		for _, w := range writes {
			written, err := r.apply(ctx, alb, set.newest[w.Name], want(w.Name, w.Endpoints, replannedAt), reason)
			if err != nil {
				return 0, sliceWriteError{name: w.Name, err: err}
			}
			set.newest[w.Name] = written
		}
	}
	for _, name := range plan.Deletes {
		se := set.newest[name]
		if _, _, err := r.deleteIfControlled(ctx, alb, se); err != nil {
			return 0, sliceWriteError{name: name, err: err}
		}
		if _, read := reads.live[name]; read {
			reads.live[name] = nil // a retry must not take the read for a slice still there
		}
	}
	return len(plan.Slices), nil
}

// sliceCreates is how many slices of one Service the mirror creates at once.
const sliceCreates = 8

// onlyCreates reports whether every write creates a slice that is not there: a Service's first
// mirror (a new installation, a Service opted in). Its slices then hold disjoint endpoints and
// no order between them matters, so they are created side by side: one after another, a
// 10,000-pod Service's 100 slices at 36 to 46 ms of API-server time each were most of its
// start-up (docs/scaling.md).
func onlyCreates(writes []istio.SliceWrite, set serviceEntrySlices) bool {
	if len(writes) < 2 {
		return false
	}
	for _, w := range writes {
		if set.newest[w.Name] != nil {
			return false
		}
	}
	return true
}

// createSlices creates the slices of writes, sliceCreates at a time, and records each created
// in set. A failure stops the creates not yet started; the first error is returned, naming its
// slice, and the slices created so far stay (the retry writes on them).
func (r *AdaptiveLoadBalancerReconciler) createSlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, set serviceEntrySlices, writes []istio.SliceWrite, want func(istio.SliceWrite) desiredServiceEntry, reason string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	slots := make(chan struct{}, sliceCreates)
	for _, w := range writes {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			written, err := r.apply(ctx, alb, nil, want(w), reason)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = sliceWriteError{name: w.Name, err: err}
					cancel()
				}
				return
			}
			set.newest[w.Name] = written
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// sliceTaken returns the ServiceEntry of name when it exists and an earlier AdaptiveLoadBalancer
// of alb's name owned it (to take over, like the primary), nil when there is none, and
// errForeignSlice when it is someone else's.
func (r *AdaptiveLoadBalancerReconciler) sliceTaken(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, name string, reads sliceReads) (*networkingv1.ServiceEntry, error) {
	key := types.NamespacedName{Namespace: alb.Namespace, Name: name}
	se := &networkingv1.ServiceEntry{}
	var err error
	if read, ok := reads.live[name]; ok {
		if read == nil {
			return nil, nil
		}
		se = read.DeepCopy() // not alb's: ownedSlices would have listed it
	} else if reads.listLive {
		err = r.apiReader.Get(ctx, key, se)
	} else {
		err = r.Get(ctx, key, se)
		if err == nil && r.Versions.deleted(se) {
			return nil, nil // the operator deleted it; the cache lags
		}
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get ServiceEntry %s/%s: %w", key.Namespace, key.Name, err)
	}
	if metav1.IsControlledBy(se, alb) {
		return se, nil
	}
	if previous, err := r.ofAPreviousIncarnation(ctx, alb, se); err != nil {
		return nil, err
	} else if previous {
		return se, nil
	}
	return nil, errForeignSlice{se: se}
}

// deleteSlices deletes every slice of alb's target that alb controls, primary (may be nil)
// included, and reports how many it deleted; why completes the event's message.
func (r *AdaptiveLoadBalancerReconciler) deleteSlices(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, primary *networkingv1.ServiceEntry, reads sliceReads, why string) (int, error) {
	set, err := r.ownedSlices(ctx, alb, primary, nil, reads)
	if err != nil {
		return 0, err
	}
	deleted := 0
	var errs []error
	// The further slices first: the primary, which names the Service, goes last.
	names := set.names()
	slices.Reverse(names)
	for _, name := range names {
		if name == set.primary {
			if err := r.deleteServiceEntry(ctx, alb, set.newest[name], why); err != nil {
				errs = append(errs, err)
			} else if metav1.IsControlledBy(set.newest[name], alb) {
				deleted++
			}
			continue
		}
		if _, gone, err := r.deleteIfControlled(ctx, alb, set.newest[name]); err != nil {
			errs = append(errs, sliceWriteError{name: name, err: err})
		} else if gone {
			deleted++
		}
	}
	return deleted, errors.Join(errs...)
}
