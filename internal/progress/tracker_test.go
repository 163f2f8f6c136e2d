package progress

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for the tracker's decisions; the HTTP traffic itself is real.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// apiServer answers like kube-apiserver: lists of endpointslices succeed or are forbidden, and a
// watch sends one event and then nothing (a wedged stream) until the client goes away.
type apiServer struct {
	mu        sync.Mutex
	forbidden bool
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	forbidden := a.forbidden
	a.mu.Unlock()
	if forbidden {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:adaptive-lb-system:adaptive-lb\" cannot list resource \"endpointslices\"","reason":"Forbidden","code":403}`)
		return
	}
	if r.URL.Query().Get("watch") != "true" {
		_, _ = io.WriteString(w, `{"kind":"EndpointSliceList","items":[]}`)
		return
	}
	_, _ = io.WriteString(w, `{"type":"ADDED","object":{}}`+"\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

func (a *apiServer) forbid() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forbidden = true
}

func newTracked(t *testing.T) (*Tracker, *fakeClock, *apiServer, *http.Client, string) {
	t.Helper()
	api := &apiServer{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	clock := &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	tr := New(Config{SilenceLimit: 90 * time.Second, BlindAfter: 3 * time.Minute, ErrorGrace: 5 * time.Second, Now: clock.Now})
	return tr, clock, api, &http.Client{Transport: tr.Wrap(http.DefaultTransport)}, srv.URL
}

func list(t *testing.T, c *http.Client, url string) {
	t.Helper()
	resp, err := c.Get(url + "/apis/discovery.k8s.io/v1/endpointslices?limit=500")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
}

func blindness(tr *Tracker) string {
	var out []string
	for _, b := range tr.Blind() {
		out = append(out, b.String())
	}
	return strings.Join(out, "; ")
}

// A list that is refused (the Role lost its verb) makes the informer blind once its retries have
// had ErrorGrace to repair it, blind since the refusal and with the API server's message; a list
// that succeeds again ends it.
func TestTracker_ARefusedListIsBlindnessAfterTheGrace(t *testing.T) {
	tr, clock, api, c, url := newTracked(t)
	list(t, c, url)
	clock.Step(time.Minute)
	api.forbid()
	refusedAt := clock.Now()
	list(t, c, url)
	if got := blindness(tr); got != "" {
		t.Fatalf("blind at once on one refusal: %s", got)
	}
	clock.Step(5 * time.Second)
	blind := tr.Blind()
	if len(blind) != 1 {
		t.Fatalf("after the grace: %v, want the endpointslices informer blind", blind)
	}
	b := blind[0]
	if b.Informer != "endpointslices.discovery.k8s.io" || b.Resource != "endpointslices.discovery.k8s.io" || !b.Since.Equal(refusedAt) || !strings.Contains(b.Cause, "cannot list resource") || !strings.Contains(b.Cause, "HTTP 403") {
		t.Fatalf("blindness %+v: want the informer, the time of the refusal and the API server's message", b)
	}
	api.mu.Lock()
	api.forbidden = false
	api.mu.Unlock()
	list(t, c, url)
	if got := blindness(tr); got != "" {
		t.Fatalf("still blind after a list succeeded: %s", got)
	}
}

// A watch that stays open and delivers nothing is cut after SilenceLimit: its reader gets the end
// of the stream, as when the API server closes a watch, so the informer watches again. Without
// data after it, the informer is blind once BlindAfter has passed since its last data.
func TestTracker_ASilentWatchIsCutAndThenBlindness(t *testing.T) {
	tr, clock, _, c, url := newTracked(t)
	list(t, c, url)
	resp, err := c.Get(url + "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices?watch=true&allowWatchBookmarks=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	if n, err := resp.Body.Read(buf); n == 0 || err != nil {
		t.Fatalf("first event: %d bytes, %v", n, err)
	}
	lastData := clock.Now()
	clock.Step(89 * time.Second)
	if cut := tr.CutSilent(); len(cut) != 0 {
		t.Fatalf("cut %v before the silence limit", cut)
	}
	clock.Step(time.Second)
	if cut := tr.CutSilent(); strings.Join(cut, ",") != "endpointslices.discovery.k8s.io in shop" {
		t.Fatalf("cut %v at the silence limit, want the watch in shop", cut)
	}
	_, err = resp.Body.Read(buf)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("the cut watch's reader got %v, want the end of the stream", err)
	}
	if got := blindness(tr); got != "" {
		t.Fatalf("blind right after the cut, before the informer could list again: %s", got)
	}
	clock.Step(3*time.Minute - 90*time.Second)
	blind := tr.Blind()
	if len(blind) != 2 {
		t.Fatalf("blindness %v: want both informers (the cluster-wide list made no progress either)", blind)
	}
	for _, b := range blind {
		if b.Informer == "endpointslices.discovery.k8s.io in shop" && (!b.Since.Equal(lastData) || !strings.Contains(b.Cause, "nothing received for longer than 3m0s")) {
			t.Fatalf("blindness %+v: want it since the watch's last data, for silence", b)
		}
	}
}

// Only an informer's requests count: a GET of one object, a write, or a request the caller
// cancelled (the manager stopping) is neither progress nor failure.
func TestTracker_OnlyListsAndWatchesAreInformerTraffic(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/pods":                                                    "pods",
		"/api/v1/namespaces/shop/pods":                                    "pods in shop",
		"/api/v1/namespaces":                                              "namespaces",
		"/api/v1/namespaces/shop":                                         "",
		"/api/v1/namespaces/shop/pods/web-1":                              "",
		"/apis/discovery.k8s.io/v1/endpointslices":                        "endpointslices.discovery.k8s.io",
		"/apis/networking.istio.io/v1/namespaces/shop/serviceentries":     "serviceentries.networking.istio.io in shop",
		"/apis/networking.istio.io/v1/namespaces/shop/serviceentries/web": "",
		"/apis/adaptivelb.io/v1alpha1/adaptiveloadbalancers":              "adaptiveloadbalancers.adaptivelb.io",
		"/apis":       "",
		"/healthz":    "",
		"/version":    "",
		"/openapi/v3": "",
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		got, _, ok := informerKey(req, "")
		if got != want || ok != (want != "") {
			t.Errorf("%s: informer %q (%v), want %q", path, got, ok, want)
		}
		// The same API server under Rancher's path for a downstream cluster.
		prefixed := httptest.NewRequest(http.MethodGet, "/k8s/clusters/c-m-4xkq2"+path, nil)
		if got, _, ok := informerKey(prefixed, "/k8s/clusters/c-m-4xkq2"); got != want || ok != (want != "") {
			t.Errorf("%s under /k8s/clusters/c-m-4xkq2: informer %q (%v), want %q", path, got, ok, want)
		}
	}
	if _, _, ok := informerKey(httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/shop/pods", nil), ""); ok {
		t.Error("a POST counted as informer traffic")
	}

	tr, clock, _, c, url := newTracked(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/pods?watch=true", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	_, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	clock.Step(10 * time.Second)
	if got := blindness(tr); got != "" {
		t.Fatalf("a watch the caller cancelled counted as a failure: %s", got)
	}
}
