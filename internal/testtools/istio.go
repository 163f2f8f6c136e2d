package testtools

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// IstioCRDPath is Istio's CRD bundle inside the istio.io/api module, pinned by go.mod.
func IstioCRDPath() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
	if err != nil {
		return "", fmt.Errorf("locate the istio.io/api module (go list -m istio.io/api): %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml"), nil
}
