package controller

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// The operator's own record of what it applied, kept on each ServiceEntry it writes and written
// in the same write as the weights: what the mirror and the weight cycle hand each other, and a
// new leader takes over, is in the API object, never only in a process's memory.
const (
	// AppliedWeightsAnnotation records the weight the operator applied to each pod, as
	// "pod=weight" entries separated by commas, in pod-name order. The mirror keeps these weights
	// across membership changes and puts them back over a weight anyone else edited; a pod the
	// record does not name (a new pod, also one that took over a departed pod's address) is
	// weighted as new. A ServiceEntry written before the record existed gets it with its next
	// write; until then its weights are read by address.
	AppliedWeightsAnnotation = "adaptivelb.io/applied-weights"
	// ReplannedAtAnnotation is when the mirror last wrote weights it re-planned for the endpoints
	// that stayed when others left (RFC 3339, UTC). The weight cycle counts it as a weight change
	// for its metrics window, and does not write a plan made before it over it.
	ReplannedAtAnnotation = "adaptivelb.io/replanned-at"
)

// appliedWeights are the weights the operator applied, by pod name.
type appliedWeights map[string]uint32

// readApplied returns the record of se, or false when it has none (or one that does not parse:
// then the weights are read by address, as for a ServiceEntry older than the record).
func readApplied(se *networkingv1.ServiceEntry) (appliedWeights, bool) {
	raw, ok := se.GetAnnotations()[AppliedWeightsAnnotation]
	if !ok {
		return nil, false
	}
	out := appliedWeights{}
	if raw == "" {
		return out, true
	}
	for _, entry := range strings.Split(raw, ",") {
		pod, w, ok := strings.Cut(entry, "=")
		weight, err := strconv.ParseUint(w, 10, 32)
		if !ok || pod == "" || err != nil || weight == 0 {
			return nil, false
		}
		out[pod] = uint32(weight)
	}
	return out, true
}

// String is the annotation's value: the same weights always give the same text, so an unchanged
// record costs no write.
func (a appliedWeights) String() string {
	var b strings.Builder
	for i, pod := range slices.Sorted(maps.Keys(a)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(pod)
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(uint64(a[pod]), 10))
	}
	return b.String()
}

// appliedOf is the record of the endpoints the mirror writes. A pod listed at two addresses
// (dual-stack) has one weight in the mirror's build.
func appliedOf(eps []istio.Endpoint) appliedWeights {
	out := make(appliedWeights, len(eps))
	for _, e := range eps {
		out[e.Pod] = e.Weight
	}
	return out
}

// recordBytes bounds the size of the record of pods, for the ServiceEntry's size check: each
// entry is the pod's name, "=", at most 10 digits and a comma.
func recordBytes[V any](pods map[string]V) int {
	n := len(ReplannedAtAnnotation) + len(time.RFC3339Nano) + len(AppliedWeightsAnnotation)
	for name := range pods {
		n += len(name) + 12
	}
	return n
}

// recordCurrent reports whether se carries the record want: a ServiceEntry without any record
// (written by an operator older than it) gets it with its next write, not a write of its own,
// which at an upgrade would rewrite every ServiceEntry at once.
func recordCurrent(se *networkingv1.ServiceEntry, want appliedWeights) bool {
	got, ok := se.GetAnnotations()[AppliedWeightsAnnotation]
	return !ok || got == want.String()
}

// replannedAt is the ServiceEntry's ReplannedAtAnnotation; zero when it has none.
func replannedAt(se *networkingv1.ServiceEntry) time.Time {
	t, err := time.Parse(time.RFC3339Nano, se.GetAnnotations()[ReplannedAtAnnotation])
	if err != nil {
		return time.Time{}
	}
	return t
}

// formatReplannedAt is the value of ReplannedAtAnnotation for t.
func formatReplannedAt(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// setAnnotation sets one annotation of se.
func setAnnotation(se *networkingv1.ServiceEntry, key, value string) {
	if se.Annotations == nil {
		se.Annotations = map[string]string{}
	}
	se.Annotations[key] = value
}
