package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// vmServer is a real VictoriaMetrics single-node process on a loopback port.
type vmServer struct {
	URL string
	cmd *exec.Cmd
	out *strings.Builder
}

// startVM starts the binary named by ADAPTIVELB_VMSINGLE_BIN (set by `make test`).
func startVM(t *testing.T) *vmServer {
	t.Helper()
	bin := os.Getenv("ADAPTIVELB_VMSINGLE_BIN")
	if bin == "" {
		msg := "ADAPTIVELB_VMSINGLE_BIN is not set; run `make test` (it builds VictoriaMetrics and sets it)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	port := freePort(t)
	out := &strings.Builder{}
	cmd := exec.Command(bin,
		"-httpListenAddr=127.0.0.1:"+port,
		"-storageDataPath="+t.TempDir(),
		// Make freshly imported samples visible to the next query.
		"-search.latencyOffset=0",
		"-search.disableCache",
		"-loggerLevel=ERROR",
	)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	vm := &vmServer{URL: "http://127.0.0.1:" + port, cmd: cmd, out: out}
	t.Cleanup(vm.stop)

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(vm.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return vm
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("VictoriaMetrics did not become healthy within 30s: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// stop terminates the server and waits for it; safe to call twice.
func (v *vmServer) stop() {
	if v.cmd.ProcessState != nil {
		return
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = v.cmd.Process.Kill()
		<-done
	}
}

// importText loads samples in Prometheus text format (with millisecond timestamps) and flushes
// them so the next query sees them.
func (v *vmServer) importText(t *testing.T, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, step := range []struct{ method, path string }{{http.MethodPost, "/api/v1/import/prometheus"}, {http.MethodGet, "/internal/force_flush"}} {
		var body *strings.Reader
		if step.method == http.MethodPost {
			body = strings.NewReader(text)
		} else {
			body = strings.NewReader("")
		}
		req, err := http.NewRequestWithContext(ctx, step.method, v.URL+step.path, body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", step.method, step.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: HTTP %d", step.method, step.path, resp.StatusCode)
		}
	}
}

// series builds text-format lines for a counter growing linearly at perSecond, sampled every
// step from `from` to `to` (inclusive). Linear counters make rate() exact in every TSDB.
func series(labels string, perSecond float64, from, to time.Time, step time.Duration) string {
	var b strings.Builder
	for ts := from; !ts.After(to); ts = ts.Add(step) {
		value := perSecond * ts.Sub(from).Seconds()
		fmt.Fprintf(&b, "%s %g %d\n", labels, value, ts.UnixMilli())
	}
	return b.String()
}
