package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
	"github.com/adaptive-lb/adaptive-lb/internal/whatif"
)

// Facts the cluster states that rule the what-if out. Unlike a cluster that cannot be read, they
// are not papered over with kube-state-metrics or assumptions.
var (
	// errServiceNotFound: the cluster has no such Service; the name is probably wrong.
	errServiceNotFound = errors.New("Service not found")
	// errUnsupportedBalancer: the DestinationRule sets a balancer the simulator does not model.
	errUnsupportedBalancer = errors.New("unsupported balancer")
)

// readClusterFacts reads, for `simulate --from-tsdb --kubeconfig`, what the pod specs, the nodes
// and the DestinationRules say about a Service: its pods' CPU limits, nodes and sidecars, the
// nodes' CPU counts and instance types, and the client sidecars' balancer. It only reads.
func readClusterFacts(ctx context.Context, kubeconfig, namespace, name string) (*whatif.ClusterFacts, error) {
	cfg, err := restConfigFrom(kubeconfig, "adaptive-lb-simulate/"+version)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := networkingv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster of %s: %w", kubeconfig, err)
	}
	return clusterFacts(ctx, c, namespace, name)
}

func clusterFacts(ctx context.Context, c client.Reader, namespace, name string) (*whatif.ClusterFacts, error) {
	var svc corev1.Service
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: the cluster has no Service %s/%s; check --service", errServiceNotFound, namespace, name)
		}
		return nil, fmt.Errorf("reading Service %s/%s: %w", namespace, name, err)
	}
	facts := &whatif.ClusterFacts{Pods: map[string]whatif.ClusterPod{}, Nodes: map[string]whatif.ClusterNode{}}
	if len(svc.Spec.Selector) > 0 {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(svc.Spec.Selector)}); err != nil {
			return nil, fmt.Errorf("listing the pods of Service %s/%s: %w", namespace, name, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			facts.Pods[p.Name] = podFacts(p)
		}
	}
	for _, p := range facts.Pods {
		if p.Node == "" {
			continue
		}
		if _, done := facts.Nodes[p.Node]; done {
			continue
		}
		var node corev1.Node
		if err := c.Get(ctx, types.NamespacedName{Name: p.Node}, &node); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the pod's node is gone; kube-state-metrics may still know it
			}
			return nil, fmt.Errorf("reading node %s: %w", p.Node, err)
		}
		cpu := node.Status.Capacity[corev1.ResourceCPU]
		instanceType := node.Labels[corev1.LabelInstanceTypeStable]
		if instanceType == "" {
			instanceType = node.Labels[corev1.LabelInstanceType]
		}
		facts.Nodes[p.Node] = whatif.ClusterNode{Cores: cpu.AsApproximateFloat64(), InstanceType: instanceType}
	}
	lb, source, err := destinationRuleLB(ctx, c, namespace, name)
	if err != nil {
		return nil, err
	}
	facts.LB, facts.LBSource = lb, source
	return facts, nil
}

// podFacts reads a pod's CPU limit (its application containers' together; none when one of them
// has none), node and sidecar.
func podFacts(p *corev1.Pod) whatif.ClusterPod {
	out := whatif.ClusterPod{Node: p.Spec.NodeName, HasCPULimit: true}
	for _, ctr := range p.Spec.Containers {
		if ctr.Name == istioProxy {
			out.Sidecar = true
			continue
		}
		limit, ok := ctr.Resources.Limits[corev1.ResourceCPU]
		if !ok {
			out.HasCPULimit = false
			continue
		}
		out.CPULimit += limit.AsApproximateFloat64()
	}
	for _, ctr := range p.Spec.InitContainers {
		// A native sidecar is an init container that keeps running.
		if ctr.Name == istioProxy && ctr.RestartPolicy != nil && *ctr.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out.Sidecar = true
		}
	}
	if !out.HasCPULimit {
		out.CPULimit = 0
	}
	return out
}

const istioProxy = "istio-proxy"

// destinationRuleLB returns the balancer the Service's DestinationRule sets, as a simulator
// client policy, and names the rule; "" when no rule in the namespace sets one for its host.
// A balancer the simulator does not model is an error.
func destinationRuleLB(ctx context.Context, c client.Reader, namespace, name string) (string, string, error) {
	var rules networkingv1.DestinationRuleList
	if err := c.List(ctx, &rules, client.InNamespace(namespace)); err != nil {
		if apierrors.IsNotFound(err) || strings.Contains(err.Error(), "no matches for kind") {
			return "", "", nil // Istio's CRDs are not installed: no rule
		}
		return "", "", fmt.Errorf("listing the DestinationRules of namespace %s: %w", namespace, err)
	}
	hosts := map[string]bool{name: true, name + "." + namespace: true, name + "." + namespace + ".svc": true, name + "." + namespace + ".svc.cluster.local": true}
	for _, dr := range rules.Items {
		if !hosts[dr.Spec.GetHost()] {
			continue
		}
		lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer()
		if lb == nil {
			continue
		}
		source := fmt.Sprintf("DestinationRule %s/%s", namespace, dr.Name)
		if lb.GetConsistentHash() != nil {
			return "", "", fmt.Errorf("%w: %s balances by consistent hash, which the simulator does not model (it models LEAST_REQUEST, ROUND_ROBIN and RANDOM); a prediction would not apply to this Service", errUnsupportedBalancer, source)
		}
		switch lb.GetSimple() {
		case networkingapi.LoadBalancerSettings_UNSPECIFIED, networkingapi.LoadBalancerSettings_LEAST_REQUEST, networkingapi.LoadBalancerSettings_LEAST_CONN:
			return sim.LBLeastRequest, source, nil
		case networkingapi.LoadBalancerSettings_ROUND_ROBIN:
			return sim.LBRoundRobin, source, nil
		case networkingapi.LoadBalancerSettings_RANDOM:
			return sim.LBRandom, source, nil
		default:
			return "", "", fmt.Errorf("%w: %s sets the balancer %s, which the simulator does not model (it models LEAST_REQUEST, ROUND_ROBIN and RANDOM); a prediction would not apply to this Service", errUnsupportedBalancer, source, lb.GetSimple())
		}
	}
	return "", "", nil
}
