#!/usr/bin/env bash
# Builds the kustomize CLI the install tests build config/default with, from the Go module proxy at
# the version pinned in hack/kustomize/go.mod. Usage: hack/build-kustomize.sh DIR   (DIR/kustomize; idempotent)
set -euo pipefail
dest=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
stamp=$(cat "$here/kustomize/go.mod" "$here/kustomize/go.sum" | sha256sum | cut -d' ' -f1)
if [[ -x "$dest/kustomize" && -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" ]]; then
  exit 0
fi
echo "Building kustomize into $dest..."
(cd "$here/kustomize" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$dest/kustomize.tmp" sigs.k8s.io/kustomize/kustomize/v5)
mv "$dest/kustomize.tmp" "$dest/kustomize"
echo "$stamp" > "$dest/.stamp"
