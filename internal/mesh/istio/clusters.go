package istio

import (
	"fmt"
	"sort"
	"strings"
)

// MultiClusterMode is what the operator is told of the mesh's clusters (--mesh-multi-cluster,
// chart value mesh.multiCluster).
type MultiClusterMode string

const (
	// MultiClusterAuto detects: the mesh counts as this cluster alone only while istiod's own
	// count of its remote clusters, read from the TSDB, is 0.
	MultiClusterAuto MultiClusterMode = "auto"
	// MultiClusterTrue: the mesh spans several clusters; every Service is refused.
	MultiClusterTrue MultiClusterMode = "true"
	// MultiClusterFalse: the mesh is this cluster alone, and istiod's count is not needed; a
	// meshNetworks that names several registries still refuses.
	MultiClusterFalse MultiClusterMode = "false"
)

// ParseMultiClusterMode reads auto, true or false ("" is auto).
func ParseMultiClusterMode(s string) (MultiClusterMode, error) {
	switch m := MultiClusterMode(s); m {
	case "":
		return MultiClusterAuto, nil
	case MultiClusterAuto, MultiClusterTrue, MultiClusterFalse:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a multi-cluster mode: want auto, true or false", s)
}

// RemoteClusterReport is istiod's own count of the remote clusters it reads (the gauge
// istiod_managed_clusters{cluster_type="remote"}), as the operator last read it from the TSDB.
type RemoteClusterReport struct {
	// ByIstiod is each istiod pod's count, by "namespace/pod"; empty when Unknown says why.
	ByIstiod map[string]float64
	// Unknown says why there is no count: no TSDB, the query failed, or it found no series.
	Unknown string
}

// Clusters is the verdict on how many clusters the mesh spans, with its evidence.
type Clusters struct {
	// Several lists what shows that the mesh spans several clusters.
	Several []string
	// Unknown says why the operator cannot tell, when it cannot.
	Unknown string
	// One says what shows that the mesh is this cluster alone, when it is.
	One string
}

// JudgeClusters decides, from what the operator was told (mode), istiod's meshNetworks (its
// ConfigMap's YAML, "" for none) and istiod's own count of its remote clusters, whether the mesh
// spans several clusters. Evidence of several clusters always counts; evidence of one cluster is
// istiod's count of 0 for every istiod, or mode false. Anything else (no TSDB, a failed query,
// an istiod the TSDB does not scrape) is Unknown, which the mirror refuses like several.
func JudgeClusters(mode MultiClusterMode, meshNetworks string, remote RemoteClusterReport) (Clusters, error) {
	var out Clusters
	if mode == MultiClusterTrue {
		out.Several = append(out.Several, "the operator is told so (--mesh-multi-cluster=true, chart: mesh.multiCluster)")
	}
	registries, err := meshNetworksRegistries(meshNetworks)
	if err != nil {
		return Clusters{}, err
	}
	if len(registries) > 1 {
		out.Several = append(out.Several, "meshNetworks registries "+strings.Join(registries, ", "))
	}
	istiods := make([]string, 0, len(remote.ByIstiod))
	for pod := range remote.ByIstiod {
		istiods = append(istiods, pod)
	}
	sort.Strings(istiods)
	for _, pod := range istiods {
		if n := remote.ByIstiod[pod]; n != 0 {
			clusters := "clusters"
			if n == 1 {
				clusters = "cluster"
			}
			out.Several = append(out.Several, fmt.Sprintf("istiod %s reads %g remote %s (istiod_managed_clusters in the TSDB)", pod, n, clusters))
		}
	}
	switch {
	case len(out.Several) > 0:
	case mode == MultiClusterFalse:
		out.One = "the operator is told so (--mesh-multi-cluster=false, chart: mesh.multiCluster)"
	case len(istiods) > 0:
		out.One = fmt.Sprintf("istiod reads no remote cluster (istiod_managed_clusters{cluster_type=\"remote\"} is 0 for %s in the TSDB)", strings.Join(istiods, ", "))
	case remote.Unknown != "":
		out.Unknown = remote.Unknown
	default:
		out.Unknown = "istiod's count of its remote clusters has not been read"
	}
	return out, nil
}
