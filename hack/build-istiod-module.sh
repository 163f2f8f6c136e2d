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
# istio.io/istio with. Nothing else in the copy is changed.
#
# Usage: hack/build-istiod-module.sh DIR   (the patched copy goes to DIR; idempotent)
set -euo pipefail

dest=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
module_dir="$here/../test/istiod"
istio_version=v0.0.0-20260827124520-eed52ebb66ad
contrib_version=v1.36.0
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
copy="$dest/istio-$istio_version"

stamp=$(printf '%s\n%s\n' "$istio_version" "$contrib_version" | cat - "$0" | sha256sum | cut -d' ' -f1)
if [[ ! -f "$copy/.stamp" || "$(cat "$copy/.stamp")" != "$stamp" ]]; then
  echo "Preparing istio.io/istio@$istio_version for the istiod tests in $copy..."
  export GOFLAGS=-mod=mod
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Downloading outside any module keeps this independent of test/istiod's go.mod.
  src=$(cd "$tmp" && go mod download -json "istio.io/istio@$istio_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  contrib=$(cd "$tmp" && go mod download -json "github.com/envoyproxy/go-control-plane/contrib@$contrib_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -d "$src" && -d "$contrib" ]] || { echo "download of istio.io/istio or go-control-plane/contrib failed" >&2; exit 1; }

  rm -rf "$copy.tmp"
  cp -r "$src" "$copy.tmp"
  chmod -R u+w "$copy.tmp"
  gen="$copy.tmp/pkg/config/xds/filter_types.gen.go"
  dropped=0
  while read -r pkg; do
    if [[ ! -d "$contrib/${pkg#github.com/envoyproxy/go-control-plane/contrib/}" ]]; then
      grep -vF "_ \"$pkg\"" "$gen" > "$gen.new"
      mv "$gen.new" "$gen"
      echo "  dropped blank import $pkg (absent from contrib $contrib_version)"
      dropped=$((dropped + 1))
    fi
  done < <(sed -n 's/^\t_ "\(github.com\/envoyproxy\/go-control-plane\/contrib\/[^"]*\)"$/\1/p' "$gen")
  echo "  $dropped blank imports dropped"
  rm -rf "$copy"
  mv "$copy.tmp" "$copy"
  echo "$stamp" > "$copy/.stamp"
fi

mkdir -p "$module_dir/.cache"
ln -sfn "$copy" "$module_dir/.cache/istio"
