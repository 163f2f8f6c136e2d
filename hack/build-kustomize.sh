#!/usr/bin/env bash
# Builds the kustomize CLI the install tests build config/default with, from the Go module proxy
# at the version pinned in hack/kustomize/go.mod, into the tool cache (hack/toolcache.sh).
# Usage: TOOLS_DIR=DIR hack/build-kustomize.sh   (`hack/toolcache.sh dir kustomize`/kustomize; idempotent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
build() {
  (cd "$here/kustomize" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$1/kustomize" sigs.k8s.io/kustomize/kustomize/v5)
}
toolcache_build kustomize "the install tests" build kustomize
