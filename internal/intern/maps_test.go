package intern

import (
	"reflect"
	"testing"
)

func same(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func TestMaps_Of(t *testing.T) {
	tab := NewMaps(0)
	first := tab.Of(map[string]string{"app": "checkout", "version": "v1"})
	second := tab.Of(map[string]string{"version": "v1", "app": "checkout"})
	if !same(first, second) {
		t.Error("two equal maps are not shared")
	}
	if !reflect.DeepEqual(second, map[string]string{"app": "checkout", "version": "v1"}) {
		t.Errorf("the shared map's content changed: %v", second)
	}
	for name, other := range map[string]map[string]string{
		"a different value":               {"app": "checkout", "version": "v2"},
		"one entry more":                  {"app": "checkout", "version": "v1", "tier": "web"},
		"the separator inside a value":    {"app": "checkout5:version2:v1"},
		"a key and value split elsewhere": {"app": "checkout", "versio": "nv1"},
	} {
		if got := tab.Of(other); same(got, first) || !reflect.DeepEqual(got, other) {
			t.Errorf("%s: got %v, shared with %v", name, got, first)
		}
	}
	if got := tab.Of(nil); got != nil {
		t.Errorf("nil became %v", got)
	}
	if empty := map[string]string{}; !same(tab.Of(empty), empty) || tab.Len() != 5 {
		t.Errorf("an empty map is kept (%d maps held, want 5)", tab.Len())
	}
}

func TestMaps_StartsAfreshWhenFull(t *testing.T) {
	tab := NewMaps(2)
	a := tab.Of(map[string]string{"a": "1"})
	tab.Of(map[string]string{"b": "1"})
	tab.Of(map[string]string{"c": "1"}) // full: the table starts afresh with c
	if tab.Len() != 1 {
		t.Fatalf("holds %d maps after starting afresh, want 1", tab.Len())
	}
	if again := tab.Of(map[string]string{"a": "1"}); same(again, a) || again["a"] != "1" {
		t.Errorf("a map forgotten when the table started afresh is still handed out: %v", again)
	}
}
