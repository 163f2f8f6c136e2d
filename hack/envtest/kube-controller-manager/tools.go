//go:build tools

// Package tools pins the kube-controller-manager main package so that `go build` in this module
// builds it, from the same k8s.io/kubernetes release as kube-apiserver (hack/envtest/kube-apiserver).
package tools

import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
