package istio

import (
	"errors"
	"reflect"
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
	in.Mesh.MultiCluster = []string{"istiod istio-system/istiod-7d9f reads 2 remote clusters (istiod_managed_clusters in the TSDB)"}
	_, _, err := Build(in)
	if !errors.Is(err, ErrMultiCluster) || !strings.Contains(err.Error(), "istiod istio-system/istiod-7d9f reads 2 remote clusters") {
		t.Fatalf("err = %v, want ErrMultiCluster naming the evidence", err)
	}
}

func TestBuild_RefusesAMeshItCannotTellFromSeveralClusters(t *testing.T) {
	in := input(slice("s", discoveryv1.AddressTypeIPv4, endpoint("web-a", "10.0.0.1", "z")))
	in.Mesh.ClustersUnknown = "the TSDB has no istiod_managed_clusters series for istiod"
	_, _, err := Build(in)
	for _, want := range []string{"cannot tell whether the mesh spans several clusters: the TSDB has no istiod_managed_clusters series for istiod", "--mesh-multi-cluster=false", "mesh.multiCluster: false"} {
		if !errors.Is(err, ErrMultiCluster) || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want ErrMultiCluster saying %q", err, want)
		}
	}
}

func TestJudgeClusters(t *testing.T) {
	const twoRegistries = `
networks:
  network-1: {endpoints: [{fromRegistry: east}]}
  network-2: {endpoints: [{fromRegistry: west}, {fromCidr: 10.9.0.0/16}]}`
	const oneRegistry = `
networks:
  network-1:
    endpoints: [{fromRegistry: cluster-1}]
    gateways: [{address: 192.0.2.1, port: 15443}]`
	single := RemoteClusterReport{ByIstiod: map[string]float64{"istio-system/istiod-7d9f": 0, "istio-system/istiod-canary-5c2b": 0}}
	unscraped := RemoteClusterReport{Unknown: "the TSDB has no istiod_managed_clusters series for istiod in istio-system"}
	for name, tc := range map[string]struct {
		mode     MultiClusterMode
		networks string
		remote   RemoteClusterReport
		want     Clusters
	}{
		"every istiod reads no remote cluster: one cluster": {mode: MultiClusterAuto, networks: oneRegistry, remote: single,
			want: Clusters{One: `istiod reads no remote cluster (istiod_managed_clusters{cluster_type="remote"} is 0 for istio-system/istiod-7d9f, istio-system/istiod-canary-5c2b in the TSDB)`}},
		"one istiod reads remote clusters: several": {mode: MultiClusterAuto, remote: RemoteClusterReport{ByIstiod: map[string]float64{"istio-system/istiod-7d9f": 0, "istio-system/istiod-canary-5c2b": 2}},
			want: Clusters{Several: []string{"istiod istio-system/istiod-canary-5c2b reads 2 remote clusters (istiod_managed_clusters in the TSDB)"}}},
		"meshNetworks fed by two registries: several, whatever istiod's count": {mode: MultiClusterAuto, networks: twoRegistries, remote: single,
			want: Clusters{Several: []string{"meshNetworks registries east, west"}}},
		"the TSDB cannot say: unknown": {mode: MultiClusterAuto, remote: unscraped,
			want: Clusters{Unknown: "the TSDB has no istiod_managed_clusters series for istiod in istio-system"}},
		"nothing read yet: unknown": {mode: MultiClusterAuto,
			want: Clusters{Unknown: "istiod's count of its remote clusters has not been read"}},
		"told single-cluster: one cluster without istiod's count": {mode: MultiClusterFalse, remote: unscraped,
			want: Clusters{One: "the operator is told so (--mesh-multi-cluster=false, chart: mesh.multiCluster)"}},
		"told single-cluster, meshNetworks says otherwise: several": {mode: MultiClusterFalse, networks: twoRegistries,
			want: Clusters{Several: []string{"meshNetworks registries east, west"}}},
		"told several clusters: several, whatever istiod's count": {mode: MultiClusterTrue, remote: single,
			want: Clusters{Several: []string{"the operator is told so (--mesh-multi-cluster=true, chart: mesh.multiCluster)"}}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := JudgeClusters(tc.mode, tc.networks, tc.remote)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("verdict\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if _, err := JudgeClusters(MultiClusterAuto, "networks: [not a map", RemoteClusterReport{}); !errors.Is(err, ErrMeshConfig) {
		t.Fatalf("broken meshNetworks: err = %v, want ErrMeshConfig", err)
	}
}

func TestParseMultiClusterMode(t *testing.T) {
	for in, want := range map[string]MultiClusterMode{"": MultiClusterAuto, "auto": MultiClusterAuto, "true": MultiClusterTrue, "false": MultiClusterFalse} {
		if got, err := ParseMultiClusterMode(in); err != nil || got != want {
			t.Errorf("ParseMultiClusterMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMultiClusterMode("yes"); err == nil || !strings.Contains(err.Error(), "want auto, true or false") {
		t.Errorf("ParseMultiClusterMode(yes): %v", err)
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
