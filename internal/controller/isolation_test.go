package controller

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
)

// operatorAs returns a rest.Config for the operator acting as user, bound to the operator's
// ClusterRole (config/rbac/role.yaml) with its rules passed through edit.
func operatorAs(t *testing.T, user string, edit func([]rbacv1.PolicyRule) []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: user}
	role.Rules = edit(role.Rules)
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, o := range []client.Object{role, binding} {
		if err := k8s.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), o) })
	}
	cfg := rest.CopyConfig(testConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}

// withoutDestinationRules drops destinationrules from the operator's rules.
func withoutDestinationRules(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		kept := r.DeepCopy()
		kept.Resources = nil
		for _, res := range r.Resources {
			if res != "destinationrules" {
				kept.Resources = append(kept.Resources, res)
			}
		}
		if len(kept.Resources) > 0 {
			out = append(out, *kept)
		}
	}
	return out
}

// cycleManager starts a manager on cfg with the operator's cache options and indexes, without
// controllers: the caches a weight cycle reads, as the operator's process has them. It stops
// at the end of the test.
func cycleManager(t *testing.T, cfg *rest.Config) ctrl.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Cache: CacheOptions()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := SetupIndexes(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("the cycle's caches did not sync")
	}
	return mgr
}

// startWarmups starts a DestinationRule source on cfg for the test's lifetime (mapper nil: a new
// one for cfg).
func startWarmups(t *testing.T, cfg *rest.Config, mapper meta.RESTMapper) *WarmupSource {
	t.Helper()
	if mapper == nil {
		httpClient, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if mapper, err = apiutil.NewDynamicRESTMapper(cfg, httpClient); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewWarmupSource(cfg, scheme, mapper)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// runBounded runs one cycle and fails the test if it does not return within a minute: a cycle
// that blocks holds every Service's weights.
func (lf *loopFixture) runBounded() CycleReport {
	lf.t.Helper()
	rep := lf.runWithinAMinute()
	lf.settle()
	return rep
}

// runWithinAMinute is runBounded without waiting for the status queue.
func (lf *loopFixture) runWithinAMinute() CycleReport {
	lf.t.Helper()
	type result struct {
		rep CycleReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := lf.loop.RunOnce(context.Background())
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			lf.t.Fatalf("the weight cycle failed as a whole: %v", r.err)
		}
		return r.rep
	case <-time.After(time.Minute):
		lf.t.Fatal("the weight cycle did not return within a minute")
		return CycleReport{}
	}
}

// assertServedWithoutWarmups checks that the fixture's Service got its weights and a status that
// says warm-ups were not taken into account.
func (lf *loopFixture) assertServedWithoutWarmups(rep CycleReport, why string) {
	lf.t.Helper()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		lf.t.Fatalf("%s: the Service was not weighted: %s (%s)", why, o.Action, o.Reason)
	}
	c := lf.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionTrue, adlbv1.ReasonWeightsApplied)
	if !strings.Contains(c.Message, "warm-ups of DestinationRules are not taken into account") {
		lf.t.Errorf("%s: WeightsApplied does not say that warm-ups are unknown: %q", why, c.Message)
	}
}

// Issue 21.7: an operator whose Role lacks DestinationRules still weights every Service: the
// DestinationRule informer never syncs, and nothing waits for it.
func TestWeightCycle_WithoutDestinationRuleRBACEveryServiceIsStillServed(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	mgr := cycleManager(t, operatorAs(t, "no-dr-"+lf.ns, withoutDestinationRules))
	lf.loop.Client, lf.loop.Warmups = mgr.GetClient(), startWarmups(t, mgr.GetConfig(), mgr.GetRESTMapper())
	lf.load(skewedCores, equalRPS)
	lf.assertServedWithoutWarmups(lf.runBounded(), "without DestinationRule RBAC")
}

// Issue 21.7: on an API server that does not serve networking.istio.io/v1 DestinationRules (an
// Istio older than 1.22, whose CRD serves v1beta1 only), every Service is still weighted.
func TestWeightCycle_WithoutTheDestinationRuleAPIEveryServiceIsStillServed(t *testing.T) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	setDestinationRuleV1Served(t, false)
	t.Cleanup(func() { setDestinationRuleV1Served(t, true) })
	mgr := cycleManager(t, testConfig)
	lf.loop.Client, lf.loop.Warmups = mgr.GetClient(), startWarmups(t, mgr.GetConfig(), mgr.GetRESTMapper())
	lf.load(skewedCores, equalRPS)
	lf.assertServedWithoutWarmups(lf.runBounded(), "without the DestinationRule v1 API")
}

// setDestinationRuleV1Served serves or stops serving v1 of the DestinationRule CRD, and waits
// until discovery says so.
func setDestinationRuleV1Served(t *testing.T, served bool) {
	t.Helper()
	ctx := context.Background()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	if err := k8s.Get(ctx, types.NamespacedName{Name: "destinationrules.networking.istio.io"}, crd); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if v.(map[string]any)["name"] == "v1" {
			v.(map[string]any)["served"] = served
		}
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		err := k8s.List(ctx, &networkingv1.DestinationRuleList{}, client.InNamespace("default"))
		if (err == nil) == served {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("DestinationRule v1 served=%v did not reach discovery", served)
}

// failingReads fails every read of objects in one namespace, as a cache that cannot serve it
// (an informer that lost its Role there) would.
type failingReads struct {
	client.Client
	namespace string
	block     bool // block until the caller's deadline instead of failing at once
}

var errInjectedRead = errors.New("injected: the cache cannot read this namespace")

func (f *failingReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*networkingv1.ServiceEntry); ok && key.Namespace == f.namespace {
		if f.block {
			<-ctx.Done()
			return ctx.Err()
		}
		return errInjectedRead
	}
	return f.Client.Get(ctx, key, obj, opts...)
}

// isolatedPair builds the loop fixture's Service and a second one in a namespace of its own, with
// the cycle's reads of the second failing as reads does.
func isolatedPair(t *testing.T, block bool) (*loopFixture, *fixture) {
	lf := newLoopFixture(t, adlbv1.ModeActive)
	other := newFixture(t)
	other.service("web")
	other.pod("web", "web-1", "10.21.0.1")
	other.pod("web", "web-2", "10.21.0.2")
	other.slice("web", "web-x", ready("web-1", "10.21.0.1"), ready("web-2", "10.21.0.2"))
	alb := other.alb("web", "web")
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), alb) })
	other.waitForAddresses("web", "10.21.0.1", "10.21.0.2")
	other.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	lf.loop.Client = &failingReads{Client: lf.loop.Client, namespace: other.ns, block: block}
	lf.load(skewedCores, equalRPS)
	return lf, other
}

// Issue 21.7: one Service whose inputs cannot be read is reported on its own status; every other
// Service's cycle goes on.
func TestWeightCycle_OneTargetsFailedReadDoesNotStallTheOthers(t *testing.T) {
	lf, other := isolatedPair(t, false)
	rep := lf.runBounded()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		t.Fatalf("the healthy Service was not weighted: %s (%s)", o.Action, o.Reason)
	}
	c := other.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonInputsUnavailable)
	if !strings.Contains(c.Message, errInjectedRead.Error()) {
		t.Errorf("the failing Service's condition should say why: %q", c.Message)
	}
	other.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonInputsUnavailable)
}

// Issue 21.7: a read that blocks (a wedged cache or API call) holds the cycle only until its
// deadline for one Service's reads (a tenth of the cycle's); the other Services are weighted and
// every status is written.
func TestWeightCycle_ABlockedReadEndsAtTheCyclesDeadline(t *testing.T) {
	lf, other := isolatedPair(t, true)
	lf.loop.Timeout = 3 * time.Second
	rep := lf.runBounded()
	if o := rep.Outcomes[lf.key()]; o.Action != cycle.ActionWrite || lf.wrote(rep) != 1 {
		t.Fatalf("the healthy Service was not weighted: %s (%s)", o.Action, o.Reason)
	}
	c := other.waitForCondition("web", adlbv1.ConditionWeightsApplied, metav1.ConditionFalse, adlbv1.ReasonInputsUnavailable)
	if !strings.Contains(c.Message, context.DeadlineExceeded.Error()) {
		t.Errorf("the blocked Service's condition should say why: %q", c.Message)
	}
}
