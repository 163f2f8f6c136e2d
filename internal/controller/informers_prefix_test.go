package controller

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// rancherPrefix is where Rancher's proxy serves a downstream cluster's API.
const rancherPrefix = "/k8s/clusters/c-m-4xkq2"

// prefixProxy serves the suite's API server under rancherPrefix, as Rancher's proxy does, and
// refuses every request for pods with the API server's 403.
func prefixProxy(t *testing.T) *rest.Config {
	t.Helper()
	upstream, err := url.Parse(testConfig.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(testConfig)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, rancherPrefix)
			r.Out.URL.RawPath = ""
		},
		Transport:     transport,
		FlushInterval: -1, // watches stream
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, rancherPrefix+"/") {
			http.NotFound(w, r)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/pods") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden: User \"u-rancher\" cannot list resource \"pods\" in API group \"\" at the cluster scope","reason":"Forbidden","code":403}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL + rancherPrefix}
}

// An API server reached under a path prefix (Rancher serves each downstream cluster at
// /k8s/clusters/<id>) is tracked like any other: a refused list of pods there is blindness
// once the grace has passed, and an informer that lists fine is not.
func TestWithProgress_AnAPIServerUnderAPathPrefixIsTracked(t *testing.T) {
	requireEnv(t)
	cfg := prefixProxy(t)
	tracker := NewInformerProgress(isolatedLimits)
	opts, err := WithProgress(cache.Options{Scheme: scheme}, cfg, tracker)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if _, err := c.GetInformer(ctx, &corev1.Service{}); err != nil {
		t.Fatalf("the Service informer through the prefix: %v", err)
	}
	if _, err := c.GetInformer(ctx, &corev1.Pod{}, cache.BlockUntilSynced(false)); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: ctx}
	f.eventually("the refused pods informer is blind", func() error {
		for _, b := range tracker.Blind() {
			if b.Resource == "services" {
				t.Fatalf("the Service informer, which lists fine, is reported blind: %s", b)
			}
			if b.Resource == "pods" && strings.Contains(b.Cause, "pods is forbidden") {
				return nil
			}
		}
		return errNotYet
	})
}
