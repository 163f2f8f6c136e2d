package istio

import (
	"errors"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestConflicts(t *testing.T) {
	const host = "web.shop.svc.cluster.local"
	for name, tc := range map[string]struct {
		exportTo []string
		mesh     Mesh
		other    OtherServiceEntry
		conflict bool
	}{
		"same host, same namespace, both everywhere": {
			other: OtherServiceEntry{Namespace: "shop", Name: "legacy", Hosts: []string{host}}, conflict: true},
		"same host in another case": {
			other: OtherServiceEntry{Namespace: "shop", Name: "legacy", Hosts: []string{strings.ToUpper(host)}}, conflict: true},
		"same host in another namespace, exported everywhere": {
			other: OtherServiceEntry{Namespace: "legacy", Name: "web", Hosts: []string{host}}, conflict: true},
		"same host in another namespace, exported to its own only, ours to ours only": {
			exportTo: []string{"."},
			other:    OtherServiceEntry{Namespace: "legacy", Name: "web", Hosts: []string{host}, ExportTo: []string{"."}}},
		"same host, exported to a namespace ours reaches": {
			exportTo: []string{".", "client"},
			other:    OtherServiceEntry{Namespace: "legacy", Name: "web", Hosts: []string{host}, ExportTo: []string{"client"}}, conflict: true},
		"same host, exported nowhere": {
			other: OtherServiceEntry{Namespace: "shop", Name: "legacy", Hosts: []string{host}, ExportTo: []string{"~"}}},
		"another host": {
			other: OtherServiceEntry{Namespace: "shop", Name: "other", Hosts: []string{"api.shop.svc.cluster.local"}}},
		"a wildcard host is another service": {
			other: OtherServiceEntry{Namespace: "shop", Name: "wild", Hosts: []string{"*.shop.svc.cluster.local"}}},
		"the mesh's default keeps theirs in their namespace": {
			exportTo: []string{"."}, mesh: Mesh{DefaultServiceExportTo: []string{"."}},
			other: OtherServiceEntry{Namespace: "legacy", Name: "web", Hosts: []string{host}}},
	} {
		t.Run(name, func(t *testing.T) {
			got := Conflicts(service(), "cluster.local", tc.exportTo, tc.mesh, []OtherServiceEntry{tc.other})
			want := []string(nil)
			if tc.conflict {
				want = []string{tc.other.Namespace + "/" + tc.other.Name}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("conflicts %v, want %v", got, want)
			}
		})
	}
}

func TestBuild_RefusesAHostAnotherServiceEntryDeclares(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
	in.Others = []OtherServiceEntry{{Namespace: "shop", Name: "web-weights", Hosts: []string{"web.shop.svc.cluster.local"}}}
	_, _, err := Build(in)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "shop/web-weights") || !strings.Contains(err.Error(), "Delete it") {
		t.Fatalf("err = %v, want ErrConflict naming shop/web-weights and the fix", err)
	}
}
