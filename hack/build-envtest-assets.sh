#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that controller-runtime's envtest starts on loopback,
# from the Go module proxy at the versions pinned by the helper modules under hack/envtest/.
# Usage: hack/build-envtest-assets.sh DIR   (DIR/kube-apiserver and DIR/etcd; idempotent)
set -euo pipefail

dest=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# The stamp records what the binaries were built from; a change to a helper module rebuilds.
stamp=$(cat "$here/envtest/kube-apiserver/go.mod" "$here/envtest/kube-apiserver/go.sum" \
  "$here/envtest/etcd/go.mod" "$here/envtest/etcd/go.sum" "$here/envtest/etcd/main.go" | sha256sum | cut -d' ' -f1)
if [[ -x "$dest/kube-apiserver" && -x "$dest/etcd" && -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" ]]; then
  exit 0
fi

echo "Building kube-apiserver and etcd for envtest into $dest (about 5 minutes the first time)..."
export CGO_ENABLED=0 GOFLAGS=-mod=mod
(cd "$here/envtest/kube-apiserver" && go build -trimpath -o "$dest/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
(cd "$here/envtest/etcd" && go build -trimpath -o "$dest/etcd.tmp" .)
mv "$dest/kube-apiserver.tmp" "$dest/kube-apiserver"
mv "$dest/etcd.tmp" "$dest/etcd"
echo "$stamp" > "$dest/.stamp"
"$dest/kube-apiserver" --version
"$dest/etcd" --version | head -1
