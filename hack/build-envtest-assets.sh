#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that controller-runtime's envtest starts on loopback,
# and the kube-controller-manager the integration tests run beside them (garbage collector,
# EndpointSlice and namespace controllers), from the Go module proxy at the versions pinned by the
# helper modules under hack/envtest/.
# Usage: hack/build-envtest-assets.sh DIR   (DIR/kube-apiserver, DIR/etcd and
# DIR/kube-controller-manager; idempotent)
set -euo pipefail

dest=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# The controller manager must come from the same Kubernetes release as the API server it talks to.
kube_version() { sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' "$here/envtest/$1/go.mod"; }
apiserver_version=$(kube_version kube-apiserver)
kcm_version=$(kube_version kube-controller-manager)
if [[ -z "$apiserver_version" || "$apiserver_version" != "$kcm_version" ]]; then
  echo "hack/envtest/kube-apiserver pins k8s.io/kubernetes ${apiserver_version:-(none)} and hack/envtest/kube-controller-manager ${kcm_version:-(none)}: pin both to the same release" >&2
  exit 1
fi

# Each stamp records what its binaries were built from; a change to a helper module rebuilds them.
# kube-controller-manager has its own stamp, so adding it did not rebuild an existing API server.
stamp=$(cat "$here/envtest/kube-apiserver/go.mod" "$here/envtest/kube-apiserver/go.sum" \
  "$here/envtest/etcd/go.mod" "$here/envtest/etcd/go.sum" "$here/envtest/etcd/main.go" | sha256sum | cut -d' ' -f1)
if [[ ! -x "$dest/kube-apiserver" || ! -x "$dest/etcd" || ! -f "$dest/.stamp" || "$(cat "$dest/.stamp")" != "$stamp" ]]; then
  echo "Building kube-apiserver and etcd for envtest into $dest (about 5 minutes the first time)..."
  (cd "$here/envtest/kube-apiserver" && go build -trimpath -o "$dest/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  (cd "$here/envtest/etcd" && go build -trimpath -o "$dest/etcd.tmp" .)
  mv "$dest/kube-apiserver.tmp" "$dest/kube-apiserver"
  mv "$dest/etcd.tmp" "$dest/etcd"
  echo "$stamp" > "$dest/.stamp"
  "$dest/kube-apiserver" --version
  # Not piped into head: etcd would die of SIGPIPE, and pipefail fail the build.
  etcd_version=$("$dest/etcd" --version)
  echo "${etcd_version%%$'\n'*}"
fi

kcm_stamp=$(cat "$here/envtest/kube-controller-manager/go.mod" "$here/envtest/kube-controller-manager/go.sum" | sha256sum | cut -d' ' -f1)
if [[ ! -x "$dest/kube-controller-manager" || ! -f "$dest/.stamp-kube-controller-manager" || "$(cat "$dest/.stamp-kube-controller-manager")" != "$kcm_stamp" ]]; then
  echo "Building kube-controller-manager $kcm_version into $dest (about 5 CPU-minutes after kube-apiserver, which shares most of its packages)..."
  (cd "$here/envtest/kube-controller-manager" && go build -trimpath -o "$dest/kube-controller-manager.tmp" k8s.io/kubernetes/cmd/kube-controller-manager)
  mv "$dest/kube-controller-manager.tmp" "$dest/kube-controller-manager"
  echo "$kcm_stamp" > "$dest/.stamp-kube-controller-manager"
  "$dest/kube-controller-manager" --version
fi
