//go:build tools

// Package tools pins the generators `make manifests generate` runs.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
