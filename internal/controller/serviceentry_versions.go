package controller

import (
	"slices"
	"sync"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// ServiceEntryVersions remembers, per ServiceEntry, the newest version the operator has seen
// from the API server itself: the answer to its own last write, or a live read after a conflict.
//
// Under endpoint churn the informer cache lags the operator's own writes by about one write.
// Basing the next write on the remembered version instead gives it the right resourceVersion, so
// membership writes are plain optimistic updates that neither conflict with the operator's own
// previous write nor silently drop a weight written since the cache was filled. An update is
// also markedly cheaper for the API server than a merge patch of a custom resource, and the
// API server's CPU bounds the propagation delay under churn (see docs/benchmarks.md). The mirror
// and the weight cycle share one, so that neither bases a write on a version the other has
// already replaced.
type ServiceEntryVersions struct {
	m sync.Map // client.ObjectKey → *rememberedVersion (never mutated once stored)
	// gone are the objects the operator deleted, by key, their UID: until the informer reports
	// the deletion, the cache still shows them, and a slice the operator deleted must not be
	// taken for one that holds its endpoints.
	gone sync.Map // client.ObjectKey → types.UID
}

// rememberedVersion is the newest version of one ServiceEntry and the resourceVersions of the
// same object it superseded through the operator's own writes, newest last.
type rememberedVersion struct {
	se         *networkingv1.ServiceEntry
	superseded []string
}

// maxSuperseded bounds the history kept per ServiceEntry: an informer that lags by more of the
// operator's own writes than this is treated as showing someone else's edit, which costs one
// read of that object from the API server, never a wrong write.
const maxSuperseded = 16

func (v *ServiceEntryVersions) load(key client.ObjectKey) (*rememberedVersion, bool) {
	got, ok := v.m.Load(key)
	if !ok {
		return nil, false
	}
	return got.(*rememberedVersion), true
}

// remember records se as the newest version: created by the operator.
func (v *ServiceEntryVersions) remember(se *networkingv1.ServiceEntry) {
	v.rememberWrite(se, nil)
}

// snapshot is what is remembered of key now, for rememberRead.
func (v *ServiceEntryVersions) snapshot(key client.ObjectKey) any {
	got, _ := v.m.Load(key)
	return got
}

// rememberRead records se, just read from the API server, as the newest version unless what is
// remembered changed since before (snapshot, taken before the read): the weight cycle may have
// written a newer version meanwhile, which an older read must not replace.
func (v *ServiceEntryVersions) rememberRead(se *networkingv1.ServiceEntry, before any) {
	key := client.ObjectKeyFromObject(se)
	next := v.next(se, nil)
	if before == nil {
		v.m.LoadOrStore(key, next)
		return
	}
	v.m.CompareAndSwap(key, before, next)
}

// forgetIf forgets key's version if it is still resourceVersion rv: a write based on rv
// conflicted, and a newer version the other writer remembered since stays.
func (v *ServiceEntryVersions) forgetIf(key client.ObjectKey, rv string) {
	if got, ok := v.m.Load(key); ok && got.(*rememberedVersion).se.ResourceVersion == rv {
		v.m.CompareAndDelete(key, got)
	}
}

// forgetDeletedByOperator forgets se, which the operator has just deleted (or found gone), and
// remembers that it is gone until the informer reports the deletion (forgetDeleted).
func (v *ServiceEntryVersions) forgetDeletedByOperator(se *networkingv1.ServiceEntry) {
	key := client.ObjectKeyFromObject(se)
	v.m.Delete(key)
	v.gone.Store(key, se.UID)
}

// deleted reports whether se is an object the operator deleted, which the cache still shows.
func (v *ServiceEntryVersions) deleted(se client.Object) bool {
	uid, ok := v.gone.Load(client.ObjectKeyFromObject(se))
	return ok && uid.(types.UID) == se.GetUID()
}

// rememberWrite records written, the API server's answer to the operator's write based on base
// (nil for a create or a read): the versions it superseded, base's and the one remembered
// before, are the operator's own, so an informer still showing one of them lags (lagging).
func (v *ServiceEntryVersions) rememberWrite(written, base *networkingv1.ServiceEntry) {
	v.m.Store(client.ObjectKeyFromObject(written), v.next(written, base))
}

// next is the entry recording written (superseding base, which may be nil) after what is
// remembered now.
func (v *ServiceEntryVersions) next(written, base *networkingv1.ServiceEntry) *rememberedVersion {
	key := client.ObjectKeyFromObject(written)
	next := &rememberedVersion{se: written.DeepCopy()}
	if prev, ok := v.load(key); ok && prev.se.UID == written.UID {
		next.superseded = append(next.superseded, prev.superseded...)
		if prev.se.ResourceVersion != written.ResourceVersion {
			next.superseded = append(next.superseded, prev.se.ResourceVersion)
		}
	}
	if base != nil && base.UID == written.UID && base.ResourceVersion != written.ResourceVersion && !slices.Contains(next.superseded, base.ResourceVersion) {
		next.superseded = append(next.superseded, base.ResourceVersion)
	}
	if n := len(next.superseded); n > maxSuperseded {
		next.superseded = slices.Clone(next.superseded[n-maxSuperseded:])
	}
	return next
}

// lagging reports whether cached, the informer's version of a ServiceEntry, is one the
// operator's own writes have since superseded: the cache is behind, and the remembered version
// is the newest the API server has. Any other version differing from the remembered one is
// someone else's write (or a write the operator did not see answered).
func (v *ServiceEntryVersions) lagging(cached *networkingv1.ServiceEntry) bool {
	got, ok := v.load(client.ObjectKeyFromObject(cached))
	return ok && got.se.UID == cached.UID && slices.Contains(got.superseded, cached.ResourceVersion)
}

func (v *ServiceEntryVersions) forget(key client.ObjectKey) {
	v.m.Delete(key)
}

// forgetDeleted drops the remembered version if it is of the deleted object, not of one the
// operator has created since under the same name.
func (v *ServiceEntryVersions) forgetDeleted(deleted client.Object) {
	key := client.ObjectKeyFromObject(deleted)
	if got, ok := v.m.Load(key); ok && got.(*rememberedVersion).se.UID == deleted.GetUID() {
		v.m.CompareAndDelete(key, got)
	}
	v.gone.CompareAndDelete(key, deleted.GetUID())
}

// newest returns the version to base a write on: the remembered one unless the cache holds a
// different object (deleted and re-created by someone else) or nothing is remembered. The
// result is the caller's to modify. cached may be nil (not in the cache yet). A remembered
// version that someone else has since changed makes the write conflict, and the caller reads
// the object live and retries.
func (v *ServiceEntryVersions) newest(key client.ObjectKey, cached *networkingv1.ServiceEntry) *networkingv1.ServiceEntry {
	got, ok := v.load(key)
	if !ok {
		return cached
	}
	remembered := got.se
	if cached != nil && cached.UID != remembered.UID {
		return cached
	}
	return remembered.DeepCopy()
}

// slicesOf returns copies of the remembered further slices (not the primary) of the Service
// whose first slice is primary in namespace: those the operator created may not be in the
// cache yet.
func (v *ServiceEntryVersions) slicesOf(namespace, primary string) []*networkingv1.ServiceEntry {
	var out []*networkingv1.ServiceEntry
	v.m.Range(func(k, got any) bool {
		key := k.(client.ObjectKey)
		if n, ok := istio.SliceIndex(primary, key.Name); ok && n > 0 && key.Namespace == namespace {
			out = append(out, got.(*rememberedVersion).se.DeepCopy())
		}
		return true
	})
	return out
}

// known reports whether resourceVersion rv of the ServiceEntry is the remembered one: its watch
// event then carries nothing the operator has not already acted on.
func (v *ServiceEntryVersions) known(key client.ObjectKey, rv string) bool {
	got, ok := v.load(key)
	return ok && got.se.ResourceVersion == rv
}
