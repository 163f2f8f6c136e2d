package controller

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// slicedService creates Service name with n ready pods in one EndpointSlice and its
// AdaptiveLoadBalancer, and waits until the slices list every address. It returns the
// endpoints, the addresses, and the pod at each address.
func (f *fixture) slicedService(name string, n int, subnet int) ([]sliceEndpoint, []string, map[string]string) {
	f.t.Helper()
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service(name)
	var eps []sliceEndpoint
	var ips []string
	podAt := map[string]string{}
	for i := range n {
		pod, ip := fmt.Sprintf("%s-%d", name, i), fmt.Sprintf("10.%d.%d.%d", subnet, i/200, i%200+1)
		f.pod(name, pod, ip)
		eps = append(eps, ready(pod, ip))
		ips = append(ips, ip)
		podAt[ip] = pod
	}
	f.slice(name, name+"-x", eps...)
	f.alb(name, name)
	f.waitForAddresses(name, slices.Clone(ips)...) // it sorts what it is given
	return eps, ips, podAt
}

// versions maps each slice's name to its resourceVersion.
func versions(list []*networkingv1.ServiceEntry) map[string]string {
	out := map[string]string{}
	for _, se := range list {
		out[se.Name] = se.ResourceVersion
	}
	return out
}

// rewritten names the slices whose resourceVersion changed between two snapshots, and those
// that appeared or went.
func rewritten(before, after map[string]string) []string {
	var out []string
	for name, rv := range after {
		if before[name] != rv {
			out = append(out, name)
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			out = append(out, name+" (deleted)")
		}
	}
	return out
}

// A Service with more endpoints than one slice holds is mirrored as several ServiceEntries of
// the same host: each with exactly the Service's ports, the same labels, owner and install
// label, at most the bound of endpoints, its own record of its own endpoints' weights; the
// status counts them. A membership change rewrites only the slice that holds the endpoint.
func TestMirror_ServiceEntrySlicesSplitAndChangeOneAtATime(t *testing.T) {
	f := newFixture(t)
	eps, ips, _ := f.slicedService("sliced", 100, 40)
	list := f.serviceEntrySlices("sliced")
	if got := strings.Join(sliceNames(list), ","); got != "sliced,sliced.1,sliced.2" {
		t.Fatalf("slices %s, want sliced,sliced.1,sliced.2 (100 endpoints at %d per slice)", got, suiteSliceEndpoints)
	}
	first := list[0]
	for _, se := range list {
		if n := len(se.Spec.Endpoints); n > suiteSliceEndpoints || n == 0 {
			t.Errorf("slice %s has %d endpoints", se.Name, n)
		}
		head, want := se.Spec.DeepCopy(), first.Spec.DeepCopy()
		head.Endpoints, want.Endpoints = nil, nil
		if !proto.Equal(head, want) {
			t.Errorf("slice %s's spec beside its endpoints differs from the first's:\n%v\n%v", se.Name, head, want)
		}
		if !maps.Equal(se.Labels, first.Labels) || se.Labels[ServiceLabel] != "sliced" || se.Labels[InstallLabel] != suiteInstallID {
			t.Errorf("slice %s labels %v, want %v with %s=sliced and the install label", se.Name, se.Labels, first.Labels, ServiceLabel)
		}
		if owner := metav1.GetControllerOf(se); owner == nil || owner.UID != metav1.GetControllerOf(first).UID {
			t.Errorf("slice %s controller %v", se.Name, owner)
		}
		applied, ok := readApplied(se)
		if !ok || len(applied) != len(se.Spec.Endpoints) {
			t.Errorf("slice %s records %d weights for its %d endpoints", se.Name, len(applied), len(se.Spec.Endpoints))
		}
	}
	f.eventually("status counts 3 slices", func() error {
		alb := &adlbv1.AdaptiveLoadBalancer{}
		if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "sliced"}, alb); err != nil {
			return err
		}
		if alb.Status.ServiceEntrySlices != 3 || alb.Status.ServiceEntry != "sliced" {
			return fmt.Errorf("status serviceEntry %q serviceEntrySlices %d", alb.Status.ServiceEntry, alb.Status.ServiceEntrySlices)
		}
		return nil
	})
	// kubectl get -o wide shows the count: the API server's table for the CRD's columns.
	if got, priority := f.wideColumn("adaptiveloadbalancers", "sliced", "Slices"); got != float64(3) || priority != 1 {
		t.Errorf("kubectl get shows Slices %v at priority %d, want 3 at priority 1 (-o wide only)", got, priority)
	}

	// One endpoint leaves: only its slice is written.
	before := versions(f.serviceEntrySlices("sliced"))
	home := ""
	for _, se := range list {
		for _, e := range se.Spec.Endpoints {
			if e.Address == ips[57] {
				home = se.Name
			}
		}
	}
	rest := append(append([]sliceEndpoint(nil), eps[:57]...), eps[58:]...)
	f.slice("sliced", "sliced-x", rest...)
	f.waitForAddresses("sliced", append(append([]string(nil), ips[:57]...), ips[58:]...)...)
	if got := rewritten(before, versions(f.serviceEntrySlices("sliced"))); len(got) != 1 || got[0] != home {
		t.Fatalf("one endpoint leaving %s rewrote %v", home, got)
	}
}

// The weight cycle's write touches only the slices whose weights change, limits the weight sum
// over the union, and records each slice's own weights.
func TestWeightCycle_WritesOnlyTheSlicesWhoseWeightsChange(t *testing.T) {
	f := newFixture(t)
	_, ips, podAt := f.slicedService("weighed", 90, 41)
	list := f.serviceEntrySlices("weighed")
	if len(list) != 3 {
		t.Fatalf("%d slices, want 3", len(list))
	}
	target := list[2].Spec.Endpoints[0].Address
	before := versions(list)
	f.writeWeightsAsTheCycle("weighed", map[string]int{target: 700}, podAt)
	after := f.serviceEntrySlices("weighed")
	if got := rewritten(before, versions(after)); len(got) != 1 || got[0] != "weighed.2" {
		t.Fatalf("a weight change in weighed.2 rewrote %v", got)
	}
	applied, _ := readApplied(after[2])
	if applied[podAt[target]] != 700 {
		t.Fatalf("weighed.2 records %d for %s, want 700", applied[podAt[target]], podAt[target])
	}
	for _, se := range after[:2] {
		if _, ok := readApplied(se); !ok {
			t.Fatalf("slice %s lost its record", se.Name)
		}
	}
	// The mirror keeps the weight across a membership change elsewhere.
	all := map[string]int{}
	for _, ip := range ips {
		all[ip] = 100
	}
	all[target] = 700
	f.writeWeightsAsTheCycle("weighed", all, podAt)
	union, err := f.serviceEntryUnion("weighed")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range union.Spec.Endpoints {
		if want := uint32(all[e.Address]); e.Weight != want {
			t.Fatalf("%s weight %d, want %d", e.Address, e.Weight, want)
		}
	}
}

// A ServiceEntry of a slice's name that someone else owns is never overwritten: the Service is
// not served (ServiceEntryNotOwned), and the slices the operator wrote are deleted rather than
// left beside an object it cannot keep in step.
func TestMirror_ASliceNameSomeoneElseOwnsIsRefused(t *testing.T) {
	f := newFixture(t)
	foreign := sizedServiceEntry(f.ns, "taken.2", 1)
	foreign.Labels = map[string]string{"team": "other"}
	if err := k8s.Create(f.ctx, foreign); err != nil {
		t.Fatal(err)
	}
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("taken")
	var eps []sliceEndpoint
	for i := range 30 {
		pod, ip := fmt.Sprintf("taken-%d", i), fmt.Sprintf("10.42.0.%d", i+1)
		f.pod("taken", pod, ip)
		eps = append(eps, ready(pod, ip))
	}
	f.slice("taken", "taken-x", eps...)
	f.alb("taken", "taken")
	f.waitForCondition("taken", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	for i := 30; i < 100; i++ { // two more slices needed: taken.1, then taken.2, which is taken
		pod, ip := fmt.Sprintf("taken-%d", i), fmt.Sprintf("10.42.%d.%d", i/200, i%200+1)
		f.pod("taken", pod, ip)
		eps = append(eps, ready(pod, ip))
	}
	f.slice("taken", "taken-x", eps...)
	c := f.waitForCondition("taken", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonServiceEntryNotOwned)
	if !strings.Contains(c.Message, "ServiceEntry "+f.ns+"/taken.2 exists and is not owned") {
		t.Fatalf("message %q does not name taken.2", c.Message)
	}
	f.eventually("the operator's slices deleted, the foreign one kept", func() error {
		left := sliceNames(f.serviceEntrySlices("taken"))
		if strings.Join(left, ",") != "taken.2" {
			return fmt.Errorf("slices %v", left)
		}
		return nil
	})
	if err := k8s.Delete(f.ctx, foreign); err != nil {
		t.Fatal(err)
	}
	f.waitForCondition("taken", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	if got := len(f.serviceEntrySlices("taken")); got != 3 {
		t.Fatalf("%d slices after the foreign one went, want 3", got)
	}
}

// When the Service goes, every slice goes with its first.
func TestMirror_EverySliceGoesWithTheService(t *testing.T) {
	f := newFixture(t)
	f.slicedService("gone", 85, 43)
	if got := len(f.serviceEntrySlices("gone")); got != 3 {
		t.Fatalf("%d slices, want 3", got)
	}
	if err := k8s.Delete(f.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	f.waitForCondition("gone", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonTargetNotFound)
	f.eventually("every slice deleted", func() error {
		if left := sliceNames(f.serviceEntrySlices("gone")); len(left) > 0 {
			return fmt.Errorf("slices %v left", left)
		}
		return nil
	})
}

func sliceNames(list []*networkingv1.ServiceEntry) []string {
	out := make([]string, len(list))
	for i, se := range list {
		out[i] = se.Name
	}
	return out
}

// A Service of 10,000 ready pods (four times what one ServiceEntry could hold in etcd) is
// mirrored in slices and gets weights; one endpoint above the per-Service limit removes every
// slice (clients fall back to the Kubernetes endpoints) and says why, and back under it the
// slices return. Bounded: the pods are created by 8 writers, and every wait is the fixture's.
func TestMirror_TenThousandPodsGetWeightsInSlices(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("huge")
	const n = suiteMaxEndpoints + 1
	eps := make([]sliceEndpoint, n)
	ips := make([]string, n)
	podAt := map[string]string{}
	for i := range n {
		pod, ip := fmt.Sprintf("huge-%05d", i), fmt.Sprintf("10.%d.%d.%d", 60+i/60000, i/240%250, i%240+1)
		eps[i], ips[i], podAt[ip] = ready(pod, ip), ip, pod
	}
	f.createPods("huge", eps)
	// EndpointSlices hold at most 1,000 endpoints.
	setSlices := func(eps []sliceEndpoint) {
		for s := 0; s*1000 < n; s++ {
			f.slice("huge", fmt.Sprintf("huge-%02d", s), eps[min(s*1000, len(eps)):min((s+1)*1000, len(eps))]...)
		}
	}
	setSlices(eps[:n-1])
	f.alb("huge", "huge")
	f.waitForAddresses("huge", slices.Clone(ips[:n-1])...)
	list := f.serviceEntrySlices("huge")
	if want := (n - 1) / suiteSliceEndpoints; len(list) != want {
		t.Fatalf("%d slices for %d endpoints, want %d", len(list), n-1, want)
	}
	f.waitForCondition("huge", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)

	// Weights for all of them, as the weight cycle writes them.
	byIP := map[string]int{}
	for i, ip := range ips[:n-1] {
		byIP[ip] = 50 + i%200
	}
	f.writeWeightsAsTheCycle("huge", byIP, podAt)
	union, err := f.serviceEntryUnion("huge")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range union.Spec.Endpoints {
		if int(e.Weight) != byIP[e.Address] {
			t.Fatalf("%s has weight %d, want %d", e.Address, e.Weight, byIP[e.Address])
		}
	}
	applied, ok := readApplied(union)
	if !ok || len(applied) != n-1 {
		t.Fatalf("the slices record %d weights, want %d", len(applied), n-1)
	}

	// One more endpoint than the limit: every slice goes.
	setSlices(eps)
	c := f.waitForCondition("huge", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonTooManyEndpoints)
	if want := fmt.Sprintf("%d ready endpoints, above the limit of %d endpoints per Service", n, n-1); !strings.Contains(c.Message, want) {
		t.Fatalf("message %q lacks %q", c.Message, want)
	}
	f.eventually("every ServiceEntry slice deleted", func() error {
		if left := f.serviceEntrySlices("huge"); len(left) > 0 {
			return fmt.Errorf("%d slices still there, the first %s", len(left), left[0].Name)
		}
		return nil
	})
	setSlices(eps[1:])
	f.waitForAddresses("huge", slices.Clone(ips[1:])...)
	f.waitForCondition("huge", adlbv1.ConditionEndpointsMirrored, metav1.ConditionTrue, adlbv1.ReasonMirrored)
}

// createPods creates the pods of eps for app, as f.pod does (without their status, which the
// mirror does not read: the EndpointSlices say which are ready), with 8 writers.
func (f *fixture) createPods(app string, eps []sliceEndpoint) {
	f.t.Helper()
	work := make(chan sliceEndpoint)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var first error
			for e := range work {
				if first != nil {
					continue
				}
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: e.pod, Namespace: f.ns,
						Labels:      map[string]string{"app": app, "version": "v1", "security.istio.io/tlsMode": "istio"},
						Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}},
					Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: app + "-sa",
						Containers: []corev1.Container{{Name: "app", Image: "app"}, {Name: "istio-proxy", Image: "proxy"}}},
				}
				first = f.c.Create(f.ctx, p)
			}
			errs <- first
		})
	}
	for _, e := range eps {
		work <- e
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			f.t.Fatal(err)
		}
	}
}

// Someone else's write to one slice makes the operator's next write to it conflict, and an edit
// of its weights makes the cache disagree with the operator's version: both are resolved by
// reading that slice, and only that one, from the API server. A list of the Service's slices
// (what the slices first did) is what the API server pays the most for at scale; none is made.
func TestMirror_AConflictOnASliceIsResolvedWithoutAList(t *testing.T) {
	f := newFixture(t)
	eps, ips, _ := f.slicedService("conflicted", 100, 44)
	list := f.serviceEntrySlices("conflicted")
	if len(list) != 3 {
		t.Fatalf("%d slices, want 3", len(list))
	}
	listsBefore, getsBefore := serviceEntryReads(f.ns, "list"), serviceEntryReads(f.ns, "get")
	getsConcernedBefore := serviceEntryReads(f.ns, "get conflicted.1") + serviceEntryReads(f.ns, "get conflicted.2")

	// Another controller annotates conflicted.1: nothing the mirror writes changes, so the
	// operator's remembered version of it is now behind the API server's.
	second := list[1]
	if err := k8s.Patch(f.ctx, second, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"example.com/audited":"yes"}}}`))); err != nil {
		t.Fatal(err)
	}
	// An endpoint of conflicted.1 leaves: the mirror's update of it conflicts, and is retried on
	// the API server's version, keeping the other controller's annotation.
	leaving := second.Spec.Endpoints[0].Address
	var rest []sliceEndpoint
	var want []string
	for i, e := range eps {
		if ips[i] != leaving {
			rest = append(rest, e)
			want = append(want, ips[i])
		}
	}
	f.slice("conflicted", "conflicted-x", rest...)
	f.waitForAddresses("conflicted", want...)
	after, err := f.serviceEntry("conflicted.1")
	if err != nil {
		t.Fatal(err)
	}
	if after.Annotations["example.com/audited"] != "yes" {
		t.Fatalf("the mirror's write dropped another controller's annotation: %v", after.Annotations)
	}

	// Someone edits a weight in conflicted.2 by hand: the operator restores it.
	third := f.serviceEntrySlices("conflicted")[2]
	edited := third.DeepCopy()
	edited.Spec.Endpoints[0].Weight = 999
	if err := k8s.Update(f.ctx, edited); err != nil {
		t.Fatal(err)
	}
	f.eventually("the hand-edited weight restored", func() error {
		se, err := f.serviceEntry("conflicted.2")
		if err != nil {
			return err
		}
		if w := se.Spec.Endpoints[0].Weight; w == 999 {
			return fmt.Errorf("weight still %d", w)
		}
		return nil
	})

	if lists := serviceEntryReads(f.ns, "list") - listsBefore; lists != 0 {
		t.Errorf("the operator listed ServiceEntries %d times to resolve the conflicts; want none", lists)
	}
	// Gets of the two slices concerned only, a few retries at most.
	gets := serviceEntryReads(f.ns, "get") - getsBefore
	concerned := serviceEntryReads(f.ns, "get conflicted.1") + serviceEntryReads(f.ns, "get conflicted.2") - getsConcernedBefore
	if gets == 0 || gets != concerned || gets > 2*maxSliceRetries {
		t.Errorf("the operator read %d ServiceEntries from the API server, %d of them conflicted.1 and conflicted.2; want those two slices only, at most %d reads", gets, concerned, 2*maxSliceRetries)
	}
}

// A weight write that fails part-way leaves the slices written so far with the new weights and
// the rest with the old (no address is in two slices, so none carries two weights), says how
// far it got, and the next cycle's write completes it, rewriting only what is left.
func TestWeightCycle_AWeightWriteFailingPartWayIsCompletedByTheNextCycle(t *testing.T) {
	f := newFixture(t)
	_, ips, podAt := f.slicedService("partial", 90, 45)
	list := f.serviceEntrySlices("partial")
	if got := strings.Join(sliceNames(list), ","); got != "partial,partial.1,partial.2" {
		t.Fatalf("slices %s, want partial,partial.1,partial.2", got)
	}
	next := map[string]int{}
	for i, ip := range ips {
		next[ip] = 200 + i%5
	}
	write := func() error { return f.tryWriteWeightsAsTheCycle("partial", next, podAt) }
	weighted := func(se *networkingv1.ServiceEntry) bool {
		for _, e := range se.Spec.Endpoints {
			if int(e.Weight) != next[e.Address] {
				return false
			}
		}
		return true
	}

	fault := &apiFault{status: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}, object: "partial.2"}
	apiFaults.Store(f.ns, fault)
	err := write()
	apiFaults.Delete(f.ns)
	if err == nil || !strings.Contains(err.Error(), "reached 2 of the Service's 3 ServiceEntry slices") {
		t.Fatalf("error %v, want one saying the weights reached 2 of 3 slices", err)
	}
	half := f.serviceEntrySlices("partial")
	if !weighted(half[0]) || !weighted(half[1]) || weighted(half[2]) {
		t.Fatalf("after the failure: new weights in partial %t, partial.1 %t, partial.2 %t; want true, true, false", weighted(half[0]), weighted(half[1]), weighted(half[2]))
	}
	seen := map[string]bool{}
	for _, se := range half {
		for _, e := range se.Spec.Endpoints {
			if seen[e.Address] {
				t.Fatalf("address %s in two slices", e.Address)
			}
			seen[e.Address] = true
		}
	}

	before := versions(half)
	if err := write(); err != nil {
		t.Fatalf("the next cycle's write: %v", err)
	}
	after := f.serviceEntrySlices("partial")
	for _, se := range after {
		if !weighted(se) {
			t.Fatalf("slice %s lacks the new weights after the next cycle", se.Name)
		}
	}
	if got := rewritten(before, versions(after)); len(got) != 1 || got[0] != "partial.2" {
		t.Fatalf("the next cycle rewrote %v, want only partial.2", got)
	}
}

// wideColumn returns the cell of column in the API server's table of one of the suite's
// resources (what kubectl get -o wide prints) and the column's priority (0: kubectl get
// prints it; 1: only -o wide), failing when there is no such column.
func (f *fixture) wideColumn(resource, name, column string) (any, int32) {
	f.t.Helper()
	httpClient, err := rest.HTTPClientFor(testConfig)
	if err != nil {
		f.t.Fatal(err)
	}
	url := fmt.Sprintf("%s/apis/%s/namespaces/%s/%s/%s", strings.TrimSuffix(testConfig.Host, "/"), adlbv1.GroupVersion.String(), f.ns, resource, name)
	req, err := http.NewRequestWithContext(f.ctx, http.MethodGet, url, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := httpClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var table metav1.Table
	if err := json.NewDecoder(resp.Body).Decode(&table); err != nil {
		f.t.Fatalf("decode the table of %s %s: %v", resource, name, err)
	}
	for i, c := range table.ColumnDefinitions {
		if c.Name == column && len(table.Rows) == 1 && i < len(table.Rows[0].Cells) {
			return table.Rows[0].Cells[i], c.Priority
		}
	}
	f.t.Fatalf("the table of %s %s has no column %s (columns %v)", resource, name, column, table.ColumnDefinitions)
	return nil, 0
}

// Issue 31: a Service's first mirror creates its slices side by side (a 10,000-pod Service's
// 100 slices one after another were most of its start-up). When one create fails part-way, the
// mirror says so and its retry completes the slices on those created: every address in exactly
// one slice, none created twice.
func TestMirror_SlicesCreatedSideBySideSurviveACreateFailingPartWay(t *testing.T) {
	f := newFixture(t)
	f.node("node-a", "eu-west", "eu-west-1a")
	f.service("wide")
	var eps []sliceEndpoint
	var ips []string
	for i := range 200 {
		pod, ip := fmt.Sprintf("wide-%d", i), fmt.Sprintf("10.47.%d.%d", i/200, i%200+1)
		f.pod("wide", pod, ip)
		eps = append(eps, ready(pod, ip))
		ips = append(ips, ip)
	}
	f.slice("wide", "wide-x", eps...)
	// The third ServiceEntry write of the namespace, and every one after, fails until lifted.
	fault := &apiFault{status: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: "injected: etcdserver: leader changed"}, passFirst: 2}
	apiFaults.Store(f.ns, fault)
	f.alb("wide", "wide")
	f.waitForCondition("wide", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)
	if created := len(f.serviceEntrySlices("wide")); created > 2 {
		t.Fatalf("%d slices exist after the third create failed; at most the two let through", created)
	}
	apiFaults.Delete(f.ns)
	f.waitForAddresses("wide", ips...)
	list := f.serviceEntrySlices("wide")
	seen := map[string]string{}
	for _, se := range list {
		for _, e := range se.Spec.Endpoints {
			if other, dup := seen[e.Address]; dup {
				t.Fatalf("address %s in slices %s and %s", e.Address, other, se.Name)
			}
			seen[e.Address] = se.Name
		}
	}
	if want := (200 + suiteSlices() - 1) / suiteSlices(); len(list) < want {
		t.Fatalf("%d slices for 200 endpoints, want at least %d", len(list), want)
	}
}
