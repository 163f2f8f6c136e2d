package controller

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/progress"
	"github.com/adaptive-lb/adaptive-lb/internal/testtools"
)

// wedge freezes the operator's lists and watches of one resource the way a broken connection,
// proxy or API server watch does: no error, just no data. Armed for watches, every watch of the
// resource stops delivering (also one already open, mid-stream); armed for everything, lists hang
// too. With untilCut, it disarms itself once a wedged stream has been cut: the fault was that one
// stream.
type wedge struct {
	next     http.RoundTripper
	resource string // a path segment, "endpointslices"

	mu       sync.Mutex
	watches  bool
	lists    bool
	untilCut bool
	cuts     atomic.Int64
}

func (w *wedge) arm(lists, untilCut bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watches, w.lists, w.untilCut = true, lists, untilCut
}

func (w *wedge) disarm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watches, w.lists = false, false
}

func (w *wedge) state() (watches, lists bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watches, w.lists
}

func (w *wedge) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/"+w.resource) {
		return w.next.RoundTrip(req)
	}
	watch := req.URL.Query().Get("watch") == "true"
	if _, lists := w.state(); lists && !watch {
		<-req.Context().Done() // headers never come
		w.cut()
		return nil, req.Context().Err()
	}
	resp, err := w.next.RoundTrip(req)
	if err != nil || !watch {
		return resp, err
	}
	resp.Body = &wedgedBody{w: w, ctx: req.Context(), real: resp.Body}
	return resp, nil
}

func (w *wedge) cut() {
	w.cuts.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.untilCut {
		w.watches, w.lists, w.untilCut = false, false, false
	}
}

// wedgedBody passes a watch's data through until the wedge is armed; from then on it drops what
// arrives and blocks until the request is cancelled.
type wedgedBody struct {
	w    *wedge
	ctx  context.Context
	real io.ReadCloser
}

func (b *wedgedBody) Read(p []byte) (int, error) {
	if watches, _ := b.w.state(); !watches {
		n, err := b.real.Read(p)
		if watches, _ := b.w.state(); !watches || n == 0 {
			return n, err
		}
	}
	<-b.ctx.Done()
	b.w.cut()
	return 0, b.ctx.Err()
}

func (b *wedgedBody) Close() error { return b.real.Close() }

// isolatedCluster is an API server of its own, with kube-controller-manager, and an operator
// manager whose informers' progress is tracked with test-sized limits and pass through a wedge
// on EndpointSlices. The suite's shared operator cannot be used: its limits must never take a
// quiet informer for a blind one, and a wedge there would blind it for every test.
type isolatedCluster struct {
	*fixture
	wedge     *wedge
	bookmarks *bookmarkCounter
	tracker   *progress.Tracker
	heartbeat types.NamespacedName
}

// isolatedLimits: a list or watch silent for 2 s is cut, an informer without progress for 6 s is
// blind, a failure not repaired within 1 s is blindness, and ServiceEntries go 10 s after.
var isolatedLimits = progress.Config{SilenceLimit: 2 * time.Second, BlindAfter: 6 * time.Second, ErrorGrace: time.Second}

const isolatedStaleTimeout = 10 * time.Second

// isolatedOptions vary the isolated cluster.
type isolatedOptions struct {
	// wedged is the resource (a path segment) whose lists and watches the wedge can freeze;
	// "endpointslices" when empty.
	wedged string
	// limits are the tracker's; isolatedLimits when nil.
	limits *progress.Config
	// quiet leaves the cluster alone: no helper keeps every informer busy.
	quiet bool
}

func newIsolatedCluster(t *testing.T) *isolatedCluster {
	t.Helper()
	return newIsolatedClusterWith(t, isolatedOptions{})
}

func newIsolatedClusterWith(t *testing.T, o isolatedOptions) *isolatedCluster {
	t.Helper()
	if o.wedged == "" {
		o.wedged = "endpointslices"
	}
	limits := isolatedLimits
	if o.limits != nil {
		limits = *o.limits
	}
	requireControllerManager(t)
	istioCRDs, err := testtools.IstioCRDPath()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases"), istioCRDs},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	testtools.RunControllerManager(t, env)
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	c := &isolatedCluster{fixture: newFixtureOn(t, admin), tracker: NewInformerProgress(limits)}
	opCfg := rest.CopyConfig(cfg)
	opCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		c.bookmarks = &bookmarkCounter{next: rt}
		c.wedge = &wedge{next: c.bookmarks, resource: o.wedged}
		return c.wedge
	}
	cacheOpts, err := WithProgress(CacheOptions(), opCfg, c.tracker)
	if err != nil {
		t.Fatal(err)
	}
	opCfg.WrapTransport = nil // writes and uncached reads are never wedged
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Cache: cacheOpts,
		Controller: config.Controller{SkipNameValidation: ptrTo(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &AdaptiveLoadBalancerReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorderFor("adaptive-lb"),
		Metrics: NewMetrics(prometheus.NewRegistry()), ClusterDomain: "cluster.local", Membership: NewMembership(nil),
		StaleServiceEntryTimeout: isolatedStaleTimeout, Progress: c.tracker,
		// No TSDB here: the mesh is told to be this cluster alone (its meshNetworks still counts).
		Mesh: MeshSource{IstioNamespace: istioNamespace, MeshConfigMap: "istio", MultiCluster: istio.MultiClusterFalse},
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.SetupWithManager(ctx, mgr, 2); err != nil {
		t.Fatal(err)
	}
	c.heartbeat = types.NamespacedName{Namespace: "default", Name: HeartbeatLeaseName("adaptive-lb.adaptivelb.io")}
	if err := mgr.Add(&Heartbeat{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Lease: c.heartbeat, Identity: "isolated",
		Interval: 200 * time.Millisecond, Progress: c.tracker, Logger: mgr.GetLogger()}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("operator manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	if !o.quiet {
		c.keepBusy()
	}
	return c
}

// keepBusy changes an object of every kind the mirror watches every 300 ms, in a namespace of its
// own, until ctx ends. A healthy watch then delivers data well within the test-sized silence
// limit, as in a real cluster it gets the API server's bookmark every minute (the API server
// offers no way to send bookmarks faster); only a wedged one stays silent. The objects are
// nobody's target, so no reconcile follows.
func (c *isolatedCluster) keepBusy() {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	busy := newFixtureOn(c.t, c.c)
	busy.node("busy-node", "eu-west", "eu-west-1a")
	objs := []client.Object{
		busy.service("busy"),
		busy.pod("busy", "busy", "10.59.0.1"),
		busy.alb("busy", "nothing"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "busy-node"}},
	}
	busy.slice("busy", "busy-x", ready("busy", "10.59.0.1"))
	// Someone else's ServiceEntry: one labelled as the operator's, without an owner, is an
	// orphan the operator deletes at once, and its informer would then get nothing.
	se := sizedServiceEntry(busy.ns, "busy", 1)
	se.Labels = nil
	busy.create(se)
	objs = append(objs, se, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: busy.ns, Name: "busy-x"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: busy.ns}})
	// The mesh facts: istiod's ConfigMap and Deployment (their informers watch these alone).
	istiod := c.istiodObjects()
	objs = append(objs, istiod...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(300 * time.Millisecond)
		defer ticker.Stop()
		for n := 0; ; n++ {
			for _, o := range objs {
				patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"test.adaptivelb.io/busy":"%d"}}}`, n))
				_ = c.c.Patch(ctx, o, client.RawPatch(types.MergePatchType, patch))
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	c.t.Cleanup(func() { cancel(); <-done })
}

// istiodObjects creates istiod's namespace, ConfigMap and Deployment in the isolated cluster.
func (c *isolatedCluster) istiodObjects() []client.Object {
	c.t.Helper()
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioNamespace}})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: istioNamespace}, Data: map[string]string{"mesh": "accessLogFile: /dev/stdout\n"}}
	c.create(cm)
	labels := map[string]string{IstiodAppLabel: "istiod"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "istiod", Namespace: istioNamespace, Labels: map[string]string{IstiodAppLabel: "istiod", VersionLabel: "1.29.2"}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "discovery", Image: "pilot"}}}}},
	}
	c.create(d)
	return []client.Object{cm, d}
}

// heartbeatRenewed reports the heartbeat Lease's renew time.
func (c *isolatedCluster) heartbeatRenewed() time.Time {
	c.t.Helper()
	renewed, err := testtools.LeaseRenewTime(c.ctx, c.c, c.heartbeat)
	if err != nil {
		c.t.Fatal(err)
	}
	return renewed
}

// A watch that stays open and delivers nothing (here: only the EndpointSlice watch that is open
// when the fault strikes) would freeze the informer's cache while every read from it succeeds.
// The tracker cuts it once it has been silent longer than the API server's bookmark period
// allows; the informer lists again, and the mirror follows the pods again, without ever having
// removed the ServiceEntry.
func TestInformers_AWedgedWatchIsCutAndTheMirrorFollowsAgain(t *testing.T) {
	c := newIsolatedCluster(t)
	c.mirroredService("10.50.0.1", "10.50.0.2")
	se, err := c.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}

	c.wedge.arm(false, true)
	c.setPodReady("web-2", false)
	c.waitForSliceEndpoint("web", "web-2", endpointState{})
	c.waitForAddresses("web", "10.50.0.1")
	if c.wedge.cuts.Load() == 0 {
		t.Fatal("the ServiceEntry followed the change without the wedged watch being cut: the wedge did not hold")
	}
	if now, err := c.serviceEntry("web"); err != nil || now.UID != se.UID {
		t.Fatalf("the ServiceEntry was replaced or removed (err %v): a wedged watch that one cut repairs is no blindness", err)
	}
	c.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// An informer that can neither watch nor list (every request for EndpointSlices hangs) keeps
// serving the state it last saw, and a pod that leaves meanwhile would stay in the ServiceEntry
// for good. Once the informer has made no progress for the tracker's limit, the mirror stops
// writing from it (CacheStale, a Warning event), the leader stops renewing its heartbeat for the
// fail-open watchdog, and the ServiceEntry is deleted once that has lasted the stale timeout:
// clients use the Kubernetes endpoints. When the informer recovers, it is re-created with the
// current endpoints and the heartbeat resumes.
func TestInformers_AnInformerThatCannotListRemovesTheServiceEntries(t *testing.T) {
	c := newIsolatedCluster(t)
	c.mirroredService("10.51.0.1", "10.51.0.2")
	c.eventually("the heartbeat is renewed", func() error {
		if c.heartbeatRenewed().IsZero() {
			return errNotYet
		}
		return nil
	})

	c.wedge.arm(true, false)
	c.setPodReady("web-2", false)
	c.waitForSliceEndpoint("web", "web-2", endpointState{})
	stale := c.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonCacheStale)
	if !strings.Contains(stale.Message, "endpointslices.discovery.k8s.io informer has seen nothing since") {
		t.Errorf("CacheStale message %q does not name the informer", stale.Message)
	}
	if _, err := c.serviceEntry("web"); err != nil {
		t.Fatalf("the ServiceEntry went before the stale timeout: %v", err)
	}
	withheld := c.heartbeatRenewed()
	c.eventually("the ServiceEntry is deleted", func() error {
		if _, err := c.serviceEntry("web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	removed := c.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionFalse, adlbv1.ReasonStaleServiceEntryRemoved)
	if !strings.Contains(removed.Message, "endpointslices.discovery.k8s.io") || !strings.Contains(removed.Message, "Kubernetes endpoints") {
		t.Errorf("Ready message %q should name the blind informer and the fallback", removed.Message)
	}
	if got := c.heartbeatRenewed(); !got.Equal(withheld) {
		t.Errorf("the heartbeat was renewed (%v, was %v) while an informer was blind", got, withheld)
	}
	if len(c.warningEvents(EventCacheStale)) == 0 {
		t.Error("no CacheStale warning event")
	}

	c.wedge.disarm()
	c.waitForAddresses("web", "10.51.0.1")
	c.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	c.eventually("the heartbeat resumes", func() error {
		if !c.heartbeatRenewed().After(withheld) {
			return errNotYet
		}
		return nil
	})
}

// The mesh facts are read from informers too (namespaces, istiod's ConfigMap and Deployments):
// frozen, they would keep a ServiceEntry up for a mesh that has changed, here istiod's
// meshNetworks now naming a second cluster's registry, while the heartbeat says all is well.
// A blind one stops the mirror as any blind informer does (CacheStale, naming it), the
// heartbeat is withheld, and the ServiceEntry goes once that has lasted the stale timeout; once
// the informer sees again, the mirror follows the mesh as it is now (MultiCluster).
func TestInformers_ABlindMeshFactInformerFailsOpen(t *testing.T) {
	c := newIsolatedClusterWith(t, isolatedOptions{wedged: "configmaps"})
	c.mirroredService("10.52.0.1", "10.52.0.2")
	c.eventually("the heartbeat is renewed", func() error {
		if c.heartbeatRenewed().IsZero() {
			return errNotYet
		}
		return nil
	})

	c.wedge.arm(true, false)
	cm := &corev1.ConfigMap{}
	if err := c.c.Get(c.ctx, types.NamespacedName{Namespace: istioNamespace, Name: "istio"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["meshNetworks"] = "networks:\n  east: {endpoints: [{fromRegistry: east}]}\n  west: {endpoints: [{fromRegistry: west}]}\n"
	if err := c.c.Update(c.ctx, cm); err != nil {
		t.Fatal(err)
	}
	stale := c.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonCacheStale)
	if !strings.Contains(stale.Message, "the configmaps in "+istioNamespace+" informer has seen nothing since") {
		t.Errorf("CacheStale message %q does not name istiod's ConfigMap informer", stale.Message)
	}
	withheld := c.heartbeatRenewed()
	c.eventually("the ServiceEntry is deleted", func() error {
		if _, err := c.serviceEntry("web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	if got := c.heartbeatRenewed(); !got.Equal(withheld) {
		t.Errorf("the heartbeat was renewed (%v, was %v) while istiod's ConfigMap informer was blind", got, withheld)
	}

	c.wedge.disarm()
	mc := c.waitForCondition("web", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonMultiCluster)
	if !strings.Contains(mc.Message, "meshNetworks registries east, west") {
		t.Errorf("MultiCluster message %q does not name the evidence", mc.Message)
	}
	if _, err := c.serviceEntry("web"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ServiceEntry in a mesh of two clusters (err %v)", err)
	}
}
