//go:build tools

// Package tools pins the helm main package so that `go build` in this module builds it.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
