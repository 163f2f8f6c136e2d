// Package apicost measures what one object update costs kube-apiserver, to say what bounds the
// API-server CPU of an endpoint change: an EndpointSlice update against a ServiceEntry update
// under Istio's CRD as shipped, the same schema without its CEL rules, and no schema at all.
// Benchmarks only, against a real kube-apiserver and etcd (envtest).
package apicost

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// benchGroup holds the ServiceEntry copies whose schema is changed for the comparison.
const benchGroup = "apicost.adaptivelb.io"

// BenchmarkAPIServerCPUPerUpdate updates one object of n endpoints `updates` times, one
// endpoint changing each time (as the mirror's write of one slice after an endpoint change),
// and reports kube-apiserver's CPU per update, its idle CPU over the same time subtracted:
//
//	eval "$(make -s test-env)" && go test -run '^$' -bench APIServerCPUPerUpdate -benchtime 1x ./test/apicost/
func BenchmarkAPIServerCPUPerUpdate(b *testing.B) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		b.Skip("KUBEBUILDER_ASSETS is not set: run `make envtest-assets`")
	}
	istioCRD, withoutRules, schemaless := serviceEntryCRDs(b)
	env := &envtest.Environment{CRDs: []*apiextensionsv1.CustomResourceDefinition{istioCRD, withoutRules, schemaless}}
	cfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Stop() })
	cfg.QPS, cfg.Burst = 1000, 2000
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		b.Fatal(err)
	}
	const updates = 200
	if benchutil.ChildCPUSeconds("kube-apiserver") == 0 {
		b.Fatal("no kube-apiserver child process to read the CPU of (envtest must start it, not reuse an existing cluster)")
	}
	idle := idleCPU(b)
	for b.Loop() {
		for _, n := range []int{20, 100} {
			kinds := []struct {
				name   string
				object func(i int) client.Object // the object with endpoint i changed
			}{
				{"EndpointSlice", func(i int) client.Object { return endpointSlice(n, i) }},
				{"ServiceEntry_istio_crd", func(i int) client.Object { return serviceEntry("networking.istio.io/v1", n, i) }},
				{"ServiceEntry_no_cel_rules", func(i int) client.Object { return serviceEntry(benchGroup+"/v1", n, i) }},
				{"ServiceEntry_no_schema", func(i int) client.Object {
					se := serviceEntry(benchGroup+"/v1", n, i)
					se.SetKind("SchemalessServiceEntry")
					return se
				}},
			}
			for _, k := range kinds {
				obj := k.object(-1)
				obj.SetName(fmt.Sprintf("web-%d", n))
				if err := c.Create(ctx, obj); err != nil {
					b.Fatalf("create %s of %d endpoints: %v", k.name, n, err)
				}
				cpu0, start := benchutil.ChildCPUSeconds("kube-apiserver"), time.Now()
				for u := range updates {
					next := k.object(u % n)
					next.SetName(obj.GetName())
					next.SetResourceVersion(obj.GetResourceVersion())
					if err := c.Update(ctx, next); err != nil {
						b.Fatalf("update %s of %d endpoints: %v", k.name, n, err)
					}
					obj = next
				}
				cpu := benchutil.ChildCPUSeconds("kube-apiserver") - cpu0 - idle*time.Since(start).Seconds()
				b.ReportMetric(cpu/updates*1000, fmt.Sprintf("ms/update_%s_%d", k.name, n))
				if err := c.Delete(ctx, obj); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// idleCPU is kube-apiserver's CPU seconds per second with nothing to do.
func idleCPU(b *testing.B) float64 {
	from := benchutil.ChildCPUSeconds("kube-apiserver")
	time.Sleep(5 * time.Second)
	return (benchutil.ChildCPUSeconds("kube-apiserver") - from) / 5
}

// endpointSlice is an EndpointSlice of n ready endpoints, endpoint changed not ready.
func endpointSlice(n, changed int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
	for i := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{address(i)}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(i != changed)},
			NodeName: ptr.To("node-a"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("web-%d", i)}})
	}
	return es
}

// serviceEntry is a ServiceEntry as the mirror writes one slice: n endpoints with address,
// target port, labels, locality, service account and weight; endpoint changed left out.
func serviceEntry(apiVersion string, n, changed int) *unstructured.Unstructured {
	var eps []any
	for i := range n {
		if i == changed {
			continue
		}
		eps = append(eps, map[string]any{
			"address": address(i), "weight": int64(100 + i%7), "ports": map[string]any{"http": int64(8080)}, "locality": "eu-west/eu-west-1a", "serviceAccount": "spiffe://cluster.local/ns/bench/sa/web",
			"labels": map[string]any{"app": "web", "version": "v1", "security.istio.io/tlsMode": "istio"},
		})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": "ServiceEntry",
		"metadata": map[string]any{"namespace": "bench", "labels": map[string]any{"app.kubernetes.io/managed-by": "adaptive-lb"}},
		"spec": map[string]any{
			"hosts": []any{"web.bench.svc.cluster.local"}, "location": "MESH_INTERNAL", "resolution": "STATIC",
			"ports":     []any{map[string]any{"name": "http", "number": int64(80), "protocol": "HTTP", "targetPort": int64(8080)}},
			"endpoints": eps,
		},
	}}
}

func address(i int) string { return fmt.Sprintf("10.1.%d.%d", i/250, i%250+1) }

// serviceEntryCRDs returns Istio's ServiceEntry CRD as shipped in the istio.io/api module
// go.mod pins, the same schema in benchGroup with every x-kubernetes-validations rule removed,
// and a kind in benchGroup without any schema (x-kubernetes-preserve-unknown-fields).
func serviceEntryCRDs(b *testing.B) (istioCRD, withoutRules, schemaless *apiextensionsv1.CustomResourceDefinition) {
	path, err := testtools.IstioCRDPath()
	if err != nil {
		b.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal([]byte(doc), crd); err != nil || crd.Name != "serviceentries.networking.istio.io" {
			continue
		}
		istioCRD = crd
	}
	if istioCRD == nil {
		b.Fatal("no ServiceEntry CRD in istio.io/api's bundle")
	}
	withoutRules = istioCRD.DeepCopy()
	withoutRules.ObjectMeta = metav1.ObjectMeta{Name: "serviceentries." + benchGroup}
	withoutRules.Spec.Group = benchGroup
	withoutRules.Spec.Versions = onlyV1(withoutRules.Spec.Versions)
	dropRules(withoutRules.Spec.Versions[0].Schema.OpenAPIV3Schema)
	schemaless = withoutRules.DeepCopy()
	schemaless.Name = "schemalessserviceentries." + benchGroup
	schemaless.Spec.Names = apiextensionsv1.CustomResourceDefinitionNames{Plural: "schemalessserviceentries", Singular: "schemalessserviceentry", Kind: "SchemalessServiceEntry", ListKind: "SchemalessServiceEntryList"}
	schemaless.Spec.Versions[0].Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object", XPreserveUnknownFields: ptr.To(true)}}
	return istioCRD, withoutRules, schemaless
}

func onlyV1(versions []apiextensionsv1.CustomResourceDefinitionVersion) []apiextensionsv1.CustomResourceDefinitionVersion {
	for _, v := range versions {
		if v.Name == "v1" {
			v.Storage, v.Served, v.Subresources = true, true, nil
			return []apiextensionsv1.CustomResourceDefinitionVersion{v}
		}
	}
	return nil
}

// dropRules removes every CEL rule from the schema, recursively.
func dropRules(s *apiextensionsv1.JSONSchemaProps) {
	if s == nil {
		return
	}
	s.XValidations = nil
	for k, p := range s.Properties {
		dropRules(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		dropRules(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		dropRules(s.AdditionalProperties.Schema)
	}
}
