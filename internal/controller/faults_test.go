package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// apiFault makes the API server, as the operator sees it, answer every ServiceEntry write in one
// namespace (or, with object set, every write of that one ServiceEntry) with an error until it
// is cleared, and counts the attempts.
type apiFault struct {
	status metav1.Status
	object string
	// passFirst lets that many matching requests through before the fault answers.
	passFirst int64
	attempts  atomic.Int64
}

var apiFaults sync.Map // namespace → *apiFault

// injectedFault answers a ServiceEntry write with the namespace's fault, or returns nil.
func injectedFault(req *http.Request) *http.Response {
	var fault *apiFault
	apiFaults.Range(func(ns, f any) bool {
		if strings.Contains(req.URL.Path, "/namespaces/"+ns.(string)+"/serviceentries") {
			fault = f.(*apiFault)
			return false
		}
		return true
	})
	if fault == nil || (fault.object != "" && !strings.HasSuffix(req.URL.Path, "/serviceentries/"+fault.object)) {
		return nil
	}
	if fault.attempts.Add(1) <= fault.passFirst {
		return nil
	}
	body, _ := json.Marshal(fault.status)
	return &http.Response{
		StatusCode: int(fault.status.Code),
		Status:     fmt.Sprintf("%d %s", fault.status.Code, http.StatusText(int(fault.status.Code))),
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(bytes.NewReader(body)),
		Request:    req,
	}
}

// API errors on the ServiceEntry write are retried with back-off, reported in the conditions,
// and the mirror converges once the API server recovers.
func TestMirror_RetriesAPIErrorsWithBackOff(t *testing.T) {
	faults := map[string]metav1.Status{
		"conflict":  {Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonConflict, Message: "injected: the object has been modified"},
		"throttled": {Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests, Message: "injected: too many requests"},
		"timeout":   {Status: metav1.StatusFailure, Code: http.StatusGatewayTimeout, Reason: metav1.StatusReasonTimeout, Message: "injected: request timed out"},
		"internal":  {Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"},
	}
	for name, status := range faults {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each in its own namespace; together they wait out the back-off once
			f := newFixture(t)
			status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
			fault := &apiFault{status: status}
			apiFaults.Store(f.ns, fault)
			defer apiFaults.Delete(f.ns)

			f.node("node-a", "eu-west", "eu-west-1a")
			f.service("web")
			f.pod("web", "web-1", "10.9.0.1")
			f.slice("web", "web-x", ready("web-1", "10.9.0.1"))
			f.alb("web", "web")

			// WriteFailed, or, once the failures outlast the suite's stale timeout (a loaded
			// machine may take that long to show the first one), StaleServiceEntryRemoved: both
			// carry the API error.
			var c *metav1.Condition
			f.eventually("Ready=False/WriteFailed or StaleServiceEntryRemoved", func() error {
				a := &adlbv1.AdaptiveLoadBalancer{}
				if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "web"}, a); err != nil {
					return err
				}
				c = meta.FindStatusCondition(a.Status.Conditions, adlbv1.ConditionReady)
				if c == nil || c.Status != metav1.ConditionFalse ||
					(c.Reason != adlbv1.ReasonWriteFailed && c.Reason != adlbv1.ReasonStaleServiceEntryRemoved) {
					return fmt.Errorf("Ready: %+v", c)
				}
				return nil
			})
			if !strings.Contains(c.Message, "injected") {
				t.Fatalf("the condition should carry the API error, got %q", c.Message)
			}
			// Back-off, not a hot loop: controller-runtime's per-item exponential back-off
			// starts at 10 ms and doubles, so a few seconds of failures cost about a dozen
			// attempts; a loop without back-off would make thousands.
			time.Sleep(3 * time.Second)
			if n := fault.attempts.Load(); n < 2 || n > 40 {
				t.Fatalf("%d write attempts during ~3 s of persistent %s errors; want a handful (retried with back-off)", n, name)
			} else {
				t.Logf("%d write attempts during ~3 s of persistent %s errors", n, name)
			}

			apiFaults.Delete(f.ns)
			f.waitForAddresses("web", "10.9.0.1")
			f.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
		})
	}
}
