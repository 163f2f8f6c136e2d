package chart

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// renderRelease renders the chart as release name in the namespace adaptive-lb-system, with the
// ServiceMonitor API available, and keys the objects by kind/name.
func renderRelease(t *testing.T, name string, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	return renderWith(t, name, []string{"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}, sets...)
}

// containerArgs returns the first container's arguments of a Deployment or Job.
func containerArgs(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	if o == nil {
		t.Fatal("object missing")
	}
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	return toStrings(containers[0].(map[string]any)["args"])
}

// leaseNames returns the Lease names a Role's rules grant.
func leaseNames(o *unstructured.Unstructured) []string {
	var out []string
	rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
	for _, r := range rules {
		out = append(out, toStrings(r.(map[string]any)["resourceNames"])...)
	}
	return out
}

// Issue 21.9: two releases in one namespace each elect their own leader: the operator, the
// watchdog and the uninstall hook of each name the release's Lease, and only it and its heartbeat
// are granted.
func TestChart_EachReleaseHasItsOwnLeaderLease(t *testing.T) {
	seen := map[string]string{}
	for _, release := range []string{"lb", "other"} {
		objs := renderRelease(t, release)
		lease := release + "-adaptive-lb"
		want := "--leader-election-id=" + lease
		for _, k := range []string{"Deployment/" + release + "-adaptive-lb", "Deployment/" + release + "-adaptive-lb-failsafe", "Job/" + release + "-adaptive-lb-uninstall"} {
			if args := containerArgs(t, objs[k]); !slices.Contains(args, want) {
				t.Errorf("release %s: %s runs with %v, want %s", release, k, args, want)
			}
		}
		for _, k := range []string{"Role/" + release + "-adaptive-lb-failsafe-lease", "Role/" + release + "-adaptive-lb-uninstall"} {
			if names := leaseNames(objs[k]); strings.Join(names, ",") != lease+","+lease+"-heartbeat" {
				t.Errorf("release %s: %s grants the Leases %v, want only %s and its heartbeat", release, k, names, lease)
			}
		}
		if other, ok := seen[lease]; ok {
			t.Errorf("releases %s and %s share the Lease %s", other, release, lease)
		}
		seen[lease] = release
	}
	if args := containerArgs(t, renderRelease(t, "lb", "leaderElection.id=adaptive-lb.adaptivelb.io")["Deployment/lb-adaptive-lb"]); !slices.Contains(args, "--leader-election-id=adaptive-lb.adaptivelb.io") {
		t.Errorf("leaderElection.id is not passed on: %v", args)
	}
}

// Issue 21.9: the ServiceMonitor sends Prometheus's ServiceAccount token only to an endpoint whose
// certificate it verifies: without a certificate for the metrics endpoint the chart refuses it.
func TestChart_TheServiceMonitorVerifiesTheOperatorsCertificate(t *testing.T) {
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	out, err := exec.Command(helm, "template", "lb", chartDir, "--kube-version", "1.36.3", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
		"--set", "metrics.serviceMonitor.enabled=true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "metrics.serviceMonitor.enabled needs metrics.tls.secret") {
		t.Fatalf("a ServiceMonitor without a verifiable certificate: err %v, output %s", err, out)
	}

	objs := renderRelease(t, "lb", "metrics.serviceMonitor.enabled=true", "metrics.tls.secret=lb-metrics-tls")
	sm := objs["ServiceMonitor/lb-adaptive-lb"]
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	tls := endpoints[0].(map[string]any)["tlsConfig"].(map[string]any)
	if skip, _ := tls["insecureSkipVerify"].(bool); skip {
		t.Fatalf("the ServiceMonitor skips verification: %v", tls)
	}
	caName, _, _ := unstructured.NestedString(tls, "ca", "secret", "name")
	caKey, _, _ := unstructured.NestedString(tls, "ca", "secret", "key")
	if caName != "lb-metrics-tls" || caKey != "ca.crt" || tls["serverName"] != "lb-adaptive-lb-metrics.adaptive-lb-system.svc" {
		t.Fatalf("tlsConfig %v: want the Secret's ca.crt and the metrics Service's name", tls)
	}
	dep := objs["Deployment/lb-adaptive-lb"]
	if !slices.Contains(containerArgs(t, dep), "--metrics-cert-dir=/var/run/secrets/metrics/tls") {
		t.Fatalf("the operator does not serve the Secret's certificate: %v", containerArgs(t, dep))
	}
	volumes, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
	found := false
	for _, v := range volumes {
		name, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
		found = found || name == "lb-metrics-tls"
	}
	if !found {
		t.Fatalf("the Secret is not mounted: %v", volumes)
	}
}
