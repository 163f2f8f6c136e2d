package main

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// The Helm chart and the kustomize manifests pass flags to `adaptive-lb run`; a flag renamed or
// removed in the binary would crash-loop every install. Each rendered argument list is parsed
// by the run command's own flag set, as the binary parses it at start-up.
func TestDeployFlags_EveryFlagTheManifestsPassExists(t *testing.T) {
	sources := map[string][]string{}
	if helm := os.Getenv("ADAPTIVELB_HELM_BIN"); helm != "" || os.Getenv("CI") != "" {
		// Every toggle that adds an argument is on.
		sources["helm chart"] = operatorArgs(t, testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm"), "template", "lb", "../../charts/adaptive-lb",
			"--namespace", "adaptive-lb-system", "--kube-version", "1.36.3",
			"--set", "leaderElection.enabled=true",
			"--set", "tsdb.url=http://vmselect.monitoring:8481",
			"--set", "tsdb.pathPrefix=/select/0/prometheus",
			"--set", "tsdb.headers.X-Scope-OrgID=team-a",
			"--set", "tsdb.bearerTokenSecret=tsdb-token",
			"--set", "tsdb.basicAuth.username=operator",
			"--set", "tsdb.basicAuth.passwordSecret=tsdb-password",
			"--set", "tsdb.tls.secret=tsdb-tls",
			"--set", "tsdb.tls.clientCert=true",
			"--set", "tsdb.tls.serverName=vmselect.monitoring",
			"--set", "tsdb.tls.insecureSkipVerify=true",
			"--set", "tsdb.allowQueryOverrides=true",
			"--set", "fastCheck.interval=15s",
			"--set-string", `tsdb.historyQuery=sum({{.Function}}(istio_requests_total{reporter="destination"\, destination_service_namespace="{{.Namespace}}"\, destination_service_name="{{.Service}}"}[{{.Window}}]))`,
			"--set", "metrics.tls.secret=metrics-tls",
			"--set", "watchNamespaces={shop,web}")
	}
	if kustomize := os.Getenv("ADAPTIVELB_KUSTOMIZE_BIN"); kustomize != "" || os.Getenv("CI") != "" {
		sources["kustomize config/default"] = operatorArgs(t, testtools.RequireEnv(t, "ADAPTIVELB_KUSTOMIZE_BIN", "kustomize"), "build", "../../config/default")
	}
	if len(sources) == 0 {
		t.Skip("ADAPTIVELB_HELM_BIN and ADAPTIVELB_KUSTOMIZE_BIN are not set: run `make test`, which builds helm and kustomize")
	}
	for name, args := range sources {
		t.Run(name, func(t *testing.T) {
			if len(args) == 0 || args[0] != "run" {
				t.Fatalf("the container's args %q do not start with the run command", args)
			}
			cmd := newRunCmd()
			if err := cmd.ParseFlags(args[1:]); err != nil {
				t.Fatalf("adaptive-lb run rejects the manifest's args %q: %v", args, err)
			}
			if rest := cmd.Flags().Args(); len(rest) > 0 {
				t.Fatalf("arguments %q are not flags of adaptive-lb run", rest)
			}
			// Each flag was really set: none was swallowed as another flag's value.
			for _, a := range args[1:] {
				flag := strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0]
				if !cmd.Flags().Changed(flag) {
					t.Errorf("%s: flag %q was not parsed as set", a, flag)
				}
			}
		})
	}
}

// operatorArgs runs a renderer (helm template, kustomize build) and returns the args of the
// operator container of the single Deployment it renders.
func operatorArgs(t *testing.T, bin string, args ...string) []string {
	t.Helper()
	var found [][]string
	for _, u := range testtools.Render(t, bin, args...) {
		if u.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			m, _ := c.(map[string]any)
			if m["name"] != "operator" {
				continue
			}
			var a []string
			for _, v := range m["args"].([]any) {
				a = append(a, v.(string))
			}
			found = append(found, a)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one operator container, found %d in %s %s", len(found), bin, strings.Join(args, " "))
	}
	return found[0]
}
