package istio

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ErrConflict marks a Service whose host another owner's ServiceEntry also declares.
var ErrConflict = errors.New("another ServiceEntry declares the Service's host")

// OtherServiceEntry is a ServiceEntry the operator does not own, as far as a conflict goes.
type OtherServiceEntry struct {
	Namespace, Name string
	Hosts           []string
	ExportTo        []string
}

// Conflicts returns, sorted as namespace/name, the other owners' ServiceEntries that declare the
// Service's host and are visible to some client that also sees the operator's ServiceEntry
// (exported as exportTo, in the Service's namespace). In the Service's namespace istiod merges
// their endpoints with the operator's, and lists their copy of an address first whatever the
// objects' ages (test/istiod TestServiceEntryChangesOnlyWeights/foreign-serviceentry): the
// operator's weights (and a pod's tlsMode) would be shadowed while the status reported them
// applied. In another namespace, a client sees one of the two services of the host, chosen by
// istiod, so some clients would get the other owner's endpoints only.
func Conflicts(svc *corev1.Service, clusterDomain string, exportTo []string, mesh Mesh, others []OtherServiceEntry) []string {
	host := Host(svc, clusterDomain)
	ours := exportTo
	if len(ours) == 0 {
		ours = seDefault(mesh)
	}
	var out []string
	for _, o := range others {
		if !slices.ContainsFunc(o.Hosts, func(h string) bool { return strings.EqualFold(h, host) }) {
			continue
		}
		theirs := o.ExportTo
		if len(theirs) == 0 {
			theirs = seDefault(mesh)
		}
		if visibleTogether(svc.Namespace, ours, o.Namespace, theirs) {
			out = append(out, o.Namespace+"/"+o.Name)
		}
	}
	sort.Strings(out)
	return out
}

// seDefault is where a ServiceEntry without exportTo is visible.
func seDefault(mesh Mesh) []string {
	if len(mesh.DefaultServiceExportTo) == 0 {
		return []string{"*"}
	}
	return mesh.DefaultServiceExportTo
}

// ConflictError says which ServiceEntries are in the way of the Service, and what to do.
func ConflictError(svc *corev1.Service, clusterDomain string, conflicts []string) error {
	return fmt.Errorf("%w: ServiceEntry %s also declares host %s, visible to the same clients; istiod lists its copies of the pods before the operator's, so the weights would not apply. Delete it (or narrow its exportTo away from the Service's clients) to let adaptive-lb weight Service %s",
		ErrConflict, strings.Join(conflicts, ", "), Host(svc, clusterDomain), svc.Name)
}
