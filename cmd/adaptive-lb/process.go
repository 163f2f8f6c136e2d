package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// What the long-running commands (run, failsafe) set up the same way: the Kubernetes client
// config, the log level and a JSON logger, and the namespace of the leader Lease.

// logLevels maps --log-level to zap's levels.
var logLevels = map[string]zapcore.Level{"debug": zapcore.DebugLevel, "info": zapcore.InfoLevel, "error": zapcore.ErrorLevel}

func checkLogLevel(level string) error {
	if _, ok := logLevels[level]; !ok {
		return newUsageError("--log-level %q must be debug, info or error", level)
	}
	return nil
}

// newJSONLogger logs JSON lines to w at level, without stack traces below panics. Locked: the
// manager, the informers and klog write from many goroutines.
func newJSONLogger(w io.Writer, level zapcore.Level) logr.Logger {
	if w == nil {
		w = io.Discard
	}
	return zap.New(zap.WriteTo(zapcore.Lock(zapcore.AddSync(w))), zap.UseDevMode(false), zap.Level(level), zap.StacktraceLevel(zapcore.PanicLevel))
}

// restConfigFrom loads the client config from kubeconfig, or when empty from the in-cluster
// config or $KUBECONFIG.
func restConfigFrom(kubeconfig, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = ctrl.GetConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("load Kubernetes client config: %w", err)
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}

// leaseNamespace is flagValue, or when empty the namespace of the pod the process runs in.
func leaseNamespace(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	raw, err := os.ReadFile(inClusterNamespaceFile)
	if err != nil {
		return "", fmt.Errorf("--leader-election-namespace is not set and the pod's namespace cannot be read from %s (not in a cluster?): %w", inClusterNamespaceFile, err)
	}
	return strings.TrimSpace(string(raw)), nil
}

const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
