#!/usr/bin/env bash
# Builds controller-gen, which generates the CRD, the RBAC rules and the DeepCopy code, at the
# version pinned in hack/tools/go.mod, into the tool cache (hack/toolcache.sh).
# Usage: TOOLS_DIR=DIR hack/build-controller-gen.sh
#   (`hack/toolcache.sh dir controller-gen`/controller-gen; idempotent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
build() {
  (cd "$here/tools" && GOFLAGS=-mod=mod go build -o "$1/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen)
}
toolcache_build controller-gen "make verify-generated and make manifests" build controller-gen
