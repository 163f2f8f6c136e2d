package metrics

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// BearerTokenFileRoundTripper sets "Authorization: Bearer <token>" from a file. It stats the file
// on every request and re-reads it only when its size or modification time changed, so a rotated
// token is used from the next request on without reading the file each time.
type BearerTokenFileRoundTripper struct {
	path string
	next http.RoundTripper

	mu      sync.Mutex
	size    int64
	modTime time.Time
	token   string
	loaded  bool
	reads   int
}

// NewBearerTokenFileRoundTripper wraps next.
func NewBearerTokenFileRoundTripper(path string, next http.RoundTripper) *BearerTokenFileRoundTripper {
	return &BearerTokenFileRoundTripper{path: path, next: next}
}

func (b *BearerTokenFileRoundTripper) currentToken() (string, error) {
	info, err := os.Stat(b.path)
	if err != nil {
		return "", fmt.Errorf("bearer token file: %w (mount the token or fix --bearer-token-file)", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.loaded && info.Size() == b.size && info.ModTime().Equal(b.modTime) {
		return b.token, nil
	}
	data, err := os.ReadFile(b.path)
	if err != nil {
		return "", fmt.Errorf("bearer token file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("bearer token file %s is empty", b.path)
	}
	b.token, b.size, b.modTime, b.loaded = token, info.Size(), info.ModTime(), true
	b.reads++
	return token, nil
}

// RoundTrip implements http.RoundTripper.
func (b *BearerTokenFileRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	token, err := b.currentToken()
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+token)
	return b.next.RoundTrip(req)
}
