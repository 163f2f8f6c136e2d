package chart

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// Issue 31, "membership first": the chart's FlowSchemas put the operator's ServiceEntry writes in
// workload-high and its AdaptiveLoadBalancer status writes and Events in a small level of the
// chart's own, below them, on a real kube-apiserver's API Priority and Fairness. The API server
// names the FlowSchema and priority level of every request in the response headers
// X-Kubernetes-PF-FlowSchema-UID and X-Kubernetes-PF-PriorityLevel-UID; the test reads them from
// requests made as the operator's ServiceAccount, and as two other ServiceAccounts for control.

const (
	apfNamespace = "adaptive-lb-system" // render's release namespace
	appNamespace = "shop"

	membershipSchema = "lb-adaptive-lb-membership"
	statusSchema     = "lb-adaptive-lb-status"
	statusLevel      = "lb-adaptive-lb-status"

	// The API server's suggested configuration (k8s.io/apiserver's flowcontrol bootstrap): every
	// ServiceAccount's requests fall into service-accounts, workload-low, unless an earlier schema
	// matches; kube-controller-manager runs in workload-high.
	serviceAccountsSchema = "service-accounts"
	workloadLow           = "workload-low"
	workloadHigh          = "workload-high"

	// How long the API server's flow-control config controller may take to apply a new schema,
	// and the RBAC authorizer a new binding.
	apfSettle = 30 * time.Second
)

var (
	serviceEntries        = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
	adaptiveLoadBalancers = schema.GroupVersionResource{Group: "adaptivelb.io", Version: "v1alpha1", Resource: "adaptiveloadbalancers"}
)

// classification is where API Priority and Fairness put a request: a FlowSchema and a priority
// level, by name.
type classification struct{ flowSchema, priorityLevel string }

func (c classification) String() string {
	return fmt.Sprintf("FlowSchema %q, priority level %q", c.flowSchema, c.priorityLevel)
}

// apfUser makes requests as one ServiceAccount and remembers how the API server classified the
// last one. Its clients (dynamic and typed) send exactly one request per call: no discovery.
type apfUser struct {
	name    string
	dynamic dynamic.Interface
	typed   kubernetes.Interface

	mu   sync.Mutex
	last classification // UIDs, as the headers carry them
}

// newAPFUser authenticates to env as the ServiceAccount namespace/name, with the groups the API
// server gives a ServiceAccount's token (the suggested service-accounts schema matches on them).
func newAPFUser(t *testing.T, env *envtest.Environment, namespace, name string) *apfUser {
	t.Helper()
	authenticated, err := env.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := &apfUser{name: namespace + "/" + name}
	cfg := rest.CopyConfig(authenticated.Config())
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil {
				u.mu.Lock()
				u.last = classification{resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID"), resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")}
				u.mu.Unlock()
			}
			return resp, err
		})
	})
	if u.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if u.typed, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return u
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// request is one kind of request, made by do as a user; do may make preparatory requests
// first: the last one is the one classified.
type request struct {
	what string
	do   func(ctx context.Context, u *apfUser) error
}

// apfNames maps the UIDs of the API server's FlowSchemas and priority levels to their names.
func apfNames(ctx context.Context, t *testing.T, admin client.Client) map[string]string {
	t.Helper()
	names := map[string]string{}
	var schemas flowcontrolv1.FlowSchemaList
	var levels flowcontrolv1.PriorityLevelConfigurationList
	if err := admin.List(ctx, &schemas); err != nil {
		t.Fatal(err)
	}
	if err := admin.List(ctx, &levels); err != nil {
		t.Fatal(err)
	}
	for _, s := range schemas.Items {
		names[string(s.UID)] = s.Name
	}
	for _, l := range levels.Items {
		names[string(l.UID)] = l.Name
	}
	return names
}

// classifiedAs makes r as u until it succeeds and until settled says the classification is the
// one to report, within apfSettle (the flow-control config and RBAC reach the API server's
// filters moments after they are written); it returns the last classification and error.
func classifiedAs(ctx context.Context, t *testing.T, admin client.Client, u *apfUser, r request, settled func(classification) bool) (classification, error) {
	t.Helper()
	for deadline := time.Now().Add(apfSettle); ; time.Sleep(200 * time.Millisecond) {
		err := r.do(ctx, u)
		u.mu.Lock()
		uids := u.last
		u.mu.Unlock()
		names := apfNames(ctx, t, admin)
		got := classification{names[uids.flowSchema], names[uids.priorityLevel]}
		if (err == nil && settled(got)) || time.Now().After(deadline) {
			return got, err
		}
	}
}

// expectClassified checks that the API server classifies r by u as want, once it has applied the
// configuration.
func expectClassified(ctx context.Context, t *testing.T, admin client.Client, u *apfUser, r request, want classification) {
	t.Helper()
	got, err := classifiedAs(ctx, t, admin, u, r, func(got classification) bool { return got == want })
	if err != nil || got != want {
		t.Errorf("%s by %s: classified into %v (request error: %v), want %v within %v", r.what, u.name, got, err, want, apfSettle)
		return
	}
	t.Logf("%s by %s: %v", r.what, u.name, got)
}

// expectClassifiedAtOnce checks that the API server, which has applied the chart's schemas, classifies r by
// u as want at the first request that succeeds: a control that waited for want could wait out a
// schema the API server applies late.
func expectClassifiedAtOnce(ctx context.Context, t *testing.T, admin client.Client, u *apfUser, r request, want classification) {
	t.Helper()
	got, err := classifiedAs(ctx, t, admin, u, r, func(classification) bool { return true })
	if err != nil || got != want {
		t.Errorf("%s by %s: classified into %v (request error: %v), want %v", r.what, u.name, got, err, want)
		return
	}
	t.Logf("%s by %s: %v", r.what, u.name, got)
}

func TestChart_APFPutsTheMembershipWritesAboveTheStatusWrites(t *testing.T) {
	testtools.RequireEnv(t, "KUBEBUILDER_ASSETS", "kube-apiserver and etcd")
	objs := render(t)
	istioCRDs, err := testtools.IstioCRDPath()
	if err != nil {
		t.Fatal(err)
	}
	// The chart's own CRD (crds/) and Istio's, which the operator writes.
	env := &envtest.Environment{CRDDirectoryPaths: []string{chartDir + "/crds", istioCRDs}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{apfNamespace, appNamespace, "tenant"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}

	// The API server's suggested configuration, which the chart's values assume, as this API
	// server serves it (it writes it at start-up).
	var serviceAccounts, controllerManager flowcontrolv1.FlowSchema
	var high flowcontrolv1.PriorityLevelConfiguration
	for deadline := time.Now().Add(apfSettle); ; time.Sleep(200 * time.Millisecond) {
		err = admin.Get(ctx, types.NamespacedName{Name: serviceAccountsSchema}, &serviceAccounts)
		if err == nil {
			err = admin.Get(ctx, types.NamespacedName{Name: "kube-controller-manager"}, &controllerManager)
		}
		if err == nil {
			err = admin.Get(ctx, types.NamespacedName{Name: workloadHigh}, &high)
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("the API server's suggested flow-control configuration: %v", err)
	}
	if serviceAccounts.Spec.MatchingPrecedence != 9000 || serviceAccounts.Spec.PriorityLevelConfiguration.Name != workloadLow {
		t.Errorf("service-accounts: precedence %d, level %s; the chart assumes 9000 and workload-low", serviceAccounts.Spec.MatchingPrecedence, serviceAccounts.Spec.PriorityLevelConfiguration.Name)
	}
	if controllerManager.Spec.PriorityLevelConfiguration.Name != workloadHigh {
		t.Errorf("kube-controller-manager runs in %s, not workload-high, the level the chart puts the mirror in", controllerManager.Spec.PriorityLevelConfiguration.Name)
	}

	// The chart's flow-control objects are valid: the API server takes them. The operator's
	// ClusterRole and binding let its ServiceAccount make the requests below.
	for _, k := range []string{"PriorityLevelConfiguration/" + statusLevel, "FlowSchema/" + membershipSchema, "FlowSchema/" + statusSchema,
		"ClusterRole/lb-adaptive-lb", "ClusterRoleBinding/lb-adaptive-lb"} {
		if objs[k] == nil {
			t.Fatalf("the chart renders no %s; got %v", k, keys(objs))
		}
		if err := admin.Create(ctx, objs[k]); err != nil {
			t.Fatalf("apply %s: %v", k, err)
		}
	}
	// Two other ServiceAccounts with the operator's rights: the same name in another namespace,
	// and another name in the operator's namespace.
	if err := admin.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "others-with-the-operators-rights"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lb-adaptive-lb"},
		"subjects": []any{
			map[string]any{"kind": "ServiceAccount", "name": "adaptive-lb", "namespace": "tenant"},
			map[string]any{"kind": "ServiceAccount", "name": "other", "namespace": apfNamespace},
		},
	}}); err != nil {
		t.Fatal(err)
	}

	// The levels are ordered: the membership schema's level has a larger share of the API
	// server's concurrency than the status schema's, and the membership schema is evaluated
	// first; both before service-accounts, and at no precedence another schema already has.
	var membership, status flowcontrolv1.FlowSchema
	var existing flowcontrolv1.FlowSchemaList
	var low flowcontrolv1.PriorityLevelConfiguration
	for _, get := range []struct {
		name string
		obj  client.Object
	}{{membershipSchema, &membership}, {statusSchema, &status}, {statusLevel, &low}} {
		if err := admin.Get(ctx, types.NamespacedName{Name: get.name}, get.obj); err != nil {
			t.Fatal(err)
		}
	}
	if membership.Spec.PriorityLevelConfiguration.Name != workloadHigh || status.Spec.PriorityLevelConfiguration.Name != statusLevel {
		t.Errorf("levels: membership %s, status %s; want %s and %s", membership.Spec.PriorityLevelConfiguration.Name, status.Spec.PriorityLevelConfiguration.Name, workloadHigh, statusLevel)
	}
	if highShares, lowShares := *high.Spec.Limited.NominalConcurrencyShares, *low.Spec.Limited.NominalConcurrencyShares; lowShares >= highShares {
		t.Errorf("the status level's nominalConcurrencyShares %d is not below workload-high's %d", lowShares, highShares)
	}
	if m, s := membership.Spec.MatchingPrecedence, status.Spec.MatchingPrecedence; m >= s || s >= serviceAccounts.Spec.MatchingPrecedence {
		t.Errorf("matchingPrecedence: membership %d, status %d, service-accounts %d; want them in this order", m, s, serviceAccounts.Spec.MatchingPrecedence)
	}
	if err := admin.List(ctx, &existing); err != nil {
		t.Fatal(err)
	}
	for _, other := range existing.Items {
		for _, mine := range []flowcontrolv1.FlowSchema{membership, status} {
			if other.Name != mine.Name && other.Spec.MatchingPrecedence == mine.Spec.MatchingPrecedence {
				t.Errorf("%s shares matchingPrecedence %d with %s", mine.Name, mine.Spec.MatchingPrecedence, other.Name)
			}
			// Every ServiceAccount of kube-system is in that schema: a release there still gets
			// the chart's classification.
			if other.Name == "kube-system-service-accounts" && mine.Spec.MatchingPrecedence >= other.Spec.MatchingPrecedence {
				t.Errorf("%s's matchingPrecedence %d is not below kube-system-service-accounts' %d", mine.Name, mine.Spec.MatchingPrecedence, other.Spec.MatchingPrecedence)
			}
		}
	}

	// An AdaptiveLoadBalancer for the status writes and Events to be about.
	alb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "adaptivelb.io/v1alpha1", "kind": "AdaptiveLoadBalancer",
		"metadata": map[string]any{"name": "web", "namespace": appNamespace},
		"spec":     map[string]any{"targetRef": map[string]any{"name": "web"}},
	}}
	if err := admin.Create(ctx, alb); err != nil {
		t.Fatal(err)
	}
	adminDynamic, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	membershipRequests := []request{
		{"create a ServiceEntry", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Create(ctx, serviceEntry(u.name), metav1.CreateOptions{})
			return err
		}},
		{"get a ServiceEntry", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Get(ctx, "web", metav1.GetOptions{})
			return err
		}},
		{"update a ServiceEntry", func(ctx context.Context, u *apfUser) error {
			se, err := u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			se.SetLabels(map[string]string{"updated-by": strings.ReplaceAll(u.name, "/", ".")})
			_, err = u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Update(ctx, se, metav1.UpdateOptions{})
			return err
		}},
		{"delete a ServiceEntry", func(ctx context.Context, u *apfUser) error {
			se, err := adminDynamic.Resource(serviceEntries).Namespace(appNamespace).Create(ctx, serviceEntry("doomed"), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			return u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Delete(ctx, se.GetName(), metav1.DeleteOptions{})
		}},
	}
	statusRequests := []request{
		{"patch an AdaptiveLoadBalancer's status", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(adaptiveLoadBalancers).Namespace(appNamespace).Patch(ctx, "web", types.MergePatchType,
				[]byte(`{"status":{"observedGeneration":1}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"update an AdaptiveLoadBalancer's status", func(ctx context.Context, u *apfUser) error {
			live, err := u.dynamic.Resource(adaptiveLoadBalancers).Namespace(appNamespace).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = u.dynamic.Resource(adaptiveLoadBalancers).Namespace(appNamespace).UpdateStatus(ctx, live, metav1.UpdateOptions{})
			return err
		}},
		{"create an Event", func(ctx context.Context, u *apfUser) error {
			_, err := u.typed.CoreV1().Events(appNamespace).Create(ctx, coreEvent(), metav1.CreateOptions{})
			return err
		}},
		{"patch an Event", func(ctx context.Context, u *apfUser) error {
			e, err := u.typed.CoreV1().Events(appNamespace).Create(ctx, coreEvent(), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			_, err = u.typed.CoreV1().Events(appNamespace).Patch(ctx, e.Name, types.MergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{})
			return err
		}},
		{"create an events.k8s.io Event", func(ctx context.Context, u *apfUser) error {
			_, err := u.typed.EventsV1().Events(appNamespace).Create(ctx, eventsEvent(), metav1.CreateOptions{})
			return err
		}},
	}
	// What the chart leaves to the default schemas: the informers' lists (and watches), reads of
	// the operator's own resource, and the weight writes (the only ServiceEntry patches).
	defaultRequests := []request{
		{"patch a ServiceEntry", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(serviceEntries).Namespace(appNamespace).Patch(ctx, "web", types.MergePatchType,
				[]byte(`{"spec":{"endpoints":[{"address":"10.31.0.2"}]}}`), metav1.PatchOptions{})
			return err
		}},
		{"list every ServiceEntry", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(serviceEntries).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get an AdaptiveLoadBalancer", func(ctx context.Context, u *apfUser) error {
			_, err := u.dynamic.Resource(adaptiveLoadBalancers).Namespace(appNamespace).Get(ctx, "web", metav1.GetOptions{})
			return err
		}},
	}

	operator := newAPFUser(t, env, apfNamespace, "adaptive-lb")
	// The ServiceEntry the get, update and patch requests work on.
	if _, err := adminDynamic.Resource(serviceEntries).Namespace(appNamespace).Create(ctx, serviceEntry("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range membershipRequests {
		expectClassified(ctx, t, admin, operator, r, classification{membershipSchema, workloadHigh})
	}
	for _, r := range statusRequests {
		expectClassified(ctx, t, admin, operator, r, classification{statusSchema, statusLevel})
	}
	for _, r := range defaultRequests {
		expectClassified(ctx, t, admin, operator, r, classification{serviceAccountsSchema, workloadLow})
	}
	if t.Failed() {
		return // the controls below would pass for a schema the API server never applied
	}
	// The chart's schemas apply only to the operator's ServiceAccount: the same requests by the
	// others stay where every ServiceAccount's requests are.
	for _, other := range []*apfUser{newAPFUser(t, env, "tenant", "adaptive-lb"), newAPFUser(t, env, apfNamespace, "other")} {
		for _, r := range append(append([]request{}, membershipRequests...), statusRequests...) {
			expectClassifiedAtOnce(ctx, t, admin, other, r, classification{serviceAccountsSchema, workloadLow})
		}
	}
}

// serviceEntry is a small ServiceEntry of the kind the operator writes; name "web" is that, any
// other a prefix for a generated name.
func serviceEntry(name string) *unstructured.Unstructured {
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
		"metadata": map[string]any{"namespace": appNamespace},
		"spec": map[string]any{
			"hosts":      []any{"web.shop.svc.cluster.local"},
			"ports":      []any{map[string]any{"number": int64(80), "name": "http", "protocol": "HTTP"}},
			"resolution": "STATIC",
			"endpoints":  []any{map[string]any{"address": "10.31.0.1", "weight": int64(100)}},
		},
	}}
	if name == "web" {
		se.SetName(name)
	} else {
		se.SetGenerateName(strings.NewReplacer("/", "-", ":", "-").Replace(name) + "-")
	}
	return se
}

// coreEvent is an Event about the AdaptiveLoadBalancer, as the operator's recorder writes it.
func coreEvent() *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "web.", Namespace: appNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "adaptivelb.io/v1alpha1", Kind: "AdaptiveLoadBalancer",
			Namespace: appNamespace, Name: "web"},
		Reason: "WeightsWritten", Message: "test", Type: corev1.EventTypeNormal, Count: 1,
		Source: corev1.EventSource{Component: "adaptive-lb"}, FirstTimestamp: now, LastTimestamp: now,
	}
}

// eventsEvent is the same Event in the events.k8s.io API.
func eventsEvent() *eventsv1.Event {
	return &eventsv1.Event{
		// events.k8s.io validates the generated name whole, so no trailing dot here.
		ObjectMeta: metav1.ObjectMeta{GenerateName: "web-", Namespace: appNamespace},
		EventTime:  metav1.NowMicro(),
		Regarding: corev1.ObjectReference{APIVersion: "adaptivelb.io/v1alpha1", Kind: "AdaptiveLoadBalancer",
			Namespace: appNamespace, Name: "web"},
		ReportingController: "adaptivelb.io/adaptive-lb", ReportingInstance: "adaptive-lb-0",
		Action: "WriteWeights", Reason: "WeightsWritten", Note: "test", Type: corev1.EventTypeNormal,
	}
}

// The flow-control objects are per release (cluster-scoped, so named after it), follow the
// values, and are the ones config/flowcontrol gives a kustomize install.
func TestChart_APFObjectsFollowTheValues(t *testing.T) {
	apf := func(objs map[string]*unstructured.Unstructured) []string {
		var out []string
		for _, k := range keys(objs) {
			if strings.HasPrefix(k, "FlowSchema/") || strings.HasPrefix(k, "PriorityLevelConfiguration/") {
				out = append(out, k)
			}
		}
		return out
	}
	for _, release := range []string{"lb", "other"} {
		objs := renderWith(t, release, nil)
		want := []string{"FlowSchema/" + release + "-adaptive-lb-membership", "FlowSchema/" + release + "-adaptive-lb-status",
			"PriorityLevelConfiguration/" + release + "-adaptive-lb-status"}
		if got := apf(objs); !reflect.DeepEqual(got, want) {
			t.Errorf("release %s renders %v, want %v", release, got, want)
			continue
		}
		if level, _, _ := unstructured.NestedString(objs[want[1]].Object, "spec", "priorityLevelConfiguration", "name"); level != release+"-adaptive-lb-status" {
			t.Errorf("release %s: the status schema uses the level %s, not its release's", release, level)
		}
	}
	if got := apf(render(t, "flowControl.enabled=false")); len(got) > 0 {
		t.Errorf("flowControl.enabled=false renders %v", got)
	}
	picked := render(t, "flowControl.membership.priorityLevel=system", "flowControl.status.priorityLevel=workload-low")
	if got := apf(picked); !reflect.DeepEqual(got, []string{"FlowSchema/" + membershipSchema, "FlowSchema/" + statusSchema}) {
		t.Errorf("with both levels picked the chart renders %v, want the two schemas and no level of its own", got)
	}
	for schema, want := range map[string]string{membershipSchema: "system", statusSchema: workloadLow} {
		if level, _, _ := unstructured.NestedString(picked["FlowSchema/"+schema].Object, "spec", "priorityLevelConfiguration", "name"); level != want {
			t.Errorf("%s uses the level %s, want the picked %s", schema, level, want)
		}
	}
	// Kubernetes 1.28 serves flow control as v1beta3 only.
	for version, want := range map[string]string{"1.28.9": "flowcontrol.apiserver.k8s.io/v1beta3", "1.29.0": "flowcontrol.apiserver.k8s.io/v1"} {
		objs := renderWith(t, "lb", []string{"--kube-version", version})
		for _, k := range apf(objs) {
			if got := objs[k].GetAPIVersion(); got != want {
				t.Errorf("Kubernetes %s: %s is %s, want %s", version, k, got, want)
			}
		}
	}
	// A precedence at or past service-accounts' would never match the operator's requests.
	helm := testtools.RequireEnv(t, "ADAPTIVELB_HELM_BIN", "helm")
	out, err := exec.Command(helm, "template", "lb", chartDir, "--kube-version", "1.36.3", "--set", "flowControl.membership.matchingPrecedence=9000").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "flowControl.membership.matchingPrecedence 9000 must be from 1 to 8999") {
		t.Errorf("matchingPrecedence 9000: err %v, output %s", err, out)
	}

	// config/flowcontrol holds the chart's defaults, named for the kustomize install.
	chart := render(t)
	config := configObjects(t, "../../config/flowcontrol/flowcontrol.yaml")
	for chartKey, configKey := range map[string]string{
		"FlowSchema/" + membershipSchema:            "FlowSchema/adaptive-lb-membership",
		"FlowSchema/" + statusSchema:                "FlowSchema/adaptive-lb-status",
		"PriorityLevelConfiguration/" + statusLevel: "PriorityLevelConfiguration/adaptive-lb-status",
	} {
		c, k := chart[chartKey], config[configKey]
		if c == nil || k == nil {
			t.Errorf("%s rendered: %v; %s in config/flowcontrol: %v", chartKey, c != nil, configKey, k != nil)
			continue
		}
		spec := runtime.DeepCopyJSONValue(c.Object["spec"]).(map[string]any)
		if level, ok, _ := unstructured.NestedString(spec, "priorityLevelConfiguration", "name"); ok && level == statusLevel {
			_ = unstructured.SetNestedField(spec, "adaptive-lb-status", "priorityLevelConfiguration", "name")
		}
		if c.GetAPIVersion() != k.GetAPIVersion() || !reflect.DeepEqual(spec, k.Object["spec"]) {
			t.Errorf("config/flowcontrol's %s differs from the chart's %s:\n%v %v\n%v %v", configKey, chartKey, k.GetAPIVersion(), k.Object["spec"], c.GetAPIVersion(), spec)
		}
	}
}
