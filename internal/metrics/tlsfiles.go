package metrics

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
)

// tlsFileTransport sends requests through an http.Transport built from the TLS files, and
// builds a new one when the CA bundle, the client certificate or its key changes (size or
// modification time, checked on every request, as BearerTokenFileRoundTripper does for the
// token). A rotated certificate is thus used from the next connection on; the old transport's
// idle connections are closed so that none keeps the old identity. A rotation caught half-way
// (a new certificate with the old key) fails to load: the previous transport stays in use and
// the next request tries again.
type tlsFileTransport struct {
	tls   TLSConfig
	build func(*tls.Config) *http.Transport

	mu      sync.Mutex
	stamp   string
	current *http.Transport
	loads   int
}

func newTLSFileTransport(t TLSConfig, build func(*tls.Config) *http.Transport) (*tlsFileTransport, error) {
	rt := &tlsFileTransport{tls: t, build: build}
	if _, err := rt.transport(); err != nil {
		return nil, err
	}
	return rt, nil
}

// RoundTrip implements http.RoundTripper.
func (t *tlsFileTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr, err := t.transport()
	if err != nil {
		return nil, err
	}
	return tr.RoundTrip(req)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the current transport.
func (t *tlsFileTransport) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.current != nil {
		t.current.CloseIdleConnections()
	}
}

func (t *tlsFileTransport) transport() (*http.Transport, error) {
	stamp, statErr := t.tls.filesStamp()
	t.mu.Lock()
	defer t.mu.Unlock()
	if statErr != nil {
		if t.current != nil {
			return t.current, nil // a file briefly missing during a rotation
		}
		return nil, statErr
	}
	if t.current != nil && stamp == t.stamp {
		return t.current, nil
	}
	cfg, err := t.tls.build()
	if err != nil {
		if t.current != nil {
			return t.current, nil
		}
		return nil, err
	}
	old := t.current
	t.current, t.stamp = t.build(cfg), stamp
	t.loads++
	if old != nil {
		old.CloseIdleConnections()
	}
	return t.current, nil
}

// hasFiles reports whether any TLS material comes from files.
func (t TLSConfig) hasFiles() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""
}

// filesStamp identifies the current version of the TLS files by their size and modification
// time. Kubernetes updates a mounted Secret by swapping a symlink; os.Stat follows it.
func (t TLSConfig) filesStamp() (string, error) {
	var b strings.Builder
	for _, f := range []struct{ what, path string }{{"CA", t.CAFile}, {"client certificate", t.CertFile}, {"client key", t.KeyFile}} {
		if f.path == "" {
			continue
		}
		info, err := os.Stat(f.path)
		if err != nil {
			return "", fmt.Errorf("TLS %s file: %w (mount it or fix --tls-* flags)", f.what, err)
		}
		fmt.Fprintf(&b, "%s:%d:%d;", f.path, info.Size(), info.ModTime().UnixNano())
	}
	return b.String(), nil
}
