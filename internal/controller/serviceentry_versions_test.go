package controller

import (
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
