#!/usr/bin/env bash
# Builds the helm CLI the chart tests render charts/adaptive-lb with, from the Go module proxy at
# the version pinned in hack/helm/go.mod. Usage: hack/build-helm.sh DIR   (DIR/helm; idempotent)
set -euo pipefail
dest=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
stamp=$(cat "$here/helm/go.mod" "$here/helm/go.sum" | sha256sum | cut -d' ' -f1)
if [[ -x "$dest/helm" && -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" ]]; then
  exit 0
fi
echo "Building helm into $dest..."
(cd "$here/helm" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$dest/helm.tmp" helm.sh/helm/v3/cmd/helm)
mv "$dest/helm.tmp" "$dest/helm"
echo "$stamp" > "$dest/.stamp"
