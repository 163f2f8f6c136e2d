package chart

import (
	"strings"
	"testing"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// Whatever the values, no Role or ClusterRole the chart renders lets anyone read Secrets: not
// the operator (istiod's namespace holds the mesh's CA key, istio-ca-secret or cacerts, and every
// remote cluster's kubeconfig), nor the watchdog or the uninstall hook; no binding points at a
// role the chart does not define (a built-in such as edit grants Secrets); no ClusterRole
// aggregates others' rules. The TSDB's and the metrics endpoint's credentials reach the pods as
// mounted volumes, which need no RBAC.
func TestChart_NoRoleGrantsSecrets(t *testing.T) {
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	for name, sets := range map[string][]string{
		"the defaults": nil,
		"watched namespaces, Roles instead of ClusterRoles": {"watchNamespaces={shop,web}"},
		"TSDB credentials, metrics certificate, ServiceMonitor and PrometheusRule, all from Secrets": {"tsdb.url=http://vmselect:8481",
			"tsdb.bearerTokenSecret=tsdb-token", "tsdb.tls.secret=tsdb-tls", "tsdb.tls.clientCert=true", "metrics.tls.secret=metrics-tls",
			"metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true"},
		"a revisioned istiod elsewhere, the mesh told single-cluster": {"istio.namespace=istio-1-29", "istio.meshConfigMap=istio-1-29", "mesh.multiCluster=false"},
		"no watchdog, no uninstall hook, no leader election":          {"failsafe.enabled=false", "uninstallHook.enabled=false", "leaderElection.enabled=false"},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "lb", chartDir, "--namespace", "adaptive-lb-system", "--kube-version", "1.36.3"}
			for _, s := range sets {
				args = append(args, "--set", s)
			}
			objs := testtools.Render(t, helm, args...)
			roles := 0
			for _, o := range objs {
				if o.GetKind() == "Role" || o.GetKind() == "ClusterRole" {
					roles++
				}
			}
			if roles < 4 {
				t.Fatalf("only %d Roles and ClusterRoles rendered: the render is not the chart's", roles)
			}
			grants, err := testtools.SecretGrants(objs)
			if err != nil {
				t.Fatal(err)
			}
			if len(grants) > 0 {
				t.Fatalf("the chart grants access to Secrets:\n%s", strings.Join(grants, "\n"))
			}
		})
	}
}
