#!/usr/bin/env bash
# Prepares the istio.io/istio module that the istiod differential tests (test/istiod) compile in
# process: istiod's own discovery server (pilot/test/xds) with real ADS clients.
#
# istio.io/istio publishes no semver tags; the pseudo-version below is the newest the Go module
# proxy serves (`go mod download istio.io/istio@latest`, 1.31 line). Its go.mod pins untagged
# go-control-plane commits the proxy does not serve, so test/istiod/go.mod replaces them with
# tagged releases. The tagged contrib release lacks a few packages that
# pkg/config/xds/filter_types.gen.go imports only for their side effect (registering proto types
# for EnvoyFilter validation); this script drops exactly those blank imports from its own copy
# of the module and links the copy to test/istiod/.cache/istio, which test/istiod/go.mod replaces
# istio.io/istio with. Nothing else in the copy is changed, but for the BUILD-INFO file the tool
# cache adds.
#
# The copy goes to the tool cache (hack/toolcache.sh), in a folder named after istio_version and a
# hash of this script, so a change to either prepares a new copy.
# Usage: TOOLS_DIR=DIR hack/build-istiod-module.sh   (idempotent)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
module_dir="$here/../test/istiod"
istio_version=v0.0.0-20260827124520-eed52ebb66ad
contrib_version=v1.36.0

prepare() {
  local copy=$1
  export GOFLAGS=-mod=mod
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  # Downloading outside any module keeps this independent of test/istiod's go.mod.
  local src contrib
  src=$(cd "$tmp" && go mod download -json "istio.io/istio@$istio_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  contrib=$(cd "$tmp" && go mod download -json "github.com/envoyproxy/go-control-plane/contrib@$contrib_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -d "$src" && -d "$contrib" ]] || { echo "download of istio.io/istio or go-control-plane/contrib failed" >&2; return 1; }

  cp -r "$src/." "$copy/"
  chmod -R u+w "$copy"
  local gen="$copy/pkg/config/xds/filter_types.gen.go" dropped=0 pkg
  while read -r pkg; do
    if [[ ! -d "$contrib/${pkg#github.com/envoyproxy/go-control-plane/contrib/}" ]]; then
      grep -vF "_ \"$pkg\"" "$gen" > "$gen.new"
      mv "$gen.new" "$gen"
      echo "  dropped blank import $pkg (absent from contrib $contrib_version)"
      dropped=$((dropped + 1))
    fi
  done < <(sed -n 's/^\t_ "\(github.com\/envoyproxy\/go-control-plane\/contrib\/[^"]*\)"$/\1/p' "$gen")
  echo "  $dropped blank imports dropped"
}
toolcache_build istio "the istiod differential tests, patched" prepare go.mod

mkdir -p "$module_dir/.cache"
ln -sfn "$(toolcache_dir istio)" "$module_dir/.cache/istio"
