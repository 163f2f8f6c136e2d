package controller

import (
	"strconv"
	"testing"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestServiceEntryVersions_NewestPrefersTheOperatorsOwnLastWrite(t *testing.T) {
	se := func(uid, rv string) *networkingv1.ServiceEntry {
		return &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: types.UID(uid), ResourceVersion: rv}}
	}
	key := client.ObjectKey{Namespace: "ns", Name: "web"}
	var v ServiceEntryVersions

	if got := v.newest(key, se("a", "5")); got.ResourceVersion != "5" {
		t.Fatalf("nothing remembered: want the cached version 5, got %q", got.ResourceVersion)
	}
	if got := v.newest(key, nil); got != nil {
		t.Fatalf("nothing remembered or cached: want nil, got %v", got)
	}

	v.remember(se("a", "7"))
	if got := v.newest(key, se("a", "5")); got.ResourceVersion != "7" {
		t.Fatalf("cache lags the operator's write: want version 7, got %q", got.ResourceVersion)
	}
	if got := v.newest(key, nil); got == nil || got.ResourceVersion != "7" {
		t.Fatalf("cache has not seen the operator's create yet: want version 7, got %v", got)
	}
	if got := v.newest(key, se("b", "9")); got.UID != "b" {
		t.Fatalf("deleted and re-created by someone else: want the cached object, got UID %q", got.UID)
	}
	if !v.known(key, "7") || v.known(key, "8") {
		t.Fatal("known must hold for the remembered resourceVersion only")
	}

	got := v.newest(key, nil)
	got.Labels = map[string]string{"changed": "by caller"}
	if again := v.newest(key, nil); again.Labels != nil {
		t.Fatal("newest must return a copy the caller may modify")
	}

	v.forgetDeleted(se("old", "3"))
	if !v.known(key, "7") {
		t.Fatal("the deletion of an older object of the same name must not drop the remembered version")
	}
	v.forgetDeleted(se("a", "7"))
	if v.known(key, "7") {
		t.Fatal("the deletion of the remembered object must drop it")
	}
	v.remember(se("a", "8"))
	v.forget(key)
	if v.known(key, "8") {
		t.Fatal("forget must drop the remembered version")
	}
}

// The informer lags the operator's own writes: a cached version the operator's writes have
// superseded is lag, any other differing version someone else's edit.
func TestServiceEntryVersions_TellsACacheLaggingBehindOwnWritesFromAForeignEdit(t *testing.T) {
	se := func(uid, rv string) *networkingv1.ServiceEntry {
		return &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web.1", UID: types.UID(uid), ResourceVersion: rv}}
	}
	var v ServiceEntryVersions
	v.remember(se("a", "10"))                     // created
	v.rememberWrite(se("a", "12"), se("a", "10")) // updated on it
	v.rememberWrite(se("a", "15"), se("a", "14")) // updated on a version read from the cache (someone else's 14)
	for _, rv := range []string{"10", "12", "14"} {
		if !v.lagging(se("a", rv)) {
			t.Errorf("cached version %s was superseded by the operator's writes: want lagging", rv)
		}
	}
	for _, c := range []*networkingv1.ServiceEntry{se("a", "13"), se("a", "16"), se("b", "10")} {
		if v.lagging(c) {
			t.Errorf("cached version %s of UID %s is not one the operator superseded: want not lagging", c.ResourceVersion, c.UID)
		}
	}

	// A live read keeps the history: the operator's earlier writes stay superseded.
	v.remember(se("a", "20"))
	if !v.lagging(se("a", "15")) || !v.lagging(se("a", "10")) {
		t.Error("after a live read, the operator's earlier versions must still count as lag")
	}
	// Re-created under the same name: the old object's history does not carry over.
	v.remember(se("b", "30"))
	if v.lagging(se("a", "20")) || v.lagging(se("b", "20")) {
		t.Error("a re-created object must start a history of its own")
	}
	// The history is bounded.
	for i := range 2 * maxSuperseded {
		v.rememberWrite(se("b", strconv.Itoa(100+i+1)), se("b", strconv.Itoa(100+i)))
	}
	if v.lagging(se("b", "100")) || !v.lagging(se("b", strconv.Itoa(100+2*maxSuperseded-1))) {
		t.Error("the history must keep the most recent superseded versions only")
	}
	v.forget(client.ObjectKey{Namespace: "ns", Name: "web.1"})
	if v.lagging(se("b", strconv.Itoa(100+2*maxSuperseded-1))) {
		t.Error("forget must drop the history")
	}
}

// What the mirror read after a conflict does not replace a newer version the weight cycle wrote
// meanwhile; the cycle's conflict does not drop a newer version the mirror remembered; and a
// slice the operator deleted is known as gone until the informer reports the deletion.
func TestServiceEntryVersions_ConcurrentWritersAndDeletionsKeepTheNewest(t *testing.T) {
	se := func(uid, rv string) *networkingv1.ServiceEntry {
		return &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web.2", UID: types.UID(uid), ResourceVersion: rv}}
	}
	key := client.ObjectKey{Namespace: "ns", Name: "web.2"}
	var v ServiceEntryVersions
	v.remember(se("a", "4"))

	before := v.snapshot(key)
	v.rememberWrite(se("a", "6"), se("a", "5")) // the cycle's patch lands while the mirror reads 5
	v.rememberRead(se("a", "5"), before)
	if got := v.newest(key, nil); got.ResourceVersion != "6" {
		t.Fatalf("a read older than the cycle's write replaced it: remembered %s, want 6", got.ResourceVersion)
	}
	before = v.snapshot(key)
	v.rememberRead(se("a", "9"), before) // someone else's 9, read with nothing written since
	if got := v.newest(key, nil); got.ResourceVersion != "9" || !v.lagging(se("a", "6")) {
		t.Fatalf("the live read must be remembered (got %s) and the operator's 6 count as lag", got.ResourceVersion)
	}
	v.forget(key)
	v.rememberRead(se("a", "10"), nil)
	if got := v.newest(key, nil); got.ResourceVersion != "10" {
		t.Fatalf("a read with nothing remembered must be remembered, got %v", got)
	}

	v.forgetIf(key, "9") // the cycle's patch based on 9 conflicts after the mirror remembered 10
	if got := v.newest(key, nil); got == nil || got.ResourceVersion != "10" {
		t.Fatal("the cycle's conflict dropped the mirror's newer version")
	}
	v.forgetIf(key, "10")
	if got := v.newest(key, nil); got != nil {
		t.Fatal("a conflict on the remembered version must forget it")
	}

	v.remember(se("a", "11"))
	v.forgetDeletedByOperator(se("a", "11"))
	if !v.deleted(se("a", "11")) || v.deleted(se("b", "12")) {
		t.Fatal("the deleted object, and only it, must be known as gone")
	}
	if got := v.newest(key, nil); got != nil {
		t.Fatal("a deleted object must not stay remembered")
	}
	v.forgetDeleted(se("a", "11")) // the informer reports the deletion
	if v.deleted(se("a", "11")) {
		t.Fatal("once the informer reports the deletion, nothing more needs remembering")
	}
}
