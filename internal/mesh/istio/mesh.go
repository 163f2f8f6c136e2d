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
	// MultiCluster lists what shows that the mesh spans several clusters (istiod's remote
	// secrets, mesh networks fed by other registries); empty for a mesh of this cluster only.
	MultiCluster []string
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

// MultiClusterEvidence lists what shows that the mesh spans several clusters: istiod's remote
// secrets (the Secrets labelled istio/multiCluster=true in its namespace, one per other cluster
// it reads), and mesh networks that name more than one registry. networks is the meshNetworks
// YAML ("" for none).
func MultiClusterEvidence(remoteSecrets []string, networks string) ([]string, error) {
	var out []string
	for _, s := range remoteSecrets {
		out = append(out, "remote secret "+s)
	}
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
	if len(registries) > 1 {
		sort.Strings(registries)
		out = append(out, "meshNetworks registries "+strings.Join(registries, ", "))
	}
	sort.Strings(out)
	return out, nil
}

// checkMultiCluster refuses a mesh of several clusters. istiod lists the other clusters' pods of
// the host in the same LocalityLbEndpoints as the local ones, at weight 1 (or, across networks,
// as their east-west gateway weighted by their count): the weights the operator writes for the
// local pods would also decide how much traffic stays in this cluster (with 4 local pods
// weighted 100/300/50/10 and 3 remote ones, 99.4% instead of 57.1%). Only an all-equal weight
// keeps the split, which weights nothing (test/istiod TestServiceEntryInMultiClusterMesh).
func checkMultiCluster(in Input) error {
	if len(in.Mesh.MultiCluster) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the mesh spans several clusters (%s); istiod merges the other clusters' pods of %s beside the ServiceEntry's weighted copies at weight 1, so the weights would also move traffic between the clusters. adaptive-lb weights Services of single-cluster meshes only",
		ErrMultiCluster, strings.Join(in.Mesh.MultiCluster, "; "), Host(in.Service, in.ClusterDomain))
}
