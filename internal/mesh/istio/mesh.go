package istio

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Mesh is what the operator knows of the mesh around the Service, gathered from istiod's
// namespace: its mesh config, its version, the clusters it reads, the cluster's network. The
// ServiceEntry depends on it (its visibility, its endpoints' network), and whether a
// ServiceEntry may be written at all does (several clusters, ambient mode on an old istiod).
type Mesh struct {
	// DefaultServiceExportTo is the mesh config's: where a Service, or a ServiceEntry, without
	// exportTo is visible (istiod applies it to both). Unset means every namespace.
	DefaultServiceExportTo []string
	// Network is the cluster's network (the topology.istio.io/network label of istiod's
	// namespace): the network of every pod without a label of its own.
	Network string
	// IstioVersion is the lowest version of istiod found in the cluster, such as "1.29.2"; ""
	// when unknown.
	IstioVersion string
	// MultiCluster lists what shows that the mesh spans several clusters (istiod's own count of
	// its remote clusters, mesh networks fed by other registries, the operator told so); empty
	// for a mesh of this cluster only. See JudgeClusters.
	MultiCluster []string
	// ClustersUnknown says why the operator cannot tell whether the mesh spans several clusters
	// ("" when it can): every Service is then refused, as for several.
	ClustersUnknown string
	// SingleCluster says what shows that the mesh is this cluster alone, for the status.
	SingleCluster string
}

// ErrMultiCluster marks a mesh that spans several clusters: the weights cannot keep the split
// between the clusters (see checkMultiCluster).
var ErrMultiCluster = errors.New("multi-cluster mesh")

// ErrMeshConfig marks mesh config the operator cannot read.
var ErrMeshConfig = errors.New("unreadable mesh config")

// MeshConfig is the part of istiod's mesh config the operator reads.
type MeshConfig struct {
	DefaultServiceExportTo []string `json:"defaultServiceExportTo,omitempty"`
}

// ParseMeshConfig reads the mesh config as istiod's ConfigMap holds it (its "mesh" key, YAML).
// Fields the operator does not read are ignored.
func ParseMeshConfig(text string) (MeshConfig, error) {
	var out MeshConfig
	if err := yaml.Unmarshal([]byte(text), &out); err != nil {
		return MeshConfig{}, fmt.Errorf("%w: %v", ErrMeshConfig, err)
	}
	return out, nil
}

// meshNetworks is the part of istiod's mesh networks (its ConfigMap's "meshNetworks" key) the
// operator reads: which registries (clusters) feed which network.
type meshNetworks struct {
	Networks map[string]struct {
		Endpoints []struct {
			FromRegistry string `json:"fromRegistry,omitempty"`
			FromCidr     string `json:"fromCidr,omitempty"`
		} `json:"endpoints,omitempty"`
	} `json:"networks,omitempty"`
}

// meshNetworksRegistries lists, sorted, the registries (clusters) that feed the mesh networks of
// istiod's meshNetworks YAML ("" for none).
func meshNetworksRegistries(networks string) ([]string, error) {
	var parsed meshNetworks
	if err := yaml.Unmarshal([]byte(networks), &parsed); err != nil {
		return nil, fmt.Errorf("%w: meshNetworks: %v", ErrMeshConfig, err)
	}
	var registries []string
	for _, n := range parsed.Networks {
		for _, ep := range n.Endpoints {
			if ep.FromRegistry != "" && !slices.Contains(registries, ep.FromRegistry) {
				registries = append(registries, ep.FromRegistry)
			}
		}
	}
	sort.Strings(registries)
	return registries, nil
}

// checkMultiCluster refuses a mesh of several clusters. istiod lists the other clusters' pods of
// the host in the same LocalityLbEndpoints as the local ones, at weight 1 (or, across networks,
// as their east-west gateway weighted by their count): the weights the operator writes for the
// local pods would also decide how much traffic stays in this cluster (with 4 local pods
// weighted 100/300/50/10 and 3 remote ones, 99.4% instead of 57.1%). Only an all-equal weight
// keeps the split, which weights nothing (test/istiod TestServiceEntryInMultiClusterMesh).
// A mesh the operator cannot tell from one of several clusters is refused the same way: the
// evidence of one cluster is istiod's own count, and without it a ServiceEntry may be the
// weighted copy of a Service that also runs elsewhere.
func checkMultiCluster(in Input) error {
	switch {
	case len(in.Mesh.MultiCluster) > 0:
		return fmt.Errorf("%w: the mesh spans several clusters (%s); istiod merges the other clusters' pods of %s beside the ServiceEntry's weighted copies at weight 1, so the weights would also move traffic between the clusters. adaptive-lb weights Services of single-cluster meshes only",
			ErrMultiCluster, strings.Join(in.Mesh.MultiCluster, "; "), Host(in.Service, in.ClusterDomain))
	case in.Mesh.ClustersUnknown != "":
		return fmt.Errorf("%w: adaptive-lb cannot tell whether the mesh spans several clusters: %s. If it did, istiod would merge the other clusters' pods of %s beside the ServiceEntry's weighted copies and the weights would also move traffic between the clusters, so no ServiceEntry is written. Have the TSDB scrape istiod's metrics (its istiod_managed_clusters gauge, port 15014), or, if the mesh is this cluster alone, set --mesh-multi-cluster=false (chart: mesh.multiCluster: false)",
			ErrMultiCluster, in.Mesh.ClustersUnknown, Host(in.Service, in.ClusterDomain))
	}
	return nil
}
