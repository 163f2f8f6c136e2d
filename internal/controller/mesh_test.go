package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	apinetworkingv1 "istio.io/api/networking/v1"
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

// The mesh facts the operator reads in istiod's namespace (meshfacts.go), created by a test and
// removed after it: they apply to every AdaptiveLoadBalancer of the shared API server.

const istioNamespace = "istio-system"

// inIstioNamespace creates o in istiod's namespace for the rest of the test.
func (f *fixture) inIstioNamespace(o client.Object) {
	f.t.Helper()
	if err := k8s.Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	o.SetNamespace(istioNamespace)
	f.create(o)
	f.t.Cleanup(func() {
		if err := k8s.Delete(f.ctx, o); err != nil && !apierrors.IsNotFound(err) {
			f.t.Errorf("delete %T %s: %v", o, o.GetName(), err)
		}
	})
}

// istiod creates istiod's Deployment as Istio's chart labels it, at version.
func (f *fixture) istiod(version string) *appsv1.Deployment {
	f.t.Helper()
	labels := map[string]string{IstiodAppLabel: "istiod", "istio": "pilot"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "istiod", Labels: map[string]string{IstiodAppLabel: "istiod", VersionLabel: version}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "discovery", Image: "docker.io/istio/pilot:" + version}}},
			},
		},
	}
	f.inIstioNamespace(d)
	return d
}

// labelNamespace sets labels on the test's namespace.
func (f *fixture) labelNamespace(labels map[string]string) {
	f.t.Helper()
	ns := &corev1.Namespace{}
	if err := k8s.Get(f.ctx, types.NamespacedName{Name: f.ns}, ns); err != nil {
		f.t.Fatal(err)
	}
	ns.Labels = labels
	if err := k8s.Update(f.ctx, ns); err != nil {
		f.t.Fatal(err)
	}
}

// ambientPod is a pod enrolled in ambient mode: no sidecar, istio-cni's annotation.
func ambientPod(p *corev1.Pod) {
	delete(p.Labels, istio.TLSModeLabel)
	p.Annotations = map[string]string{istio.AmbientRedirectionAnnotation: istio.AmbientRedirectionEnabled}
	p.Spec.Containers = p.Spec.Containers[:1]
}

// ambientService: Service web in an ambient namespace, its two pods enrolled, mirrored by
// AdaptiveLoadBalancer web.
func (f *fixture) ambientService() *corev1.Service {
	f.t.Helper()
	f.node("node-a", "eu-west", "eu-west-1a")
	f.labelNamespace(map[string]string{istio.DataplaneModeLabel: "ambient"})
	svc := f.service("web")
	f.pod("web", "web-1", "10.1.0.1", ambientPod)
	f.pod("web", "web-2", "10.1.0.2", ambientPod)
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"), ready("web-2", "10.1.0.2"))
	f.alb("web", "web")
	return svc
}

// sidecarService: Service web with two pods with sidecars, mirrored by AdaptiveLoadBalancer web.
func (f *fixture) sidecarService(albOpts ...func(*adlbv1.AdaptiveLoadBalancer)) {
	f.t.Helper()
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("web")
	f.pod("web", "web-1", "10.1.0.1")
	f.pod("web", "web-2", "10.1.0.2")
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"), ready("web-2", "10.1.0.2"))
	f.alb("web", "web", albOpts...)
}

func (f *fixture) waitForNoServiceEntry(name string) {
	f.t.Helper()
	f.eventually("ServiceEntry "+name+" is gone", func() error {
		if _, err := f.serviceEntry(name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// Ambient pods without a waypoint: the ServiceEntry weights clients with a sidecar and gateways
// (istiod leaves it out of ztunnel's workload discovery on 1.29), and the status says that
// ztunnel clients are not weighted, and how to fix it; bound to a waypoint istiod confirms, the
// weights are enforced.
func TestMirror_AmbientServiceWithoutWaypointIsNotEnforced(t *testing.T) {
	f := newFixture(t)
	f.istiod("1.29.2")
	svc := f.ambientService()
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	c := f.waitForCondition("web", adlbv1.ConditionWeightsEnforced, metav1.ConditionFalse, adlbv1.ReasonAmbientWithoutWaypoint)
	for _, want := range []string{"2 of the Service's 2 mirrored pods are in ambient mode", "ztunnel clients balance without the weights", "istio.io/use-waypoint=waypoint"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("WeightsEnforced message %q does not say %q", c.Message, want)
		}
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonAmbientWithoutWaypoint)

	// A waypoint bound to the Service, as istiod reports it on the Service's status.
	svc.Labels = map[string]string{istio.UseWaypointLabel: "waypoint"}
	if err := k8s.Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	svc.Status.Conditions = []metav1.Condition{{Type: istio.WaypointBoundCondition, Status: metav1.ConditionTrue, Reason: "Accepted",
		Message: "bound to " + f.ns + "/waypoint", LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	c = f.waitForCondition("web", adlbv1.ConditionWeightsEnforced, metav1.ConditionTrue, adlbv1.ReasonEnforcedByWaypoint)
	if !strings.Contains(c.Message, "waypoint "+f.ns+"/waypoint is bound") {
		t.Errorf("WeightsEnforced message %q does not name the waypoint", c.Message)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// On an istiod that mixes a ServiceEntry's records into ztunnel's (before 1.28.1), no
// ServiceEntry is written for a Service in ambient mode; the upgrade lets the mirror write it.
func TestMirror_AmbientServiceOnAnOldIstiodHasNoServiceEntry(t *testing.T) {
	f := newFixture(t)
	d := f.istiod("1.28.0")
	f.ambientService()
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonAmbientUnsupportedIstioVersion)
	if !strings.Contains(c.Message, "istiod is version 1.28.0") || !strings.Contains(c.Message, "Upgrade istiod") {
		t.Errorf("EndpointsMirrored message %q does not name the version and the fix", c.Message)
	}
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ServiceEntry exists (%v)", err)
	}
	f.waitForCondition("web", adlbv1.ConditionWeightsEnforced, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)

	d.Labels[VersionLabel] = "1.28.1"
	if err := k8s.Update(f.ctx, d); err != nil {
		t.Fatal(err)
	}
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// requireIstiodScrape skips a test that needs the suite's istiod gauge when VictoriaMetrics is
// not built; under CI that is a failure.
func requireIstiodScrape(t *testing.T) {
	t.Helper()
	requireVM(t)
	if suiteIstiod == nil {
		t.Fatal("the suite runs without its istiod scrape although VictoriaMetrics is built")
	}
}

// istiod's own count of its remote clusters decides, as in a default install (auto): at 0 the
// Service is weighted, and the status says what shows the mesh is one cluster; once istiod reads
// a remote cluster the ServiceEntry goes (MultiCluster, naming the evidence); back at 0 it
// returns. No Secret is read.
func TestMirror_MultiClusterMeshHasNoServiceEntry(t *testing.T) {
	requireIstiodScrape(t)
	f := newFixture(t)
	f.sidecarService()
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	f.waitForCondition("web", adlbv1.ConditionWeightsEnforced, metav1.ConditionTrue, adlbv1.ReasonEnforcedBySidecars)
	served := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	if want := `the mesh is one cluster: istiod reads no remote cluster (istiod_managed_clusters{cluster_type="remote"} is 0 for ` + istiodPod + ` in the TSDB)`; !strings.Contains(served.Message, want) {
		t.Errorf("EndpointsMirrored message %q does not say %q", served.Message, want)
	}

	suiteIstiod.setRemote(2)
	t.Cleanup(func() { suiteIstiod.setRemote(0) })
	f.waitForNoServiceEntry("web")
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonMultiCluster)
	if !strings.Contains(c.Message, "istiod "+istiodPod+" reads 2 remote clusters (istiod_managed_clusters in the TSDB)") || !strings.Contains(c.Message, "move traffic between the clusters") {
		t.Errorf("EndpointsMirrored message %q does not name the evidence and the reason", c.Message)
	}
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonMultiCluster)
	f.waitForCondition("web", adlbv1.ConditionWeightsEnforced, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)

	suiteIstiod.setRemote(0)
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// meshNetworks fed by two registries is a mesh of several clusters whatever istiod's count says.
func TestMirror_MeshNetworksOfSeveralRegistriesIsMultiCluster(t *testing.T) {
	f := newFixture(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Data: map[string]string{"meshNetworks": "networks:\n  east: {endpoints: [{fromRegistry: east}]}\n  west: {endpoints: [{fromRegistry: west}]}\n"}}
	f.inIstioNamespace(cm)
	f.sidecarService()
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonMultiCluster)
	if !strings.Contains(c.Message, "meshNetworks registries east, west") {
		t.Errorf("EndpointsMirrored message %q does not name the evidence", c.Message)
	}
	if _, err := f.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ServiceEntry exists (%v)", err)
	}
	if err := k8s.Delete(f.ctx, cm); err != nil {
		t.Fatal(err)
	}
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
}

// The mesh's defaultServiceExportTo limits a Service without an exportTo annotation, and the
// ServiceEntry with it; a mesh config the operator cannot read removes the ServiceEntry.
func TestMirror_VisibilityFollowsTheMeshConfig(t *testing.T) {
	f := newFixture(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Data: map[string]string{"mesh": "defaultServiceExportTo: [\".\"]\naccessLogFile: /dev/stdout\n"}}
	f.inIstioNamespace(cm)
	f.sidecarService(func(a *adlbv1.AdaptiveLoadBalancer) { a.Spec.ExportTo = []string{".", "client"} })
	se := f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	if !slices.Equal(se.Spec.ExportTo, []string{"."}) {
		t.Fatalf("ServiceEntry exportTo %v, want [.]: spec.exportTo cut to the mesh's defaultServiceExportTo", se.Spec.ExportTo)
	}

	cm.Data["mesh"] = "defaultServiceExportTo: {"
	if err := k8s.Update(f.ctx, cm); err != nil {
		t.Fatal(err)
	}
	f.waitForNoServiceEntry("web")
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonMeshConfigInvalid)
	if !strings.Contains(c.Message, "istio-system/istio") {
		t.Errorf("EndpointsMirrored message %q does not name the ConfigMap", c.Message)
	}
}

// Another owner's ServiceEntry of the Service's host, visible to the same clients: Conflict, no
// ServiceEntry (istiod would list the other's copies first), and the weights are not claimed;
// once it is gone the operator's ServiceEntry returns.
func TestMirror_AForeignServiceEntryOfTheHostIsAConflict(t *testing.T) {
	f := newFixture(t)
	f.sidecarService()
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	foreign := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "web-weights", Namespace: f.ns}}
	foreign.Spec = apinetworkingv1.ServiceEntry{
		Hosts:      []string{"web." + f.ns + ".svc.cluster.local"},
		Ports:      []*apinetworkingv1.ServicePort{{Number: 80, Name: "http-web", Protocol: "HTTP"}},
		Resolution: apinetworkingv1.ServiceEntry_STATIC,
		Location:   apinetworkingv1.ServiceEntry_MESH_INTERNAL,
		Endpoints:  []*apinetworkingv1.WorkloadEntry{{Address: "10.1.0.1", Weight: 1}},
	}
	f.create(foreign)
	f.waitForNoServiceEntry("web")
	c := f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonConflict)
	if !strings.Contains(c.Message, "ServiceEntry "+f.ns+"/web-weights also declares host") || !strings.Contains(c.Message, "Delete it") {
		t.Errorf("EndpointsMirrored message %q does not name the other ServiceEntry and the fix", c.Message)
	}
	f.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonNoServiceEntry)

	if err := k8s.Delete(f.ctx, foreign); err != nil {
		t.Fatal(err)
	}
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}
