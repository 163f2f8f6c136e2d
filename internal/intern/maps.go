// Package intern shares equal string maps between the objects of the operator's cache.
//
// Every pod decoded from the API server carries its own labels map, although the replicas of a
// Deployment carry the same labels; and the cache transform gives every pod the same two derived
// annotations. Go stores even a two-entry map in about 300 bytes plus its strings, so at 200,000
// pods one map per pod is tens of megabytes that a few thousand shared maps hold as well.
//
// A shared map must never be written: the operator's cache is read-only (readers get deep copies,
// or promise not to write with UnsafeDisableDeepCopy), which is what makes sharing safe there.
package intern

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// DefaultMapLimit bounds a Maps table: about as many distinct label sets as ReplicaSets in a
// 200,000-pod cluster, at well under 1 KB each.
const DefaultMapLimit = 16384

// Maps hands out one shared map per distinct content. It holds at most limit maps: when full it
// starts afresh, so maps of objects long gone (a rolled-out ReplicaSet's labels) are not kept
// forever, at the price of sharing less until it fills again. Safe for concurrent use.
type Maps struct {
	limit int
	mu    sync.Mutex
	byKey map[string]map[string]string
}

// NewMaps returns a table of at most limit maps (DefaultMapLimit when limit < 1).
func NewMaps(limit int) *Maps {
	if limit < 1 {
		limit = DefaultMapLimit
	}
	return &Maps{limit: limit}
}

// Of returns a map equal to m, shared with every other caller that passed an equal map since the
// table last started afresh. The caller must not write to m afterwards, nor to the map returned.
// A nil or empty m is returned as it is.
func (t *Maps) Of(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	key := keyOf(m)
	t.mu.Lock()
	defer t.mu.Unlock()
	if shared, ok := t.byKey[key]; ok {
		return shared
	}
	if t.byKey == nil || len(t.byKey) >= t.limit {
		t.byKey = make(map[string]map[string]string)
	}
	t.byKey[key] = m
	return m
}

// Len is the number of maps the table holds now.
func (t *Maps) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// keyOf encodes m unambiguously (lengths before contents, keys sorted), whatever its keys and
// values contain.
func keyOf(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		v := m[k]
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	return b.String()
}
