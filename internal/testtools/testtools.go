// Package testtools holds what the tests of several packages share to reach the real components
// `make test` builds (kube-apiserver and etcd, helm, kustomize): finding them, and reading the
// manifests they render. Only tests import it.
package testtools

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// RequireEnv returns the value of env, which names a component `make test` builds (what says
// which). Outside CI a missing one skips the test with the command that builds it; in CI
// (CI set) it fails, so a broken build step cannot pass as skipped tests.
func RequireEnv(t testing.TB, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: run `make test`, which builds %s", env, what)
		}
		t.Skipf("%s is not set: run `make test`, which builds %s", env, what)
	}
	return v
}

// Render runs a renderer (helm template, kustomize build) and decodes the YAML documents it
// prints, in its order, leaving out empty ones.
func Render(t testing.TB, bin string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s %s printed something that is not YAML: %v", bin, strings.Join(args, " "), err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}
