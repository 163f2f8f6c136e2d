package metrics

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfig_Validate(t *testing.T) {
	cases := map[string]struct {
		cfg  Config
		want string // substring of the error; empty means valid
	}{
		"minimal":                                        {Config{URL: "http://vm:8428"}, ""},
		"url is required":                                {Config{}, "url is required"},
		"scheme must be http(s)":                         {Config{URL: "vm:8428"}, "scheme must be http or https"},
		"path prefix needs a slash":                      {Config{URL: "http://vm", PathPrefix: "select/0/prometheus"}, "must start with /"},
		"bearer and basic exclusive":                     {Config{URL: "http://vm", BearerTokenFile: "/t", BasicAuth: BasicAuth{Username: "u"}}, "mutually exclusive"},
		"password without a username":                    {Config{URL: "http://vm", BasicAuth: BasicAuth{Password: "p"}}, "without a username"},
		"cert without key":                               {Config{URL: "http://vm", TLS: TLSConfig{CertFile: "c"}}, "given together"},
		"authorization is not a free header":             {Config{URL: "http://vm", Headers: map[string]string{"Authorization": "x"}}, "bearer token file or basic auth"},
		"a broken template is caught at startup":         {Config{URL: "http://vm", Queries: QueryTemplates{CPU: "{{.Window"}}, "query for cpu"},
		"an unknown template field is caught at startup": {Config{URL: "http://vm", FreshnessQueries: QueryTemplates{ErrorRate: "x{ns=~\"{{.Namespace}}\"}"}}, "freshness query for errorRate"},
		"negative timeout":                               {Config{URL: "http://vm", Timeout: -time.Second}, "must not be negative"},
		"a zero latency offset reads the newest data":    {Config{URL: "http://vm", LatencyOffset: ptr(time.Duration(0))}, ""},
		"a negative latency offset":                      {Config{URL: "http://vm", LatencyOffset: ptr(-time.Second)}, "latency offset -1s must not be negative"},
		"a latency offset finer than a millisecond":      {Config{URL: "http://vm", LatencyOffset: ptr(1500 * time.Microsecond)}, "whole milliseconds; use e.g. 1ms"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestConfig_Address(t *testing.T) {
	got := Config{URL: "http://vmselect:8481/", PathPrefix: "/select/0/prometheus/"}.address()
	if got != "http://vmselect:8481/select/0/prometheus" {
		t.Errorf("address %q", got)
	}
}

// echoHeaders serves the request headers it saw, so the round-tripper chain is observable.
func echoHeaders(t *testing.T) (*httptest.Server, *http.Header) {
	var seen http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func TestBearerTokenFileRoundTripper_RereadsOnChange(t *testing.T) {
	srv, seen := echoHeaders(t)
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt := NewBearerTokenFileRoundTripper(path, http.DefaultTransport)
	client := &http.Client{Transport: rt}
	get := func() string {
		t.Helper()
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return seen.Get("Authorization")
	}

	if got := get(); got != "Bearer first" {
		t.Fatalf("first request: %q", got)
	}
	get()
	if rt.reads != 1 {
		t.Errorf("an unchanged file must not be re-read: %d reads", rt.reads)
	}
	// A rotated token of a different size is picked up on the next request.
	if err := os.WriteFile(path, []byte("second-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "Bearer second-token" {
		t.Fatalf("after rotation: %q", got)
	}
	// Same size, new content: the changed mtime triggers the re-read.
	if err := os.WriteFile(path, []byte("third--token"), 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "Bearer third--token" {
		t.Fatalf("after same-size rotation: %q", got)
	}
	if rt.reads != 3 {
		t.Errorf("reads = %d, want 3", rt.reads)
	}
	// A missing token file fails the request with a clear error instead of sending no credentials.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(srv.URL); err == nil || !strings.Contains(err.Error(), "bearer token file") {
		t.Fatalf("missing token file: %v", err)
	}
}

func TestConfig_RoundTripperSetsAuthAndHeaders(t *testing.T) {
	srv, seen := echoHeaders(t)
	cfg := Config{URL: srv.URL, BasicAuth: BasicAuth{Username: "u", Password: "p"}, Headers: map[string]string{"X-Scope-OrgID": "tenant-a"}}
	rt, err := cfg.roundTripper()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: rt}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := seen.Get("X-Scope-OrgID"); got != "tenant-a" {
		t.Errorf("X-Scope-OrgID %q", got)
	}
	if got := seen.Get("Authorization"); got != "Basic dTpw" {
		t.Errorf("Authorization %q", got)
	}
}

func TestTLSConfig_Errors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a cert"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (TLSConfig{CAFile: notPEM}).build(); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("bad CA: %v", err)
	}
	if _, err := (TLSConfig{CAFile: filepath.Join(dir, "missing")}).build(); err == nil {
		t.Error("missing CA file accepted")
	}
	if cfg, err := (TLSConfig{InsecureSkipVerify: true}).build(); err != nil || !cfg.InsecureSkipVerify {
		t.Errorf("insecure: %v %v", cfg, err)
	}
}
