package testtools

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControllerManagerEnv names the kube-controller-manager binary `make test` builds (beside
// envtest's kube-apiserver and etcd, from the same Kubernetes release).
const ControllerManagerEnv = "ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN"

// The controllers a real cluster runs that change what the operator sees or what becomes of its
// objects: the EndpointSlice controller writes the slices the mirror reads (at most 100
// endpoints each, serving and terminating conditions), the garbage collector deletes dependents
// of deleted owners, and the namespace controller empties deleted namespaces. The EndpointSlice
// mirroring controller is left out: it mirrors hand-made Endpoints of selector-less Services,
// which adaptive-lb does not serve.
var DefaultControllers = []string{"endpointslice-controller", "garbage-collector-controller", "namespace-controller"}

// ControllerManager is a kube-controller-manager process running on loopback beside a test API
// server.
type ControllerManager struct {
	cmd     *exec.Cmd
	dir     string
	logPath string
	exited  chan struct{}
	waitErr error
}

// StartControllerManager starts bin with the given controllers against the API server that
// kubeconfig reaches, as that kubeconfig's user (no per-controller ServiceAccounts, no leader
// election), and returns once its health endpoint answers. The process dies with the test
// process if that exits without calling Stop.
func StartControllerManager(bin, kubeconfig string, controllers []string) (*ControllerManager, error) {
	dir, err := os.MkdirTemp("", "kube-controller-manager-")
	if err != nil {
		return nil, err
	}
	port, err := freeLoopbackPort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logPath := filepath.Join(dir, "kube-controller-manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--profiling=false",
		"--v=2",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	c := &ControllerManager{cmd: cmd, dir: dir, logPath: logPath, exited: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(c.exited)
	}()
	if err := c.waitHealthy(port, time.Minute); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// waitHealthy polls the process's /healthz (served to anyone by default) until it answers ok.
func (c *ControllerManager) waitHealthy(port int, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // its own self-signed certificate, on loopback
	}}
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			return fmt.Errorf("kube-controller-manager exited (%v) before it was healthy:\n%s", c.waitErr, c.LogTail(40))
		default:
		}
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /healthz: %s", resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-controller-manager not healthy after %v (%v):\n%s", timeout, last, c.LogTail(40))
}

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and removes its files.
func (c *ControllerManager) Stop() error {
	defer os.RemoveAll(c.dir)
	select {
	case <-c.exited:
		return nil
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	return nil
}

// LogTail returns the last n lines of the process's log.
func (c *ControllerManager) LogTail(n int) string {
	data, err := os.ReadFile(c.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// RunControllerManager starts a kube-controller-manager with DefaultControllers against env for
// the test's lifetime, as a cluster admin, or skips the test (fails it under CI) when `make test`
// has not built one. Its log tail is printed if the test fails.
func RunControllerManager(t testing.TB, env *envtest.Environment) *ControllerManager {
	t.Helper()
	bin := RequireEnv(t, ControllerManagerEnv, "kube-controller-manager")
	kubeconfig, err := AdminKubeconfig(env, "kube-controller-manager", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := StartControllerManager(bin, kubeconfig, DefaultControllers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-controller-manager log (last 30 lines):\n%s", c.LogTail(30))
		}
		_ = c.Stop()
	})
	return c
}

// AdminKubeconfig writes a kubeconfig for a cluster admin of env named user into dir and returns
// its path.
func AdminKubeconfig(env *envtest.Environment, user, dir string) (string, error) {
	u, err := env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("add user %s to the test API server: %w", user, err)
	}
	raw, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, user+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, nil
}

func freeLoopbackPort() (int, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}
