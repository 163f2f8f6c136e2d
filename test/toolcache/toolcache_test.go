// Package toolcache tests where `make test` keeps the components it builds (hack/toolcache.sh and
// the Makefile): once per user and version, outside the checkout. Nothing here builds a real
// component: the builds are shell functions that write a file.
package toolcache

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

const repo = "../.."

// components are the names hack/toolcache.sh knows, with the module each one's version comes from.
var components = map[string]string{
	"kube-apiserver":          "k8s.io/kubernetes",
	"etcd":                    "go.etcd.io/etcd/server/v3",
	"kube-controller-manager": "k8s.io/kubernetes",
	"victoria-metrics":        "github.com/VictoriaMetrics/VictoriaMetrics",
	"helm":                    "helm.sh/helm/v3",
	"kustomize":               "sigs.k8s.io/kustomize/kustomize/v5",
	"controller-gen":          "sigs.k8s.io/controller-tools",
	"istio":                   "istio.io/istio",
}

// cleanEnv is the environment without the variables that choose the cache, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "TOOLS_DIR", "XDG_CACHE_HOME", "HOME", "KUBEBUILDER_ASSETS", "ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN",
			"ADAPTIVELB_VMSINGLE_BIN", "ADAPTIVELB_HELM_BIN", "ADAPTIVELB_KUSTOMIZE_BIN", "MAKEFLAGS", "MAKELEVEL", "MFLAGS":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// testEnv runs `make -s test-env` and returns the variables it exports.
func testEnv(t *testing.T, env []string) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(run(t, repo, env, "make", "-s", "test-env")), "\n") {
		m := regexp.MustCompile(`^export (\w+)='(.*)'$`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("make test-env printed %q, not an export", line)
		}
		vars[m[1]] = m[2]
	}
	return vars
}

// pinned reads the version of module that hack/toolcache.sh names the component after.
func pinned(t *testing.T, component string) string {
	t.Helper()
	out := strings.TrimSpace(run(t, repo, cleanEnv("HOME="+t.TempDir()), "hack/toolcache.sh", "id", component))
	m := regexp.MustCompile(`^(v\S+)-[0-9a-f]{12}$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("hack/toolcache.sh id %s = %q, want VERSION-HASH", component, out)
	}
	return m[1]
}

func TestMakefile_ToolsDirIsTheUserCacheDirUnlessSet(t *testing.T) {
	home := t.TempDir()
	userCache := filepath.Join(home, ".cache")
	if runtime.GOOS == "darwin" {
		userCache = filepath.Join(home, "Library", "Caches")
	}
	cases := map[string]struct {
		env  []string
		want string
	}{
		"default":        {cleanEnv("HOME=" + home), filepath.Join(userCache, "adaptive-lb", "tools")},
		"XDG_CACHE_HOME": {cleanEnv("HOME="+home, "XDG_CACHE_HOME=/srv/cache"), "/srv/cache/adaptive-lb/tools"},
		"TOOLS_DIR":      {cleanEnv("HOME="+home, "XDG_CACHE_HOME=/srv/cache", "TOOLS_DIR=/srv/tools"), "/srv/tools"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vars := testEnv(t, tc.env)
			if vars["TOOLS_DIR"] != tc.want {
				t.Fatalf("TOOLS_DIR = %q, want %q", vars["TOOLS_DIR"], tc.want)
			}
			abs, err := filepath.Abs(repo)
			if err != nil {
				t.Fatal(err)
			}
			for name, path := range vars {
				if !strings.HasPrefix(path, tc.want+"/") && name != "TOOLS_DIR" {
					t.Errorf("%s = %q is not under TOOLS_DIR %q", name, path, tc.want)
				}
				if strings.HasPrefix(path, abs+"/") {
					t.Errorf("%s = %q is inside the checkout", name, path)
				}
			}
		})
	}
}

func TestMakefile_EachComponentIsInAFolderOfItsPinnedVersion(t *testing.T) {
	vars := testEnv(t, cleanEnv("HOME="+t.TempDir(), "TOOLS_DIR=/srv/tools"))
	hash := `-[0-9a-f]{12}`
	want := map[string]string{
		"KUBEBUILDER_ASSETS":                     "/srv/tools/envtest/kube-apiserver-" + pinned(t, "kube-apiserver") + hash + "_etcd-" + pinned(t, "etcd") + hash,
		"ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN": "/srv/tools/kube-controller-manager/" + pinned(t, "kube-controller-manager") + hash + "/kube-controller-manager",
		"ADAPTIVELB_VMSINGLE_BIN":                "/srv/tools/victoria-metrics/" + pinned(t, "victoria-metrics") + hash + "/victoria-metrics",
		"ADAPTIVELB_HELM_BIN":                    "/srv/tools/helm/" + pinned(t, "helm") + hash + "/helm",
		"ADAPTIVELB_KUSTOMIZE_BIN":               "/srv/tools/kustomize/" + pinned(t, "kustomize") + hash + "/kustomize",
	}
	for name, pattern := range want {
		if !regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), regexp.QuoteMeta(hash), hash) + "$").MatchString(vars[name]) {
			t.Errorf("%s = %q, want %s", name, vars[name], pattern)
		}
	}
	// The versions are the helper modules' pins.
	for component, module := range map[string]string{"helm": components["helm"], "kube-apiserver": components["kube-apiserver"]} {
		dir := map[string]string{"helm": "hack/helm", "kube-apiserver": "hack/envtest/kube-apiserver"}[component]
		gomod, err := os.ReadFile(filepath.Join(repo, dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^(require)?\s*` + regexp.QuoteMeta(module) + ` ` + regexp.QuoteMeta(pinned(t, component)) + `$`).Match(gomod) {
			t.Errorf("%s is named %s, which %s/go.mod does not pin for %s", component, pinned(t, component), dir, module)
		}
	}
}

// copyHack copies the scripts and helper modules that name the components to a temporary
// checkout, whose pins a test can change.
func copyHack(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	run(t, repo, nil, "cp", "-R", "hack", dst+"/hack")
	return dst
}

func ids(t *testing.T, checkout string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for c := range components {
		out[c] = strings.TrimSpace(run(t, checkout, cleanEnv("HOME="+t.TempDir()), "hack/toolcache.sh", "id", c))
	}
	out["envtest"] = strings.TrimSpace(run(t, checkout, cleanEnv("HOME="+t.TempDir(), "TOOLS_DIR=/t"), "hack/toolcache.sh", "dir", "envtest"))
	return out
}

func TestToolcache_AChangedPinRenamesOnlyThatComponentsFolder(t *testing.T) {
	checkout := copyHack(t)
	before := ids(t, checkout)
	gomod := filepath.Join(checkout, "hack/helm/go.mod")
	data, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	version := pinned(t, "helm")
	changed := strings.Replace(string(data), "helm.sh/helm/v3 "+version, "helm.sh/helm/v3 v9.9.9", 1)
	if changed == string(data) {
		t.Fatalf("hack/helm/go.mod does not pin helm.sh/helm/v3 %s", version)
	}
	if err := os.WriteFile(gomod, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	// A changed dependency of etcd's helper module, without a new etcd version.
	if err := os.WriteFile(filepath.Join(checkout, "hack/envtest/etcd/go.sum"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	after := ids(t, checkout)
	for c := range before {
		changed := before[c] != after[c]
		wantChanged := c == "helm" || c == "etcd" || c == "envtest"
		if changed != wantChanged {
			t.Errorf("%s: %q became %q; want a new folder %v", c, before[c], after[c], wantChanged)
		}
	}
	if !strings.HasPrefix(after["helm"], "v9.9.9-") {
		t.Errorf("helm's folder %q is not named after the new pin v9.9.9", after["helm"])
	}
	if !strings.HasPrefix(after["etcd"], strings.Split(before["etcd"], "-")[0]+"-") {
		t.Errorf("etcd's folder %q lost its version (was %q)", after["etcd"], before["etcd"])
	}
}

// build runs toolcache_build helm with a fake build function.
func build(t *testing.T, toolsDir, function string) (string, error) {
	t.Helper()
	script := `set -euo pipefail
source hack/toolcache.sh
` + function + `
toolcache_build helm "the chart tests" fake helm`
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = repo, cleanEnv("HOME="+t.TempDir(), "TOOLS_DIR="+toolsDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestToolcache_OnlyACompleteBuildCountsAsBuilt(t *testing.T) {
	tools := t.TempDir()
	dest := filepath.Join(tools, "helm", pinned(t, "helm")) // + "-HASH"
	built := func() []string {
		m, _ := filepath.Glob(dest + "-*")
		return m
	}

	// A build that fails half-way leaves nothing that counts as built.
	out, err := build(t, tools, `fake() { echo half > "$1/helm"; false; echo never; }`)
	if err == nil || len(built()) != 0 {
		t.Fatalf("a failed build succeeded or left %v:\n%s", built(), out)
	}
	if !strings.Contains(out, "failed (see above); nothing was cached") {
		t.Errorf("the failure does not say that nothing was cached:\n%s", out)
	}
	// So does one that is killed: its temporary folder is cleared by the next build, once its
	// builder is gone; the folder of a build still running (another checkout's) is left alone.
	id := strings.TrimSpace(run(t, repo, cleanEnv("HOME="+t.TempDir()), "hack/toolcache.sh", "id", "helm"))
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	killed := filepath.Join(tools, "helm", fmt.Sprintf(".building-%s.pid%d.abcdef", id, gone.Process.Pid))
	running := filepath.Join(tools, "helm", fmt.Sprintf(".building-%s.pid%d.abcdef", id, os.Getpid()))
	for _, dir := range []string{killed, running} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// A build that succeeds says what it builds, for what and roughly how long it takes.
	out, err = build(t, tools, `fake() { echo binary > "$1/helm"; }`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^Building helm v\S+ \(the chart tests\) into ` + regexp.QuoteMeta(tools) + `/helm/v\S+: (about \d+ min|under a minute) on 2 cores[^,]*, once per user and version\.\.\.$`).MatchString(out) {
		t.Errorf("the build does not say what it builds and how long it takes:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^Built helm v\S+ in \d+ min \d+ s\.$`).MatchString(out) {
		t.Errorf("the build does not say how long it took:\n%s", out)
	}
	if got := built(); len(got) != 1 {
		t.Fatalf("built folders %v, want one", got)
	}
	if _, err := os.Stat(killed); !os.IsNotExist(err) {
		t.Errorf("the killed build's folder %s is still there", killed)
	}
	if _, err := os.Stat(running); err != nil {
		t.Errorf("the folder of a build still running was removed: %v", err)
	}
	if err := os.Remove(running); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(tools, "helm"))
	if len(entries) != 1 {
		t.Errorf("the helm folder holds %d entries, want the built version only", len(entries))
	}

	// A built version is not built again.
	out, err = build(t, tools, `fake() { echo rebuilt; false; }`)
	if err != nil || out != "" {
		t.Fatalf("a built version was built again (err %v):\n%s", err, out)
	}

	// A folder emptied by hand is built again.
	if err := os.Remove(filepath.Join(built()[0], "helm")); err != nil {
		t.Fatal(err)
	}
	if out, err = build(t, tools, `fake() { echo binary > "$1/helm"; }`); err != nil || !strings.Contains(out, "Built helm") {
		t.Fatalf("an emptied folder was not built again (err %v):\n%s", err, out)
	}
}
