#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that controller-runtime's envtest starts on loopback,
# and the kube-controller-manager the integration tests run beside them (garbage collector,
# EndpointSlice and namespace controllers), from the Go module proxy at the versions pinned by the
# helper modules under hack/envtest/, into the tool cache (hack/toolcache.sh): each binary in a
# folder of its own version, and envtest's KUBEBUILDER_ASSETS folder (`hack/toolcache.sh dir
# envtest`) linking the kube-apiserver and etcd in force. Usage: TOOLS_DIR=DIR
# hack/build-envtest-assets.sh (TOOLS_DIR defaults to the user cache; idempotent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# The controller manager must come from the same Kubernetes release as the API server it talks to.
apiserver_version=$(toolcache_id kube-apiserver)
kcm_version=$(toolcache_id kube-controller-manager)
if [[ "${apiserver_version%-*}" != "${kcm_version%-*}" ]]; then
  echo "hack/envtest/kube-apiserver pins k8s.io/kubernetes ${apiserver_version%-*} and hack/envtest/kube-controller-manager ${kcm_version%-*}: pin both to the same release" >&2
  exit 1
fi

build_kube_apiserver() {
  (cd "$here/envtest/kube-apiserver" && go build -trimpath -o "$1/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
  "$1/kube-apiserver" --version
}
build_etcd() {
  (cd "$here/envtest/etcd" && go build -trimpath -o "$1/etcd" .)
  # Not piped into head: etcd would die of SIGPIPE, and pipefail fail the build.
  local version
  version=$("$1/etcd" --version)
  echo "${version%%$'\n'*}"
}
build_kube_controller_manager() {
  (cd "$here/envtest/kube-controller-manager" && go build -trimpath -o "$1/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager)
  "$1/kube-controller-manager" --version
}
toolcache_build kube-apiserver "the API server of the envtest suites" build_kube_apiserver kube-apiserver
toolcache_build etcd "the API server's store in the envtest suites" build_etcd etcd
# Built after kube-apiserver, with which it shares most of its packages in the Go build cache.
toolcache_build kube-controller-manager "the garbage collector and EndpointSlice controllers of the integration tests" build_kube_controller_manager kube-controller-manager

# envtest looks for both binaries in one folder, KUBEBUILDER_ASSETS: links to the versions in force.
assets=$(toolcache_dir envtest)
if [[ ! -x "$assets/kube-apiserver" || ! -x "$assets/etcd" ]]; then
  rm -rf "$assets"
  mkdir -p "$assets.tmp.$$"
  ln -s "../../kube-apiserver/$apiserver_version/kube-apiserver" "$assets.tmp.$$/kube-apiserver"
  ln -s "../../etcd/$(toolcache_id etcd)/etcd" "$assets.tmp.$$/etcd"
  mv "$assets.tmp.$$" "$assets"
fi
