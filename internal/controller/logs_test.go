package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	apinetworkingv1 "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// operatorLogs receives the suite operator's log lines at info level, as JSON, while a test
// captures them (and drops them otherwise, so the suite's memory does not grow with its log).
var operatorLogs = &logCapture{}

type logCapture struct {
	mu  sync.Mutex
	on  bool
	buf bytes.Buffer
}

// core is enabled only while capturing, so the rest of the suite pays nothing for it.
func (c *logCapture) core() zapcore.Core {
	enabled := zap.LevelEnablerFunc(func(l zapcore.Level) bool { return l >= zapcore.InfoLevel && c.active() })
	return zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(c), enabled)
}

func (c *logCapture) active() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.on
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on {
		c.buf.Write(p)
	}
	return len(p), nil
}

// capture starts capturing until the test ends.
func (c *logCapture) capture(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = true
	c.buf.Reset()
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.on = false
		c.buf.Reset()
	})
}

// lines returns the captured lines that mention namespace, each decoded from JSON.
func (c *logCapture) lines(t *testing.T, namespace string) []map[string]any {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(c.buf.String()), "\n") {
		if !strings.Contains(line, `"`+namespace+`"`) {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v\n%s", err, line)
		}
		out = append(out, m)
	}
	return out
}

// withMsg returns the lines whose message starts with prefix.
func withMsg(lines []map[string]any, prefix string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if msg, _ := l["msg"].(string); strings.HasPrefix(msg, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// objectKey reads a {"name","namespace"} field of a log line.
func objectKey(l map[string]any, field string) string {
	m, _ := l[field].(map[string]any)
	return fmt.Sprintf("%v/%v", m["namespace"], m["name"])
}

func TestLogs_EachServiceEntryWriteIsOneJSONLineWithItsKey(t *testing.T) {
	f := newFixture(t)
	operatorLogs.capture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	svc := f.service("web")
	f.pod("web", "web-1", "10.1.0.1")
	f.pod("web", "web-2", "10.1.0.2")
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"))
	f.alb("web", "web")
	f.waitForAddresses("web", "10.1.0.1")
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"), ready("web-2", "10.1.0.2"))
	f.waitForAddresses("web", "10.1.0.1", "10.1.0.2")
	if err := k8s.Delete(f.ctx, svc); err != nil {
		t.Fatal(err)
	}
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonTargetNotFound)

	want := f.ns + "/web"
	var lines []map[string]any
	// The line is written just after the API call returns, so it may trail what the API shows.
	f.eventually("the delete and the TargetNotFound decision are logged", func() error {
		lines = operatorLogs.lines(t, f.ns)
		if len(withMsg(lines, "ServiceEntry deleted")) == 0 || len(withMsg(lines, "AdaptiveLoadBalancer not served")) == 0 {
			return errNotYet
		}
		return nil
	})
	for msg, n := range map[string]int{"ServiceEntry created": 1, "ServiceEntry updated": 1, "ServiceEntry deleted": 1} {
		got := withMsg(lines, msg)
		if len(got) != n {
			t.Errorf("%d %q lines, want %d:\n%v", len(got), msg, n, got)
			continue
		}
		l := got[0]
		if l["level"] != "info" || objectKey(l, "serviceEntry") != want || objectKey(l, "AdaptiveLoadBalancer") != want {
			t.Errorf("%q line lacks info level or the object keys %s: %v", msg, want, l)
		}
	}
	if got := withMsg(lines, "ServiceEntry created"); len(got) == 1 && got[0]["endpoints"] != float64(1) {
		t.Errorf("create line endpoints %v, want 1", got[0]["endpoints"])
	}
	if got := withMsg(lines, "ServiceEntry updated"); len(got) == 1 && got[0]["endpoints"] != float64(2) {
		t.Errorf("update line endpoints %v, want 2", got[0]["endpoints"])
	}
	notServed := withMsg(lines, "AdaptiveLoadBalancer not served")
	if l := notServed[0]; l["reason"] != adlbv1.ReasonTargetNotFound || !strings.Contains(fmt.Sprint(l["message"]), "not found") {
		t.Errorf("not-served line %v", l)
	}
}

func TestLogs_ARepeatedRefusalIsLoggedOnce(t *testing.T) {
	f := newFixture(t)
	f.service("web")
	f.pod("web", "web-1", "10.1.0.1")
	f.slice("web", "web-abc", ready("web-1", "10.1.0.1"))
	// Someone else's ServiceEntry of the same name: the operator refuses to overwrite it.
	users := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: f.ns}}
	users.Spec.Hosts = []string{"web.example.com"}
	users.Spec.Resolution = apinetworkingv1.ServiceEntry_DNS
	f.create(users)
	f.alb("web", "web")
	f.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonServiceEntryNotOwned)
	// Once the operator's own cache shows the refusal, reconciling again is no news.
	key := types.NamespacedName{Namespace: f.ns, Name: "web"}
	f.eventually("the operator's cache shows the refusal", func() error {
		a := &adlbv1.AdaptiveLoadBalancer{}
		if err := operatorClient.Get(f.ctx, key, a); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(a.Status.Conditions, adlbv1.ConditionEndpointsMirrored); c == nil || c.Reason != adlbv1.ReasonServiceEntryNotOwned {
			return errNotYet
		}
		return nil
	})
	core, observed := observer.New(zapcore.InfoLevel)
	ctx := log.IntoContext(f.ctx, zapr.NewLogger(zap.New(core)))
	for range 3 {
		if _, err := suiteReconciler.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
	}
	if n := observed.FilterMessage("AdaptiveLoadBalancer not served").Len(); n != 0 {
		t.Fatalf("the same refusal was logged %d more times: %v", n, observed.All())
	}

}
