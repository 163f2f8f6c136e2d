// Package vmtest starts a real VictoriaMetrics single-node server for tests and loads samples into
// it. The binary comes from ADAPTIVELB_VMSINGLE_BIN, which `make test` builds and sets.
package vmtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BinaryEnv names the environment variable holding the victoria-metrics binary path.
const BinaryEnv = "ADAPTIVELB_VMSINGLE_BIN"

// Server is a VictoriaMetrics process listening on a random 127.0.0.1 port.
type Server struct {
	// URL is the base URL of the Prometheus-compatible API (no path prefix).
	URL string

	cmd      *exec.Cmd
	out      *syncBuffer
	stopOnce sync.Once
}

// Start launches VictoriaMetrics with a temporary data directory and waits until it is healthy.
// Without ADAPTIVELB_VMSINGLE_BIN the test is skipped, or failed when CI is set. The server is
// stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, false)
}

// StartFresh is Start with VictoriaMetrics answering with the newest samples, as Prometheus does
// (see Launch): for samples imported at the wall clock's time, as a scrape would.
func StartFresh(t testing.TB) *Server {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, fresh bool) *Server {
	t.Helper()
	bin := os.Getenv(BinaryEnv)
	if bin == "" {
		msg := BinaryEnv + " is not set; run `make test` (it builds VictoriaMetrics and sets it)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s, err := Launch(bin, t.TempDir(), fresh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Launch starts VictoriaMetrics from bin with its data in dir and waits until it is healthy,
// for a test suite's TestMain, which has no testing.TB; the caller stops it. With fresh it
// answers with the newest samples, as Prometheus does, instead of 30 s in the past
// (-search.latencyOffset=0): for series imported at the wall clock's time as a scrape would.
func Launch(bin, dir string, fresh bool) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	out := &syncBuffer{}
	args := []string{
		"-httpListenAddr=127.0.0.1:" + port,
		"-storageDataPath=" + dir,
		// Without fresh, -search.latencyOffset keeps its default (30s), as on a stock install:
		// a query for a time within 30 s of the wall clock is answered as of 30 s ago. Tests
		// that need fresh-looking samples evaluate at a time well in the past (their own
		// clock); the staleness tests rely on the default.
		// The cache is off because tests import samples into the past, which a cached
		// result for that range would hide.
		"-search.disableCache",
		"-loggerLevel=ERROR",
	}
	if fresh {
		args = append(args, "-search.latencyOffset=0s")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &Server{URL: "http://127.0.0.1:" + port, cmd: cmd, out: out}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("VictoriaMetrics did not become healthy within 30s: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port), nil
}

// Stop terminates the server (SIGTERM, then SIGKILL after 10 s) and waits for it. Tests call it to
// simulate an outage; it is idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
		}
	})
}

// ImportText loads samples in Prometheus text format (timestamps in milliseconds) through
// /api/v1/import/prometheus, then flushes so that the next query sees them.
func (s *Server) ImportText(t testing.TB, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Import(ctx, text); err != nil {
		t.Fatal(err)
	}
}

// ImportTextUnflushed loads samples the way a scraper's writes arrive: without the forced flush,
// so they become visible only when VictoriaMetrics makes them searchable on its own (its pending
// rows are flushed every 2 s). For measuring that delay; tests use ImportText.
func (s *Server) ImportTextUnflushed(t testing.TB, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.do(ctx, http.MethodPost, "/api/v1/import/prometheus", text); err != nil {
		t.Fatal(err)
	}
}

// Import is ImportText returning its error, for callers without a testing.TB.
func (s *Server) Import(ctx context.Context, text string) error {
	if err := s.do(ctx, http.MethodPost, "/api/v1/import/prometheus", text); err != nil {
		return err
	}
	return s.do(ctx, http.MethodGet, "/internal/force_flush", "")
}

func (s *Server) do(ctx context.Context, method, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d\n%s", method, path, resp.StatusCode, s.out.String())
	}
	return nil
}

// Counter returns text-format lines for a counter growing linearly at perSecond, sampled every
// step from `from` to `to` inclusive, starting at 0. Linear counters make rate() exact in
// Prometheus and VictoriaMetrics alike, so expected values can be computed by hand.
func Counter(labels string, perSecond float64, from, to time.Time, step time.Duration) string {
	var b strings.Builder
	for ts := from; !ts.After(to); ts = ts.Add(step) {
		fmt.Fprintf(&b, "%s %g %d\n", labels, perSecond*ts.Sub(from).Seconds(), ts.UnixMilli())
	}
	return b.String()
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
