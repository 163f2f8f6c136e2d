//go:build tools

// Package tools pins the kustomize main package so that `go build` in this module builds it.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
