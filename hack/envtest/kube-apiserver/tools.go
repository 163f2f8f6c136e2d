//go:build tools

// Package tools pins the kube-apiserver main package so that `go build` in this module builds it.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
