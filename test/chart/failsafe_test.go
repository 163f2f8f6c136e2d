package chart

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// configObjects reads the objects of one multi-document YAML file under config/.
func configObjects(t *testing.T, path string) map[string]*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) > 0 {
			out[u.GetKind()+"/"+u.GetName()] = u
		}
	}
	return out
}

// The watchdog runs as its own ServiceAccount with the same narrow rights as config/rbac gives it,
// and the uninstall hook deletes the ServiceEntries after the release's resources are gone.
func TestChart_FailsafeWatchdogAndUninstallHook(t *testing.T) {
	objs := render(t)
	config := configObjects(t, "../../config/rbac/failsafe.yaml")
	for chartName, configName := range map[string]string{
		"ClusterRole/lb-adaptive-lb-failsafe":  "ClusterRole/adaptive-lb-failsafe",
		"Role/lb-adaptive-lb-failsafe-lease":   "Role/adaptive-lb-failsafe-lease",
		"ClusterRole/lb-adaptive-lb-uninstall": "ClusterRole/adaptive-lb-failsafe",
		"Role/lb-adaptive-lb-uninstall":        "Role/adaptive-lb-failsafe-lease",
	} {
		got, want := objs[chartName], config[configName]
		if got == nil || want == nil {
			t.Fatalf("%s or %s missing; chart has %v", chartName, configName, keys(objs))
		}
		if strings.HasSuffix(configName, "-lease") {
			// The chart names the Lease (and its heartbeat) after the release; config/ keeps the
			// operator's default.
			want = withLeaseName(t, want, "lb-adaptive-lb")
		}
		if !reflect.DeepEqual(got.Object["rules"], want.Object["rules"]) {
			t.Errorf("%s rules %v differ from config/rbac/failsafe.yaml's %v", chartName, got.Object["rules"], want.Object["rules"])
		}
	}
	dep := objs["Deployment/lb-adaptive-lb-failsafe"]
	if dep == nil {
		t.Fatal("no watchdog Deployment")
	}
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args := toStrings(containers[0].(map[string]any)["args"])
	if sa != "lb-adaptive-lb-failsafe" || strings.Join(args, " ") != "failsafe --leader-election-namespace=adaptive-lb-system --leader-election-id=lb-adaptive-lb --stale-after=3m --check-interval=15s --log-level=info" {
		t.Fatalf("watchdog runs as %q with %v", sa, args)
	}
	for _, k := range []string{"ServiceAccount/lb-adaptive-lb-uninstall", "ClusterRole/lb-adaptive-lb-uninstall", "ClusterRoleBinding/lb-adaptive-lb-uninstall", "Role/lb-adaptive-lb-uninstall", "RoleBinding/lb-adaptive-lb-uninstall", "Job/lb-adaptive-lb-uninstall"} {
		o := objs[k]
		if o == nil || o.GetAnnotations()["helm.sh/hook"] != "post-delete" {
			t.Fatalf("%s is not a post-delete hook: %v", k, o)
		}
	}

	// Both can be turned off; the watchdog cannot run without the Lease it watches.
	objs = render(t, "failsafe.enabled=false", "uninstallHook.enabled=false")
	for k := range objs {
		if strings.Contains(k, "failsafe") || strings.Contains(k, "uninstall") {
			t.Errorf("%s rendered while turned off", k)
		}
	}
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	out, err := exec.Command(helm, "template", "lb", chartDir, "--kube-version", "1.36.3", "--set", "leaderElection.enabled=false").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "failsafe.enabled needs leaderElection.enabled") {
		t.Errorf("watchdog without leader election: err %v, output %s", err, out)
	}
}

// renderNamespaced renders the chart and keys the objects by kind/namespace/name.
func renderNamespaced(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	args := []string{"template", "lb", chartDir, "--namespace", "adaptive-lb-system", "--kube-version", "1.36.3"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, u := range testtools.Render(t, helm, args...) {
		objs[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u
	}
	return objs
}

// watchNamespaces turns the operator's, the watchdog's and the hook's ClusterRoles into Roles in
// those namespaces; only reading nodes stays cluster-wide.
func TestChart_WatchNamespacesRendersRolesInsteadOfClusterRoles(t *testing.T) {
	objs := renderNamespaced(t, "watchNamespaces={shop,web}")
	data, err := os.ReadFile("../../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	generated := configObjects(t, "../../config/rbac/role.yaml")["ClusterRole/adaptive-lb"]
	if generated == nil || len(data) == 0 {
		t.Fatal("config/rbac/role.yaml has no ClusterRole adaptive-lb")
	}
	for _, ns := range []string{"shop", "web"} {
		role := objs["Role/"+ns+"/lb-adaptive-lb"]
		if role == nil || !reflect.DeepEqual(role.Object["rules"], generated.Object["rules"]) {
			t.Fatalf("namespace %s: operator Role %v", ns, role)
		}
		for _, k := range []string{"RoleBinding/" + ns + "/lb-adaptive-lb", "Role/" + ns + "/lb-adaptive-lb-failsafe", "RoleBinding/" + ns + "/lb-adaptive-lb-failsafe",
			"Role/" + ns + "/lb-adaptive-lb-uninstall-serviceentries", "RoleBinding/" + ns + "/lb-adaptive-lb-uninstall-serviceentries"} {
			if objs[k] == nil {
				t.Errorf("%s missing", k)
			}
		}
	}
	var clusterRoles []string
	for k := range objs {
		if strings.HasPrefix(k, "ClusterRole/") {
			clusterRoles = append(clusterRoles, k)
		}
	}
	// Only nodes (and the metrics endpoint's token and access reviews, which are cluster-scoped
	// by nature) are granted cluster-wide.
	for _, k := range clusterRoles {
		switch k {
		case "ClusterRole//lb-adaptive-lb-nodes", "ClusterRole//lb-adaptive-lb-metrics-auth", "ClusterRole//lb-adaptive-lb-metrics-reader":
		default:
			t.Errorf("%s rendered in namespace-restricted mode", k)
		}
	}
	dep := objs["Deployment/adaptive-lb-system/lb-adaptive-lb"]
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if args := strings.Join(toStrings(containers[0].(map[string]any)["args"]), " "); !strings.Contains(args, "--watch-namespaces=shop,web") {
		t.Errorf("operator args %s", args)
	}
	wd := objs["Deployment/adaptive-lb-system/lb-adaptive-lb-failsafe"]
	containers, _, _ = unstructured.NestedSlice(wd.Object, "spec", "template", "spec", "containers")
	if args := strings.Join(toStrings(containers[0].(map[string]any)["args"]), " "); !strings.Contains(args, "--namespaces=shop,web") {
		t.Errorf("watchdog args %s", args)
	}
}

// withLeaseName is a copy of the Lease Role role whose rules name the Lease lease.
func withLeaseName(t *testing.T, role *unstructured.Unstructured, lease string) *unstructured.Unstructured {
	t.Helper()
	c := role.DeepCopy()
	rules, _, _ := unstructured.NestedSlice(c.Object, "rules")
	for _, r := range rules {
		if _, ok := r.(map[string]any)["resourceNames"]; ok {
			r.(map[string]any)["resourceNames"] = []any{lease, lease + "-heartbeat"}
		}
	}
	if err := unstructured.SetNestedSlice(c.Object, rules, "rules"); err != nil {
		t.Fatal(err)
	}
	return c
}
