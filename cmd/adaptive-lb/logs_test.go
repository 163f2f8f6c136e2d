package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the operator's many logging goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// client-go's leader election logs through klog; with klog routed to the operator's logger its
// lines are JSON like the operator's own, on the command's stderr.
func TestRun_LogsOneJSONFormatIncludingKlog(t *testing.T) {
	env, _ := startAPIServer(t, ownCRDPath, istioCRDPath(t))
	path := kubeconfigFile(t, env, "")
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	exited := make(chan error, 1)
	go func() {
		root := newRootCmd(io.Discard, logs)
		root.SetArgs([]string{"run", "--kubeconfig", path, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
			"--leader-elect", "--leader-election-namespace", "default", "--log-level", "info"})
		exited <- root.ExecuteContext(ctx)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs.String(), "Successfully acquired lease") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-exited; err != nil {
		t.Fatalf("run: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "Successfully acquired lease") {
		t.Fatalf("client-go's leader election line never reached the operator's log:\n%s", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if entry["level"] == nil || entry["msg"] == nil || entry["ts"] == nil {
			t.Errorf("log line lacks level, msg or ts: %q", line)
		}
	}
}
