package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
)

// MeshSource says where the operator reads the facts of the mesh around the Services (see
// istio.Mesh): istiod's namespace and ConfigMap, the istiod version when its Deployment does not
// say it, and what the operator is told of the mesh's clusters. Nothing in it carries
// credentials: no Secret is read.
type MeshSource struct {
	// IstioNamespace is istiod's namespace (istio-system): its ConfigMap, its Deployments, its
	// topology.istio.io/network label, and the namespace of istiod's pods in the TSDB.
	IstioNamespace string
	// MeshConfigMap is istiod's ConfigMap, whose "mesh" and "meshNetworks" keys are read
	// (istio, or istio-<revision>).
	MeshConfigMap string
	// IstioVersion, if set, is istiod's version, in place of the one read from its
	// Deployments' app.kubernetes.io/version label.
	IstioVersion string
	// MultiCluster is what the operator is told of the mesh's clusters ("" is auto: judged from
	// istiod's own count of its remote clusters in the TSDB; see istio.JudgeClusters).
	MultiCluster istio.MultiClusterMode
}

// DefaultMeshSource is Istio's default installation.
func DefaultMeshSource() MeshSource {
	return MeshSource{IstioNamespace: "istio-system", MeshConfigMap: "istio", MultiCluster: istio.MultiClusterAuto}
}

// Labels the operator reads in istiod's namespace.
const (
	// IstiodAppLabel is the label of istiod's Deployments (app=istiod).
	IstiodAppLabel = "app"
	// VersionLabel is the version label Istio's charts (1.24 onwards) put on istiod's Deployment.
	VersionLabel = "app.kubernetes.io/version"
)

// meshFacts reads the mesh facts from the informer cache, parsing istiod's ConfigMap again only
// when it changed.
type meshFacts struct {
	source MeshSource
	// clusters reads istiod's count of its remote clusters (nil: no TSDB).
	clusters *RemoteClusterProbe

	mu       sync.Mutex
	parsedRV string // the ConfigMap's resourceVersion behind config and networks ("-" for none)
	config   istio.MeshConfig
	networks string
	err      error
}

// gather returns what the operator knows of the mesh. An unreadable mesh config is an
// istio.ErrMeshConfig error: the Service's visibility is then unknown.
func (m *meshFacts) gather(ctx context.Context, c client.Reader) (istio.Mesh, error) {
	src := m.source
	var out istio.Mesh
	cm := &corev1.ConfigMap{}
	rv := "-"
	switch err := c.Get(ctx, types.NamespacedName{Namespace: src.IstioNamespace, Name: src.MeshConfigMap}, cm); {
	case err == nil:
		rv = cm.ResourceVersion
	case !apierrors.IsNotFound(err):
		return istio.Mesh{}, fmt.Errorf("get istiod's ConfigMap %s/%s: %w", src.IstioNamespace, src.MeshConfigMap, err)
	}
	config, networks, err := m.parse(rv, cm)
	if err != nil {
		return istio.Mesh{}, err
	}
	out.DefaultServiceExportTo = config.DefaultServiceExportTo

	ns := &corev1.Namespace{}
	if err := c.Get(ctx, types.NamespacedName{Name: src.IstioNamespace}, ns); err == nil {
		out.Network = ns.Labels[istio.NetworkLabel]
	} else if !apierrors.IsNotFound(err) {
		return istio.Mesh{}, fmt.Errorf("get istiod's namespace %s: %w", src.IstioNamespace, err)
	}

	out.IstioVersion = src.IstioVersion
	if out.IstioVersion == "" {
		if out.IstioVersion, err = istiodVersion(ctx, c, src.IstioNamespace); err != nil {
			return istio.Mesh{}, err
		}
	}

	remote, _ := m.remoteClusters()
	clusters, err := istio.JudgeClusters(m.mode(), networks, remote)
	if err != nil {
		return istio.Mesh{}, fmt.Errorf("istiod's ConfigMap %s/%s: %w", src.IstioNamespace, src.MeshConfigMap, err)
	}
	out.MultiCluster, out.ClustersUnknown, out.SingleCluster = clusters.Several, clusters.Unknown, clusters.One
	return out, nil
}

// mode is what the operator is told of the mesh's clusters.
func (m *meshFacts) mode() istio.MultiClusterMode {
	if m.source.MultiCluster == "" {
		return istio.MultiClusterAuto
	}
	return m.source.MultiCluster
}

// remoteClusters is istiod's count of its remote clusters, when the mode needs it; false while
// the first reading of it is still under way.
func (m *meshFacts) remoteClusters() (istio.RemoteClusterReport, bool) {
	switch {
	case m.mode() != istio.MultiClusterAuto:
		return istio.RemoteClusterReport{}, true // told: istiod's count is not needed
	case m.clusters == nil:
		return istio.RemoteClusterReport{Unknown: "no TSDB is configured (--tsdb-url) to read istiod's count of its remote clusters from"}, true
	}
	return m.clusters.Report()
}

// pending reports whether the mirror must wait for the first reading of istiod's count: at
// start, rather than refuse every Service until it comes.
func (m *meshFacts) pending() bool {
	_, known := m.remoteClusters()
	return !known
}

// parse returns the mesh config and the meshNetworks text of the ConfigMap at resourceVersion rv,
// parsing only when rv changed.
func (m *meshFacts) parse(rv string, cm *corev1.ConfigMap) (istio.MeshConfig, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rv != m.parsedRV {
		m.parsedRV, m.networks = rv, cm.Data["meshNetworks"]
		m.config, m.err = istio.ParseMeshConfig(cm.Data["mesh"])
		if m.err != nil {
			m.err = fmt.Errorf("istiod's ConfigMap %s/%s, key mesh: %w", cm.Namespace, cm.Name, m.err)
		}
	}
	return m.config, m.networks, m.err
}

// istiodVersion is the lowest version among istiod's Deployments (several revisions run during
// a canary upgrade, and each Service's clients may follow either), "" when none says its
// version.
func istiodVersion(ctx context.Context, c client.Reader, namespace string) (string, error) {
	deployments := &metav1.PartialObjectMetadataList{}
	deployments.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("DeploymentList"))
	if err := c.List(ctx, deployments, client.InNamespace(namespace), client.MatchingLabels{IstiodAppLabel: "istiod"}); err != nil {
		return "", fmt.Errorf("list istiod's Deployments in %s: %w", namespace, err)
	}
	var lowest *istio.Version
	text := ""
	for _, d := range deployments.Items {
		v, ok := istio.ParseVersion(d.Labels[VersionLabel])
		if !ok {
			return "", nil // one istiod of unknown version: the version is unknown
		}
		if lowest == nil || v.Compare(*lowest) < 0 {
			lowest, text = &v, d.Labels[VersionLabel]
		}
	}
	return text, nil
}

// otherServiceEntries are the ServiceEntries that declare the Service's host and are not this
// AdaptiveLoadBalancer's: neither controlled by it nor labelled as its own (a ServiceEntry of an
// earlier object of the same name, which the orphan reconciler removes).
func (r *AdaptiveLoadBalancerReconciler) otherServiceEntries(ctx context.Context, alb *adlbv1.AdaptiveLoadBalancer, svc *corev1.Service) ([]istio.OtherServiceEntry, error) {
	host := strings.ToLower(istio.Host(svc, r.ClusterDomain))
	var list networkingv1.ServiceEntryList
	if err := r.List(ctx, &list, client.MatchingFields{indexServiceEntryHost: host}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list ServiceEntries of host %s: %w", host, err)
	}
	var out []istio.OtherServiceEntry
	for _, se := range list.Items {
		if metav1.IsControlledBy(se, alb) ||
			(se.Namespace == alb.Namespace && se.Labels[ManagedByLabel] == ManagedByValue && se.Labels[ServiceEntryOwnerLabel] == alb.Name) {
			continue
		}
		out = append(out, istio.OtherServiceEntry{Namespace: se.Namespace, Name: se.Name, Hosts: se.Spec.Hosts, ExportTo: se.Spec.ExportTo})
	}
	return out, nil
}

// serviceEntryHosts is the host index of a ServiceEntry: its hosts, lower-cased.
func serviceEntryHosts(o client.Object) []string {
	se, ok := o.(*networkingv1.ServiceEntry)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(se.Spec.Hosts))
	for _, h := range se.Spec.Hosts {
		if h = strings.ToLower(h); !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}
