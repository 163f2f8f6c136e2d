package testtools

import (
	"fmt"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// SecretGrants lists what in objs (rendered manifests) lets a subject read or change Secrets: a
// Role or ClusterRole rule over secrets (by name or by "*", in the core group or "*"), an
// aggregated ClusterRole (its rules come from elsewhere), and a binding to a role the manifests
// do not define (a built-in such as edit or admin grants Secrets). Empty when there is none.
func SecretGrants(objs []*unstructured.Unstructured) ([]string, error) {
	defined := map[string]bool{}
	var grants []string
	for _, o := range objs {
		switch o.GetKind() {
		case "Role", "ClusterRole":
			var role rbacv1.ClusterRole // a Role's fields are a subset
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
				return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
			}
			defined[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = true
			if role.AggregationRule != nil {
				grants = append(grants, fmt.Sprintf("%s %s aggregates rules from other ClusterRoles", o.GetKind(), o.GetName()))
			}
			for _, rule := range role.Rules {
				core := slices.Contains(rule.APIGroups, "") || slices.Contains(rule.APIGroups, "*")
				secrets := slices.Contains(rule.Resources, "secrets") || slices.Contains(rule.Resources, "*")
				if core && secrets {
					grants = append(grants, fmt.Sprintf("%s %s/%s grants %v on %v", o.GetKind(), o.GetNamespace(), o.GetName(), rule.Verbs, rule.Resources))
				}
			}
		}
	}
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var binding rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &binding); err != nil {
			return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		namespace := ""
		if binding.RoleRef.Kind == "Role" {
			namespace = o.GetNamespace()
		}
		if !defined[binding.RoleRef.Kind+"/"+namespace+"/"+binding.RoleRef.Name] {
			grants = append(grants, fmt.Sprintf("%s %s/%s binds %s %s, which these manifests do not define", o.GetKind(), o.GetNamespace(), o.GetName(), binding.RoleRef.Kind, binding.RoleRef.Name))
		}
	}
	return grants, nil
}
