package istio

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// exportTo is where the ServiceEntry is visible: the requested namespaces, never wider than the
// Service's own visibility, which is its exportTo annotation, or else the mesh's
// defaultServiceExportTo, or else every namespace. Where the Service is not visible the
// ServiceEntry would be a new Service of its own: new clusters and listeners for proxies that
// had none. An empty result leaves the ServiceEntry's exportTo unset: istiod then applies the
// mesh's defaultServiceExportTo, as to the Service, which is what a Service without an exportTo
// annotation and an AdaptiveLoadBalancer asking for nothing narrower need.
func exportTo(svc *corev1.Service, requested []string, mesh Mesh) ([]string, error) {
	out, err := exportToAll(svc, requested, mesh)
	if err != nil {
		return nil, err
	}
	// "~" exports to no namespace. Alone, the ServiceEntry would be visible nowhere, its weights
	// applied to no proxy, while the status reported them mirrored; beside namespaces it adds
	// nothing (and istiod refuses the combination).
	visible := slices.DeleteFunc(slices.Clone(out), func(ns string) bool { return ns == "~" })
	if len(visible) == 0 {
		return nil, fmt.Errorf("%w: service %s/%s is exported to no namespace (%s, spec.exportTo %v); the weights would apply nowhere. Export it to the namespaces of its clients", ErrUnsupported, svc.Namespace, svc.Name, serviceVisibilitySource(svc, mesh), requested)
	}
	if strings.TrimSpace(svc.Annotations[ExportToAnnotation]) == "" && (len(requested) == 0 || slices.Contains(requested, "*")) {
		return nil, nil
	}
	return visible, nil
}

// ServiceVisibility is the Service's own exportTo: its annotation, else the mesh's
// defaultServiceExportTo, else every namespace ("." is the Service's namespace).
func ServiceVisibility(svc *corev1.Service, mesh Mesh) []string {
	var annotated []string
	for _, ns := range strings.Split(svc.Annotations[ExportToAnnotation], ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			annotated = append(annotated, ns)
		}
	}
	switch {
	case len(annotated) > 0:
		return annotated
	case len(mesh.DefaultServiceExportTo) > 0:
		return slices.Clone(mesh.DefaultServiceExportTo)
	}
	return []string{"*"}
}

// serviceVisibilitySource says where the Service's visibility comes from, for messages.
func serviceVisibilitySource(svc *corev1.Service, mesh Mesh) string {
	if v, ok := svc.Annotations[ExportToAnnotation]; ok && strings.TrimSpace(v) != "" {
		return fmt.Sprintf("its %s annotation %q", ExportToAnnotation, v)
	}
	if len(mesh.DefaultServiceExportTo) > 0 {
		return fmt.Sprintf("the mesh's defaultServiceExportTo %v", mesh.DefaultServiceExportTo)
	}
	return "visible in every namespace"
}

// exportToAll is exportTo before the "~" entries are dropped.
func exportToAll(svc *corev1.Service, requested []string, mesh Mesh) ([]string, error) {
	service := ServiceVisibility(svc, mesh)
	switch {
	case slices.Contains(service, "*"):
		if len(requested) == 0 {
			return []string{"*"}, nil
		}
		return slices.Clone(requested), nil
	case len(requested) == 0 || slices.Contains(requested, "*"):
		return service, nil
	}
	// Both name namespaces: keep those in both, "." being the Service's own namespace.
	own := func(ns string) string {
		if ns == "." {
			return svc.Namespace
		}
		return ns
	}
	visible := map[string]bool{}
	for _, ns := range service {
		visible[own(ns)] = true
	}
	var out []string
	for _, ns := range requested {
		if visible[own(ns)] && ns != "~" {
			out = append(out, ns)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: spec.exportTo %v shares no namespace with service %s/%s's visibility (%s); the weights would apply nowhere. Export to namespaces the Service is visible in", ErrUnsupported, requested, svc.Namespace, svc.Name, serviceVisibilitySource(svc, mesh))
	}
	return out, nil
}

// visibleTogether reports whether a proxy in some namespace can see both objects: one in
// namespace a exported to aTo, the other in b exported to bTo (each already resolved: an unset
// exportTo replaced by its default).
func visibleTogether(a string, aTo []string, b string, bTo []string) bool {
	resolve := func(ns string, to []string) (all bool, set map[string]bool) {
		set = map[string]bool{}
		for _, x := range to {
			switch x {
			case "*":
				return true, nil
			case "~":
			case ".":
				set[ns] = true
			default:
				set[x] = true
			}
		}
		return false, set
	}
	aAll, aSet := resolve(a, aTo)
	bAll, bSet := resolve(b, bTo)
	switch {
	case aAll && bAll:
		return true
	case aAll:
		return len(bSet) > 0
	case bAll:
		return len(aSet) > 0
	}
	for ns := range aSet {
		if bSet[ns] {
			return true
		}
	}
	return false
}
