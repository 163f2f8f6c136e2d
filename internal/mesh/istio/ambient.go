package istio

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations of Istio's ambient mode.
const (
	// AmbientRedirectionAnnotation is set by istio-cni on a pod whose traffic it redirects to
	// ztunnel: the truth of a pod's enrollment in ambient mode (the istio.io/dataplane-mode
	// labels on the pod and namespace only state the intent).
	AmbientRedirectionAnnotation = "ambient.istio.io/redirection"
	// AmbientRedirectionEnabled is AmbientRedirectionAnnotation's value on an enrolled pod.
	AmbientRedirectionEnabled = "enabled"
	// DataplaneModeLabel on a namespace or pod asks for ambient mode ("ambient") or opts out ("none").
	DataplaneModeLabel = "istio.io/dataplane-mode"
	// UseWaypointLabel on a Service or namespace names the waypoint its traffic goes through
	// ("none" opts out); UseWaypointNamespaceLabel names the waypoint's namespace when it is
	// not the object's own.
	UseWaypointLabel          = "istio.io/use-waypoint"
	UseWaypointNamespaceLabel = "istio.io/use-waypoint-namespace"
	// WaypointBoundCondition is the condition istiod writes on a Service's status once a
	// waypoint serves it.
	WaypointBoundCondition = "istio.io/WaypointBound"
)

// NetworkLabel on a pod, or on istiod's namespace for the whole cluster, names the network the
// pod's endpoints are in.
const NetworkLabel = "topology.istio.io/network"

// ErrAmbientIstioVersion marks a Service in ambient mode whose istiod would mix a
// ServiceEntry's records into ztunnel's (see ZtunnelIgnoresServiceEntryOfService).
var ErrAmbientIstioVersion = errors.New("ambient mode needs a newer istiod")

// Enrolled reports whether the pod is in ambient mode: istio-cni redirects its traffic to ztunnel.
func Enrolled(pod *corev1.Pod) bool {
	return pod.Annotations[AmbientRedirectionAnnotation] == AmbientRedirectionEnabled
}

// ambientNamespace reports whether the namespace asks for ambient mode.
func ambientNamespace(ns *corev1.Namespace) bool {
	return ns != nil && ns.Labels[DataplaneModeLabel] == "ambient"
}

// enrolledPods names the pods of the input that are in ambient mode, sorted.
func enrolledPods(in Input) []string {
	var out []string
	for name, pod := range in.Pods {
		if Enrolled(pod) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// checkAmbient refuses a Service in ambient mode (its namespace asks for it, or a pod of it is
// enrolled) when istiod's version is unknown or older than the first that keeps the
// ServiceEntry out of ztunnel's workload discovery: ztunnel would get a second, plaintext
// workload without identity for every pod address.
func checkAmbient(in Input) error {
	enrolled := enrolledPods(in)
	if len(enrolled) == 0 && !ambientNamespace(in.Namespace) {
		return nil
	}
	version, known := ParseVersion(in.Mesh.IstioVersion)
	if known && ZtunnelIgnoresServiceEntryOfService(version) {
		return nil
	}
	why := fmt.Sprintf("namespace %s is labelled %s=ambient", in.Service.Namespace, DataplaneModeLabel)
	if len(enrolled) > 0 {
		why = fmt.Sprintf("%d of its pods are in ambient mode (%s)", len(enrolled), strings.Join(enrolled, ", "))
	}
	have := "istiod's version is unknown (no app.kubernetes.io/version label on its Deployment; set the operator's --istio-version)"
	if in.Mesh.IstioVersion != "" {
		have = "istiod is version " + in.Mesh.IstioVersion
	}
	return fmt.Errorf("%w: service %s/%s is in ambient mode (%s) and %s; only istiod 1.28.1, 1.29.0 and later keep a ServiceEntry of a Service's host out of ztunnel's workloads, older ones would give ztunnel a second, plaintext workload without identity for every pod. Upgrade istiod to weight this Service",
		ErrAmbientIstioVersion, in.Service.Namespace, in.Service.Name, why, have)
}

// Enforcement says whether the Service's clients apply the weights, as far as the operator can
// tell from the Service, its namespace and its pods.
type Enforcement struct {
	Enforced bool
	Reason   EnforcementReason
	Message  string
}

// EnforcementReason says why the weights are enforced or not.
type EnforcementReason string

const (
	// EnforcedBySidecars: no pod of the Service is in ambient mode; its clients with a sidecar,
	// its gateways and waypoints balance by the ServiceEntry's weights.
	EnforcedBySidecars EnforcementReason = "Sidecars"
	// EnforcedByWaypoint: the Service's pods are in ambient mode and a waypoint is bound to it;
	// ztunnel clients reach it through the waypoint, an Envoy that applies the weights.
	EnforcedByWaypoint EnforcementReason = "Waypoint"
	// NotEnforcedAmbientWithoutWaypoint: pods of the Service are in ambient mode and no
	// waypoint is bound to it: istiod serves ztunnel the Service's own endpoints, and ztunnel
	// clients balance without the weights.
	NotEnforcedAmbientWithoutWaypoint EnforcementReason = "AmbientWithoutWaypoint"
)

// Enforce evaluates whether the clients of the Service apply the weights of the mirrored
// endpoints. Clients with a sidecar and gateways always do. ztunnel, the client of ambient
// pods, does not: istiod leaves the ServiceEntry out of its workload discovery (test/istiod
// TestAmbientZtunnelIgnoresServiceEntry); only a waypoint bound to the Service, an Envoy through
// which ztunnel sends the Service's traffic, applies them (TestAmbientWaypointUsesWeights). The
// pods' enrollment in ambient mode (istio-cni's annotation) stands for their clients', which the
// operator cannot see: ambient workloads usually talk to each other.
//
// The waypoint of traffic to the Service is the one its istio.io/use-waypoint label names, else
// its namespace's ("none" opts out), as istiod resolves it for Service traffic; a pod's own
// label binds a waypoint only to traffic addressed to the pod. istiod confirms the binding with
// the Service's istio.io/WaypointBound condition, which must be True: a label naming a waypoint
// that does not exist, or does not take Service traffic, binds nothing.
func Enforce(in Input, endpoints []Endpoint) Enforcement {
	var enrolled []string
	for _, e := range endpoints {
		if pod := in.Pods[e.Pod]; pod != nil && Enrolled(pod) && !slices.Contains(enrolled, e.Pod) {
			enrolled = append(enrolled, e.Pod)
		}
	}
	svc := in.Service
	if len(enrolled) == 0 {
		return Enforcement{Enforced: true, Reason: EnforcedBySidecars,
			Message: fmt.Sprintf("no pod of Service %s is in ambient mode: its clients with a sidecar, gateways and waypoints balance by the weights", svc.Name)}
	}
	sort.Strings(enrolled)
	pods := fmt.Sprintf("%d of the Service's %d mirrored pods are in ambient mode", len(enrolled), len(endpoints))
	waypoint, from := serviceWaypoint(svc, in.Namespace)
	fix := fmt.Sprintf("Bind a waypoint to the Service (istioctl waypoint apply -n %s, then label the Service %s=waypoint) so that ztunnel clients reach it through an Envoy that applies the weights", svc.Namespace, UseWaypointLabel)
	if waypoint == "" {
		if from != "" {
			from = " (" + from + ")"
		}
		return Enforcement{Reason: NotEnforcedAmbientWithoutWaypoint,
			Message: fmt.Sprintf("%s and no waypoint is bound to Service %s%s: ztunnel clients balance without the weights (clients with a sidecar and gateways use them). %s", pods, svc.Name, from, fix)}
	}
	var bound *metav1.Condition
	for i := range svc.Status.Conditions {
		if svc.Status.Conditions[i].Type == WaypointBoundCondition {
			bound = &svc.Status.Conditions[i]
		}
	}
	switch {
	case bound == nil:
		return Enforcement{Reason: NotEnforcedAmbientWithoutWaypoint,
			Message: fmt.Sprintf("%s; %s names waypoint %s, but istiod has not reported the Service's %s condition, so ztunnel clients may balance without the weights. Check the waypoint (istioctl waypoint status -n %s)", pods, from, waypoint, WaypointBoundCondition, svc.Namespace)}
	case bound.Status != metav1.ConditionTrue:
		return Enforcement{Reason: NotEnforcedAmbientWithoutWaypoint,
			Message: fmt.Sprintf("%s; %s names waypoint %s, but istiod reports %s=%s (%s: %s): ztunnel clients balance without the weights. %s", pods, from, waypoint, WaypointBoundCondition, bound.Status, bound.Reason, bound.Message, fix)}
	}
	return Enforcement{Enforced: true, Reason: EnforcedByWaypoint,
		Message: fmt.Sprintf("%s and waypoint %s is bound to Service %s (%s): ztunnel clients reach it through the waypoint, which balances by the weights", pods, waypoint, svc.Name, WaypointBoundCondition)}
}

// serviceWaypoint is the waypoint of traffic to the Service, as namespace/name ("" for none),
// and the label that decides it ("" when none does).
func serviceWaypoint(svc *corev1.Service, ns *corev1.Namespace) (string, string) {
	named := func(labels map[string]string, fallback string) (string, bool) {
		name, ok := labels[UseWaypointLabel]
		if !ok {
			return "", false
		}
		if name == "none" || name == "" {
			return "", true
		}
		namespace := fallback
		if override := labels[UseWaypointNamespaceLabel]; override != "" {
			namespace = override
		}
		return namespace + "/" + name, true
	}
	if wp, set := named(svc.Labels, svc.Namespace); set {
		if wp == "" {
			return "", fmt.Sprintf("its label %s=none opts out", UseWaypointLabel)
		}
		return wp, fmt.Sprintf("its label %s", UseWaypointLabel)
	}
	if ns != nil {
		if wp, set := named(ns.Labels, svc.Namespace); set && wp != "" {
			return wp, fmt.Sprintf("namespace %s's label %s", ns.Name, UseWaypointLabel)
		}
	}
	return "", ""
}
