package metrics

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool
}

var serialCounter int64

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serialCounter++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serialCounter), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: pool}
}

// issue returns a leaf certificate for 127.0.0.1 (server) or a client, as PEM and as a tls.Certificate.
func (ca *testCA) issue(t *testing.T, server bool) (certPEM, keyPEM []byte, pair tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serialCounter++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serialCounter), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM, pair
}

// writeAt writes a file and stamps it with the given modification time, so a rewrite is seen
// as a change whatever the file system's timestamp resolution.
func writeAt(t *testing.T, path string, data []byte, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// Issue 13 item 9: the TSDB's CA and the client certificate are rotated (new CA on both sides,
// as cert-manager does); the next request must use the new files, as it does for the bearer token.
func TestTLSFiles_RotatedCAAndClientCertificateAreUsed(t *testing.T) {
	serverCA, clientCA := newTestCA(t, "server-ca-1"), newTestCA(t, "client-ca-1")
	var mu sync.Mutex
	current := func() (*testCA, *testCA) { mu.Lock(); defer mu.Unlock(); return serverCA, clientCA }
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		sca, cca := current()
		_, _, leaf := sca.issue(t, true)
		return &tls.Config{Certificates: []tls.Certificate{leaf}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: cca.pool}, nil
	}}
	srv.StartTLS()
	defer srv.Close()

	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	t0 := time.Now().Add(-time.Minute)
	certPEM, keyPEM, _ := clientCA.issue(t, false)
	writeAt(t, caFile, serverCA.pem, t0)
	writeAt(t, certFile, certPEM, t0)
	writeAt(t, keyFile, keyPEM, t0)

	rt, err := Config{URL: srv.URL, TLS: TLSConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}}.roundTripper()
	if err != nil {
		t.Fatal(err)
	}
	get := func() error {
		resp, err := (&http.Client{Transport: rt}).Get(srv.URL)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := get(); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}

	mu.Lock()
	serverCA, clientCA = newTestCA(t, "server-ca-2"), newTestCA(t, "client-ca-2")
	mu.Unlock()
	srv.CloseClientConnections()
	t1 := t0.Add(30 * time.Second)
	_, cca := current()
	certPEM, keyPEM, _ = cca.issue(t, false)
	sca, _ := current()
	writeAt(t, caFile, sca.pem, t1)
	writeAt(t, certFile, certPEM, t1)
	writeAt(t, keyFile, keyPEM, t1)
	if err := get(); err != nil {
		t.Fatalf("after the CA and the client certificate were rotated: %v", err)
	}

	// A rotation caught half-way (a new certificate, the old key) keeps the last good files.
	newCert, _, _ := cca.issue(t, false)
	writeAt(t, certFile, newCert, t1.Add(30*time.Second))
	srv.CloseClientConnections()
	if err := get(); err != nil {
		t.Fatalf("a half-written rotation broke the connection: %v", err)
	}
}
