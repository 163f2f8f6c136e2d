package controller

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A namespaced-only index files a value under its namespace alone: the key a List within a
// namespace asks for, and nothing under "all namespaces".
func TestIndexes_NamespacedIndexFilesEachValueUnderItsNamespaceOnly(t *testing.T) {
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{
		fieldIndexName(indexPodIP): namespacedIndex(func(o client.Object) []string { return endpointIPs(o.(*corev1.Pod)) }),
	})
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1"}, Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "bank", Name: "web-1"}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "agent"}, Spec: corev1.PodSpec{HostNetwork: true}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
	} {
		if err := indexer.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	keys := indexer.ListIndexFuncValues(fieldIndexName(indexPodIP))
	slices.Sort(keys)
	if want := []string{"bank/10.0.0.1", "shop/10.0.0.1", "shop/fd00::1"}; !slices.Equal(keys, want) {
		t.Errorf("index keys %v, want %v", keys, want)
	}
	found, err := indexer.ByIndex(fieldIndexName(indexPodIP), "shop/10.0.0.1")
	if err != nil || len(found) != 1 || found[0].(*corev1.Pod).Name != "web-1" || found[0].(*corev1.Pod).Namespace != "shop" {
		t.Errorf("shop/10.0.0.1 finds %v (%v), want shop's web-1 only", found, err)
	}
}

// The per-pod indexes have no "all namespaces" entries (indexInNamespace), so a List on them
// without client.InNamespace would silently find nothing: every query names its namespace.
func TestIndexes_NamespacedOnlyQueriedInANamespace(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	query := regexp.MustCompile(`MatchingFields\{(indexPodIP|indexSlicePod)\b`)
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if !query.MatchString(line) {
				continue
			}
			checked++
			if !strings.Contains(line, "client.InNamespace(") {
				t.Errorf("%s:%d: a List on a namespaced-only index without client.InNamespace finds nothing: %s", name, i+1, strings.TrimSpace(line))
			}
		}
	}
	if checked < 2 {
		t.Errorf("found %d queries on the per-pod indexes, want at least 2 (forPod, podOf): has the query's form changed?", checked)
	}
}
