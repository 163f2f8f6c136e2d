package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// whatIfCluster creates, in a real API server, Service web in namespace ns with the outlier
// scenario's pods: each on a node of its own named ip-10-0-0-N (not the exported series' node
// names, so that the cluster's facts are seen to win), with a CPU limit of 1 on the app container
// and an istio-proxy sidecar (limit 2, which is not the app's) when sidecars is true, 4 CPUs per
// node, and the instance types m6i.xlarge (fast) and m4.xlarge (outlier).
func whatIfCluster(t *testing.T, c client.Client, ns string, sidecars bool) {
	t.Helper()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(c.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}))
	pods := []string{"outlier-0"}
	for i := range 11 {
		pods = append(pods, fmt.Sprintf("fast-%d", i))
	}
	for i, name := range pods {
		node := fmt.Sprintf("%s-ip-10-0-0-%d", ns, i+1)
		instanceType := "m6i.xlarge"
		if strings.HasPrefix(name, "outlier") {
			instanceType = "m4.xlarge"
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{corev1.LabelInstanceTypeStable: instanceType}}}
		must(c.Create(ctx, n))
		n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
		must(c.Status().Update(ctx, n))
		containers := []corev1.Container{{Name: "app", Image: "app", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}
		if sidecars {
			containers = append(containers, corev1.Container{Name: "istio-proxy", Image: "proxyv2", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}})
		}
		must(c.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: containers},
		}))
	}
}

func whatIfClient(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := restConfigFrom(kubeconfig, "test")
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := networkingv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSimulateFromTSDB_ReadsTheCluster(t *testing.T) {
	env, _ := startAPIServer(t, istioCRDPath(t))
	kubeconfig := kubeconfigFile(t, env, "")
	c := whatIfClient(t, kubeconfig)
	vm := vmtest.Start(t)
	start := time.Now().Add(-3 * time.Hour).Truncate(time.Minute)
	end := start.Add(5 * time.Minute)
	series := exportedSeries(t, sim.LBLeastRequest, start)
	withoutLimits := filterLines(series, func(l string) bool { return !strings.HasPrefix(l, "kube_pod_container_resource_limits") })

	// shop: kube-state-metrics has no CPU limits; the cluster has them, and a DestinationRule.
	whatIfCluster(t, c, "shop", true)
	if err := c.Create(context.Background(), &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "web-lb", Namespace: "shop"},
		Spec: networkingapi.DestinationRule{Host: "web.shop.svc.cluster.local", TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_Simple{Simple: networkingapi.LoadBalancerSettings_LEAST_REQUEST}}}},
	}); err != nil {
		t.Fatal(err)
	}
	vm.ImportText(t, inNamespace(withoutLimits, "shop"))
	t.Run("limits, nodes and the balancer come from the cluster", func(t *testing.T) {
		scenario := filepath.Join(t.TempDir(), "web.yaml")
		code, out, errOut := runCLI(t, whatIfArgs(vm.URL, "shop/web", end, "--kubeconfig", kubeconfig, "--write-scenario", scenario)...)
		if code != exitOK {
			t.Fatalf("exit %d: %s\n%s", code, errOut, out)
		}
		if !strings.Contains(out, "m6i.xlarge") || !strings.Contains(out, "m4.xlarge") {
			t.Errorf("the groups do not show the nodes' instance types:\n%s", out)
		}
		if strings.Contains(out, "LEAST_REQUEST, Istio's default") {
			t.Errorf("the balancer is listed as assumed although the DestinationRule sets it:\n%s", out)
		}
		data, err := os.ReadFile(scenario)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`cpu_limit: 1 +# cluster: the pods' CPU limit`, `cores: 4 +# cluster: the node's CPU count`, `lb: least_request +# cluster: DestinationRule shop/web-lb`} {
			if !regexp.MustCompile(want).Match(data) {
				t.Errorf("scenario lacks %q:\n%s", want, data)
			}
		}
	})

	// plain: the Service's pods run without sidecars and nothing reports its requests.
	whatIfCluster(t, c, "plain", false)
	vm.ImportText(t, inNamespace(filterLines(series, func(l string) bool { return strings.HasPrefix(l, "container_cpu_usage_seconds_total") }), "plain"))
	t.Run("pods without sidecars in the cluster: not in the mesh", func(t *testing.T) {
		code, out, errOut := runCLI(t, whatIfArgs(vm.URL, "plain/web", end, "--kubeconfig", kubeconfig)...)
		if code != exitFailure || !strings.Contains(errOut, "the Service is not in the mesh") || !strings.Contains(errOut, "none of its 12 pods runs an istio-proxy sidecar (the cluster says so)") {
			t.Fatalf("exit %d: %s\n%s", code, errOut, out)
		}
	})

	t.Run("a Service the cluster does not have", func(t *testing.T) {
		code, _, errOut := runCLI(t, whatIfArgs(vm.URL, "shop/nope", end, "--kubeconfig", kubeconfig)...)
		if code != exitFailure || !strings.Contains(errOut, "the cluster has no Service shop/nope") {
			t.Fatalf("exit %d: %s", code, errOut)
		}
	})

	// hash: a DestinationRule balancing by consistent hash, which the simulator does not model.
	whatIfCluster(t, c, "hash", true)
	if err := c.Create(context.Background(), &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "sticky", Namespace: "hash"},
		Spec: networkingapi.DestinationRule{Host: "web", TrafficPolicy: &networkingapi.TrafficPolicy{
			LoadBalancer: &networkingapi.LoadBalancerSettings{LbPolicy: &networkingapi.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingapi.LoadBalancerSettings_ConsistentHashLB{
				HashKey: &networkingapi.LoadBalancerSettings_ConsistentHashLB_UseSourceIp{UseSourceIp: true}}}}}},
	}); err != nil {
		t.Fatal(err)
	}
	vm.ImportText(t, inNamespace(series, "hash"))
	t.Run("a balancer the simulator does not model", func(t *testing.T) {
		code, out, errOut := runCLI(t, whatIfArgs(vm.URL, "hash/web", end, "--kubeconfig", kubeconfig)...)
		if code != exitFailure || !strings.Contains(errOut, "DestinationRule hash/sticky balances by consistent hash, which the simulator does not model") {
			t.Fatalf("exit %d: %s\n%s", code, errOut, out)
		}
	})

	// An unreachable cluster: the facts come from kube-state-metrics, and the user is told.
	vm.ImportText(t, inNamespace(series, "ksm"))
	t.Run("an unreachable cluster falls back to kube-state-metrics", func(t *testing.T) {
		kc := clientcmdapi.NewConfig()
		kc.Clusters["down"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
		kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "x"}
		kc.Contexts["down"] = &clientcmdapi.Context{Cluster: "down", AuthInfo: "u"}
		kc.CurrentContext = "down"
		down := filepath.Join(t.TempDir(), "down.kubeconfig")
		if err := clientcmd.WriteToFile(*kc, down); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCLI(t, whatIfArgs(vm.URL, "ksm/web", end, "--kubeconfig", down)...)
		if code != exitOK {
			t.Fatalf("exit %d: %s\n%s", code, errOut, out)
		}
		if !strings.Contains(errOut, "Cannot read the cluster") || !strings.Contains(errOut, "come from kube-state-metrics series or are assumed") {
			t.Errorf("the fallback is not announced: %q", errOut)
		}
	})
}
