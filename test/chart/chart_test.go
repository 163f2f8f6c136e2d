// Package chart tests the Helm chart: rendered with the real helm CLI, checked against the
// operator's generated RBAC and CRD, and applied to a real API server.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

const chartDir = "../../charts/adaptive-lb"

// render runs helm template with --set flags and returns the objects by kind/name.
func render(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	return renderWith(t, "lb", []string{"--include-crds"}, sets...)
}

// renderWith renders the chart as release in the namespace adaptive-lb-system with the extra helm
// flags and the values sets, and keys the objects by kind/name.
func renderWith(t *testing.T, release string, flags []string, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	// --kube-version: a helm built from source assumes Kubernetes 1.20 when not talking to a cluster.
	args := append([]string{"template", release, chartDir, "--namespace", "adaptive-lb-system", "--kube-version", "1.36.3"}, flags...)
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, u := range testtools.Render(t, helm, args...) {
		objs[u.GetKind()+"/"+u.GetName()] = u
	}
	return objs
}

func TestChart_ClusterRoleIsExactlyTheOperatorsGeneratedRole(t *testing.T) {
	objs := render(t)
	role := objs["ClusterRole/lb-adaptive-lb"]
	if role == nil {
		t.Fatalf("no ClusterRole rendered; got %v", keys(objs))
	}
	data, err := os.ReadFile("../../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var generated map[string]any
	if err := yaml.Unmarshal(data, &generated); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Object["rules"], generated["rules"]) {
		t.Fatalf("chart rules differ from config/rbac/role.yaml (run make manifests):\n%v\n%v", role.Object["rules"], generated["rules"])
	}
	// The Role in istiod's namespace is the generated one, bound to the operator.
	istioRole := configObjects(t, "../../config/rbac/role.yaml")["Role/adaptive-lb"]
	rendered := objs["Role/lb-adaptive-lb-istio"]
	if istioRole == nil || rendered == nil || rendered.GetNamespace() != "istio-system" || !reflect.DeepEqual(rendered.Object["rules"], istioRole.Object["rules"]) {
		t.Fatalf("the Role in istio-system %v differs from config/rbac/role.yaml's %v (run make manifests)", rendered, istioRole)
	}
	if b := objs["RoleBinding/lb-adaptive-lb-istio"]; b == nil || b.GetNamespace() != "istio-system" {
		t.Fatalf("RoleBinding in istio-system %v", b)
	}
	// The lease Role stays in the release namespace.
	lease := objs["Role/lb-adaptive-lb-leader-election"]
	if lease == nil || lease.GetNamespace() != "adaptive-lb-system" {
		t.Fatalf("leader-election Role %v", lease)
	}
}

func TestChart_CRDIsTheGeneratedOne(t *testing.T) {
	a, err := os.ReadFile(filepath.Join(chartDir, "crds", "adaptivelb.io_adaptiveloadbalancers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../config/crd/bases/adaptivelb.io_adaptiveloadbalancers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("charts/adaptive-lb/crds differs from config/crd/bases: run make manifests")
	}
}

func TestChart_DeploymentIsHardenedAndConfigured(t *testing.T) {
	objs := render(t, "tsdb.url=http://vmselect:8481", "tsdb.pathPrefix=/select/0/prometheus", "tsdb.headers.X-Scope-OrgID=team-a", "tsdb.bearerTokenSecret=tsdb-token",
		"tsdb.tls.secret=tsdb-tls", "tsdb.tls.clientCert=true", "metrics.endpointWeights=false")
	d := objs["Deployment/lb-adaptive-lb"]
	if d == nil {
		t.Fatalf("no Deployment; got %v", keys(objs))
	}
	if r, _, _ := unstructured.NestedFieldNoCopy(d.Object, "spec", "replicas"); fmt.Sprint(r) != "2" {
		t.Fatalf("replicas %v, want 2 (a warm standby)", r)
	}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"run", "--leader-elect", "--leader-election-namespace=adaptive-lb-system", "--tsdb-url=http://vmselect:8481",
		"--tsdb-path-prefix=/select/0/prometheus", "--tsdb-header=X-Scope-OrgID=team-a", "--tsdb-bearer-token-file=/var/run/secrets/tsdb/token/token",
		"--metrics-bind-address=:8443", "--health-probe-bind-address=:8081", "--write-budget=50",
		"--tsdb-tls-ca-file=/var/run/secrets/tsdb/tls/ca.crt", "--tsdb-tls-cert-file=/var/run/secrets/tsdb/tls/tls.crt",
		"--tsdb-tls-key-file=/var/run/secrets/tsdb/tls/tls.key", "--endpoint-weight-metrics=false", "--mesh-multi-cluster=auto",
		"--tsdb-scrape-interval=15s", "--fast-check-window=30s", "--load-history=72h", "--load-history-refresh=1h"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	// The check between cycles' interval is the operator's default unless set: it turns the
	// check off where tsdb.latencyOffset reads data a scrape or more old.
	if strings.Contains(args, "--fast-check-interval") || strings.Contains(args, "--tsdb-history-query") {
		t.Errorf("args %q set --fast-check-interval or --tsdb-history-query without their values", args)
	}
	off := render(t, "tsdb.url=http://vmselect:8481", "fastCheck.interval=0s")
	oc, _, _ := unstructured.NestedSlice(off["Deployment/lb-adaptive-lb"].Object, "spec", "template", "spec", "containers")
	if a := strings.Join(toStrings(oc[0].(map[string]any)["args"]), " "); !strings.Contains(a, "--fast-check-interval=0s") {
		t.Errorf("fastCheck.interval=0s renders args %q, want --fast-check-interval=0s", a)
	}
	sc := c["securityContext"].(map[string]any)
	if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false || !reflect.DeepEqual(sc["capabilities"], map[string]any{"drop": []any{"ALL"}}) {
		t.Errorf("container securityContext %v", sc)
	}
	podSC, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec", "securityContext")
	if podSC["runAsNonRoot"] != true {
		t.Errorf("pod securityContext %v", podSC)
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		if c[probe] == nil {
			t.Errorf("no %s", probe)
		}
	}
	// Without a TSDB URL the operator only mirrors: no --tsdb flags.
	plain := render(t)
	pc, _, _ := unstructured.NestedSlice(plain["Deployment/lb-adaptive-lb"].Object, "spec", "template", "spec", "containers")
	if strings.Contains(strings.Join(toStrings(pc[0].(map[string]any)["args"]), " "), "--tsdb") {
		t.Error("tsdb flags rendered without tsdb.url")
	}
	// Optional monitoring objects need their CRDs; off by default.
	if _, ok := plain["PrometheusRule/lb-adaptive-lb"]; ok {
		t.Error("PrometheusRule rendered by default")
	}
	if single := render(t, "replicaCount=1", "leaderElection.enabled=false", "failsafe.enabled=false"); single["Role/lb-adaptive-lb-leader-election"] != nil {
		t.Error("leader-election Role rendered with leader election off")
	}
	// A basic-auth username without its password Secret is refused, not rendered half-wired.
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	out, err := exec.Command(helm, "template", "lb", chartDir, "--kube-version", "1.36.3", "--set", "tsdb.url=http://vm:8428", "--set", "tsdb.basicAuth.username=op").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "tsdb.basicAuth.username needs tsdb.basicAuth.passwordSecret") {
		t.Errorf("basic auth without a password Secret: err %v, output %s", err, out)
	}
}

func TestChart_AppliesToARealAPIServer(t *testing.T) {
	testtools.RequireEnv(t, "KUBEBUILDER_ASSETS", "kube-apiserver and etcd")
	objs := render(t, "tsdb.url=http://vmselect:8481")
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Istio is installed first: the chart's Role for istiod's ConfigMap lives in its namespace.
	for _, name := range []string{"adaptive-lb-system", "istio-system"} {
		ns := &unstructured.Unstructured{}
		ns.SetAPIVersion("v1")
		ns.SetKind("Namespace")
		ns.SetName(name)
		if err := c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	// CRDs first, as helm installs them.
	names := keys(objs)
	sort.SliceStable(names, func(i, j int) bool {
		return strings.HasPrefix(names[i], "CustomResourceDefinition/") && !strings.HasPrefix(names[j], "CustomResourceDefinition/")
	})
	for _, k := range names {
		if err := c.Create(ctx, objs[k]); err != nil {
			t.Fatalf("apply %s: %v", k, err)
		}
	}
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// A node drain may evict the leader or the standby, never both at once; a single replica has no
// budget (it would block every drain).
func TestChart_PodDisruptionBudgetKeepsOneReplica(t *testing.T) {
	pdb := render(t)["PodDisruptionBudget/lb-adaptive-lb"]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget for 2 replicas")
	}
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("maxUnavailable %v, want 1", v)
	}
	sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	d := render(t)["Deployment/lb-adaptive-lb"]
	podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the budget selects %s=%s, which the operator's pods do not carry (%v)", k, v, podLabels)
		}
	}
	if len(sel) == 0 {
		t.Error("the budget selects nothing")
	}
	if render(t, "replicaCount=1")["PodDisruptionBudget/lb-adaptive-lb"] != nil {
		t.Error("a single replica got a budget that would block every drain")
	}
}

func TestChart_MetricsReaderRoleGrantsOnlyTheMetricsEndpoint(t *testing.T) {
	objs := render(t)
	role := objs["ClusterRole/lb-adaptive-lb-metrics-reader"]
	if role == nil {
		t.Fatalf("no metrics-reader ClusterRole rendered; got %v", keys(objs))
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	if len(rules) != 1 {
		t.Fatalf("rules %v", rules)
	}
	rule := rules[0].(map[string]any)
	if urls, verbs := toStrings(rule["nonResourceURLs"]), toStrings(rule["verbs"]); !reflect.DeepEqual(urls, []string{"/metrics"}) || !reflect.DeepEqual(verbs, []string{"get"}) || len(rule) != 2 {
		t.Fatalf("the metrics-reader role grants %v, want only get on /metrics", rule)
	}
}
