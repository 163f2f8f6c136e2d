package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics/vmtest"
)

// mirrored returns the AdaptiveLoadBalancer's EndpointsMirrored condition.
func (c *opsCluster) mirrored() *metav1.Condition {
	alb := &adlbv1.AdaptiveLoadBalancer{}
	if err := c.admin.Get(c.ctx, types.NamespacedName{Namespace: opsApp, Name: "web"}, alb); err != nil {
		return nil
	}
	return meta.FindStatusCondition(alb.Status.Conditions, adlbv1.ConditionEndpointsMirrored)
}

// The operator's default, --mesh-multi-cluster=auto, with the RBAC of config/rbac (no Secret):
// without a TSDB it cannot tell a mesh of one cluster and writes no ServiceEntry, saying what to
// do; with a TSDB in which istiod reports no remote cluster it weights the Service.
func TestRun_TheDefaultWeightsOnlyWhatIstiodsCountShowsIsOneCluster(t *testing.T) {
	c := newOpsCluster(t)
	c.setReady(2)
	c.createALB()

	stopA, logsA := c.start("A", true, "--mesh-multi-cluster=auto")
	c.waitFor("no TSDB: MultiCluster, saying why and what to do", func() bool {
		m := c.mirrored()
		return m != nil && m.Reason == adlbv1.ReasonMultiCluster && strings.Contains(m.Message, "no TSDB is configured (--tsdb-url)") &&
			strings.Contains(m.Message, "--mesh-multi-cluster=false")
	}, logsA)
	if !c.serviceEntryGone() {
		t.Fatal("a ServiceEntry was written although the operator cannot tell whether the mesh spans several clusters")
	}
	stopA()

	vm := vmtest.StartFresh(t)
	now := time.Now()
	var scrape strings.Builder
	for ts := now.Add(-time.Minute); !ts.After(now); ts = ts.Add(15 * time.Second) {
		fmt.Fprintf(&scrape, "istiod_managed_clusters{cluster_type=\"remote\",app=\"istiod\",namespace=\"istio-system\",pod=\"istiod-7d9f\"} 0 %d\n", ts.UnixMilli())
	}
	vm.ImportText(t, scrape.String())
	stopB, logsB := c.start("B", true, "--mesh-multi-cluster=auto", "--tsdb-url", vm.URL)
	defer stopB()
	c.waitForEndpoints(2, logsB)
	c.waitFor("the status names the evidence of one cluster", func() bool {
		m := c.mirrored()
		return m != nil && m.Status == metav1.ConditionTrue && strings.Contains(m.Message, "istiod reads no remote cluster")
	}, logsB)
}
