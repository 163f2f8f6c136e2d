package whatif

import (
	"fmt"
	"math"
)

// readKubeStateMetrics reads the pods' CPU limits and nodes, the nodes' CPU counts and instance
// types, and the endpoint weights the operator publishes, where those series exist.
func (q *queries) readKubeStateMetrics(m *Measurements) error {
	rng := promDuration(m.To.Sub(m.From))
	var names []string
	for _, p := range m.Pods {
		names = append(names, p.Name)
	}
	podSel := `namespace="` + quote(m.Namespace) + `", pod=~"` + alternation(names) + `"`
	limits, err := q.instant(fmt.Sprintf(`sum by (pod) (max_over_time(kube_pod_container_resource_limits{%s, resource="cpu", container!="istio-proxy"}[%s]))`, podSel, rng), m.To)
	if err != nil {
		return err
	}
	nodes, err := q.instant(fmt.Sprintf(`max by (pod, node) (max_over_time(kube_pod_info{%s, node!=""}[%s]))`, podSel, rng), m.To)
	if err != nil {
		return err
	}
	weights, err := q.instant(fmt.Sprintf(`max by (pod) (last_over_time(adaptivelb_endpoint_weight{%s}[%s]))`, podSel, rng), m.To)
	if err != nil {
		return err
	}
	byPod := map[string]*PodMeasurement{}
	for i := range m.Pods {
		byPod[m.Pods[i].Name] = &m.Pods[i]
	}
	for _, s := range limits {
		if p := byPod[string(s.Metric["pod"])]; p != nil && s.Value > 0 {
			p.CPULimit, p.HasCPULimit, p.CPULimitOrigin = float64(s.Value), true, FromKubeStateMetrics
		}
	}
	var nodeNames []string
	for _, s := range nodes {
		if p := byPod[string(s.Metric["pod"])]; p != nil {
			p.Node = string(s.Metric["node"])
			nodeNames = append(nodeNames, p.Node)
		}
	}
	for _, s := range weights {
		if s.Value >= 1 {
			if m.CurrentWeights == nil {
				m.CurrentWeights = map[string]int{}
			}
			m.CurrentWeights[string(s.Metric["pod"])] = int(math.Round(float64(s.Value)))
		}
	}
	if len(nodeNames) == 0 {
		return nil
	}
	nodeSel := `node=~"` + alternation(nodeNames) + `"`
	cores, err := q.instant(fmt.Sprintf(`max by (node) (max_over_time(kube_node_status_capacity{%s, resource="cpu"}[%s]))`, nodeSel, rng), m.To)
	if err != nil {
		return err
	}
	types, err := q.instant(fmt.Sprintf(`max by (node, label_node_kubernetes_io_instance_type) (max_over_time(kube_node_labels{%s}[%s]))`, nodeSel, rng), m.To)
	if err != nil {
		return err
	}
	coresOf, typeOf := map[string]float64{}, map[string]string{}
	for _, s := range cores {
		coresOf[string(s.Metric["node"])] = float64(s.Value)
	}
	for _, s := range types {
		typeOf[string(s.Metric["node"])] = string(s.Metric["label_node_kubernetes_io_instance_type"])
	}
	for i := range m.Pods {
		p := &m.Pods[i]
		if c, ok := coresOf[p.Node]; ok && c > 0 {
			p.NodeCores, p.NodeCoresOrigin = c, FromKubeStateMetrics
		}
		if t := typeOf[p.Node]; t != "" {
			p.InstanceType, p.InstanceTypeFrom = t, FromKubeStateMetrics
		}
	}
	return nil
}
