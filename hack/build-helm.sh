#!/usr/bin/env bash
# Builds the helm CLI the chart tests render charts/adaptive-lb with, from the Go module proxy at
# the version pinned in hack/helm/go.mod, into the tool cache (hack/toolcache.sh).
# Usage: TOOLS_DIR=DIR hack/build-helm.sh   (`hack/toolcache.sh dir helm`/helm; idempotent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
build() {
  (cd "$here/helm" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$1/helm" helm.sh/helm/v3/cmd/helm)
}
toolcache_build helm "the chart tests" build helm
