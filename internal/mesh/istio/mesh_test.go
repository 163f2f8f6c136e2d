package istio

import (
	"errors"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestBuild_ExportToFollowsTheMeshDefaults(t *testing.T) {
	for name, tc := range map[string]struct {
		annotation string
		requested  []string
		mesh       Mesh
		want       []string
		refused    bool
	}{
		"the mesh's default hides the Service: spec.exportTo * leaves it unset, taking the same default": {
			requested: []string{"*"}, mesh: Mesh{DefaultServiceExportTo: []string{"."}}, want: nil},
		"the mesh's default hides the Service: spec.exportTo is cut to it": {
			requested: []string{".", "client"}, mesh: Mesh{DefaultServiceExportTo: []string{".", "istio-system"}}, want: []string{"."}},
		"the Service's annotation wins over the mesh's default, written out": {
			annotation: "*", requested: []string{"*"}, mesh: Mesh{DefaultServiceExportTo: []string{"."}}, want: []string{"*"}},
		"the mesh's default and no spec.exportTo: unset, taking the same default as the Service": {
			mesh: Mesh{DefaultServiceExportTo: []string{"."}}, want: nil},
		"every default open leaves exportTo unset, as before": {
			want: nil},
		"a mesh exporting Services nowhere is refused": {
			mesh: Mesh{DefaultServiceExportTo: []string{"~"}}, refused: true},
		"spec.exportTo outside the mesh's default is refused": {
			requested: []string{"other"}, mesh: Mesh{DefaultServiceExportTo: []string{"."}}, refused: true},
	} {
		t.Run(name, func(t *testing.T) {
			in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
			if tc.annotation != "" {
				in.Service.Annotations = map[string]string{ExportToAnnotation: tc.annotation}
			}
			in.ExportTo, in.Mesh = tc.requested, tc.mesh
			spec, _, err := Build(in)
			if tc.refused {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("err = %v, want ErrUnsupported", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(spec.ExportTo, tc.want) {
				t.Fatalf("exportTo %v, want %v", spec.ExportTo, tc.want)
			}
		})
	}
}

func TestBuild_EndpointsCarryThePodsNetwork(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z"), endpoint("web-b", "10.0.0.2", "z")))
	in.Pods["web-b"].Labels[NetworkLabel] = "network-b"
	in.Mesh.Network = "network-1"
	spec, _, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Endpoints[0].Network; got != "network-1" {
		t.Errorf("a pod without a network label: network %q, want the cluster's network-1", got)
	}
	if got := spec.Endpoints[1].Network; got != "network-b" {
		t.Errorf("a pod labelled network-b: network %q, want network-b", got)
	}
}

func TestBuild_RefusesAMultiClusterMesh(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
	in.Mesh.MultiCluster = []string{"remote secret istio-system/istio-remote-secret-west"}
	_, _, err := Build(in)
	if !errors.Is(err, ErrMultiCluster) || !strings.Contains(err.Error(), "istio-remote-secret-west") {
		t.Fatalf("err = %v, want ErrMultiCluster naming the remote secret", err)
	}
}

func TestMultiClusterEvidence(t *testing.T) {
	for name, tc := range map[string]struct {
		secrets  []string
		networks string
		want     []string
	}{
		"one cluster, no networks": {},
		"one network of this cluster's registry": {networks: `
networks:
  network-1:
    endpoints: [{fromRegistry: cluster-1}]
    gateways: [{address: 192.0.2.1, port: 15443}]`},
		"a remote secret": {secrets: []string{"istio-system/istio-remote-secret-west"}, want: []string{"remote secret istio-system/istio-remote-secret-west"}},
		"two registries": {networks: `
networks:
  network-1: {endpoints: [{fromRegistry: east}]}
  network-2: {endpoints: [{fromRegistry: west}, {fromCidr: 10.9.0.0/16}]}`, want: []string{"meshNetworks registries east, west"}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := MultiClusterEvidence(tc.secrets, tc.networks)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("evidence %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := MultiClusterEvidence(nil, "networks: [not a map"); !errors.Is(err, ErrMeshConfig) {
		t.Fatalf("broken meshNetworks: err = %v, want ErrMeshConfig", err)
	}
}

func TestParseMeshConfig(t *testing.T) {
	got, err := ParseMeshConfig(`
accessLogFile: /dev/stdout
defaultServiceExportTo: ["."]
defaultConfig: {discoveryAddress: istiod.istio-system.svc:15012}
`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.DefaultServiceExportTo, []string{"."}) {
		t.Fatalf("parsed %+v", got)
	}
	if _, err := ParseMeshConfig("defaultServiceExportTo: {"); !errors.Is(err, ErrMeshConfig) {
		t.Fatalf("broken mesh config: err = %v, want ErrMeshConfig", err)
	}
}
