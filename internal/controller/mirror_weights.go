package controller

import (
	"maps"
	"slices"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// InstanceTypeLabel is the well-known node label naming the machine type a pod runs on.
const InstanceTypeLabel = "node.kubernetes.io/instance-type"

// currentWeights are the weights the mirror writes for the pods the Service's slices list, by
// pod name, and the weight of a pod no rule below weights:
//   - a pod the operator's record names (AppliedWeightsAnnotation) keeps the weight the operator
//     applied: a membership change never undoes a weight cycle, and a weight anyone else edited
//     in the ServiceEntry is put back. The record names pods, not addresses: a new pod that took
//     over a departed pod's address is a new pod;
//   - a pod that left the ServiceEntry moments ago (its readiness flapped) returns at the weight
//     it had (recent, may be nil);
//   - a new pod gets the median applied weight of the pods on nodes of its instance type (the
//     same hardware serves at the same speed; a pod replaced in a rolling restart thus starts
//     near its predecessor's weight instead of overloading a slow machine for a window), or the
//     median of all applied weights when it has no such peer.
//
// In DryRun, and before any weight cycle, all weights are equal.
func currentWeights(alb *adlbv1.AdaptiveLoadBalancer, existing *networkingv1.ServiceEntry, pods map[string]*corev1.Pod, nodes map[string]*corev1.Node,
	recent func(ip, pod string) (uint32, bool)) (map[string]uint32, uint32) {
	equal := uint32(EqualWeight(alb))
	if existing == nil || alb.Spec.Mode == adlbv1.ModeDryRun {
		return nil, equal
	}
	applied, ok := readApplied(existing)
	if !ok {
		applied = appliedByAddress(existing, pods)
	}
	if len(applied) == 0 {
		return nil, equal
	}
	all := slices.Collect(maps.Values(applied))
	instanceType := func(pod *corev1.Pod) string {
		if node := nodes[pod.Spec.NodeName]; node != nil {
			return node.Labels[InstanceTypeLabel]
		}
		return ""
	}
	out := map[string]uint32{}
	byType := map[string][]uint32{}
	for name, pod := range pods {
		if w, ok := applied[name]; ok {
			out[name] = w
			if t := instanceType(pod); t != "" {
				byType[t] = append(byType[t], w)
			}
		}
	}
	for name, pod := range pods {
		if _, weighted := out[name]; weighted || recent == nil {
			continue
		}
		for _, ip := range podIPs(pod) {
			if w, ok := recent(ip, name); ok {
				out[name] = w
			}
		}
	}
	for name, pod := range pods {
		if _, weighted := out[name]; weighted {
			continue
		}
		if peers := byType[instanceType(pod)]; instanceType(pod) != "" && len(peers) > 0 {
			out[name] = medianWeight(peers)
		}
	}
	return out, medianWeight(all)
}

// appliedByAddress stands in for the record of a ServiceEntry written before the operator kept
// one: its weights, given to the pods at their addresses now.
func appliedByAddress(se *networkingv1.ServiceEntry, pods map[string]*corev1.Pod) appliedWeights {
	byIP := map[string]uint32{}
	for _, e := range se.Spec.Endpoints {
		if e.Weight > 0 {
			byIP[e.Address] = e.Weight
		}
	}
	out := appliedWeights{}
	for name, pod := range pods {
		for _, ip := range podIPs(pod) {
			if w, ok := byIP[ip]; ok {
				out[name] = w
			}
		}
	}
	return out
}

func medianWeight(ws []uint32) uint32 {
	sorted := slices.Clone(ws)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// endpointIPs are the addresses at which an endpoint is known to be pod's own: its pod IPs, and
// none for a host-network pod, whose IP is its node's, shared with every other host-network pod
// there. The pod-IP index and the weight cycle's search for an endpoint's pod both use it.
func endpointIPs(pod *corev1.Pod) []string {
	if pod.Spec.HostNetwork {
		return nil
	}
	return podIPs(pod)
}

// podIPs are pod's IPs: status.podIPs, or status.podIP when only it is set.
func podIPs(pod *corev1.Pod) []string {
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = append(ips, pod.Status.PodIP)
	}
	return ips
}

// EqualWeight is the weight every endpoint gets when weights are equal, for the spec's algorithm.
func EqualWeight(alb *adlbv1.AdaptiveLoadBalancer) int {
	s, err := EngineSettings(alb)
	if err != nil {
		s = weights.DefaultSettings(weights.AlgorithmTail)
	}
	return s.EqualWeight()
}
