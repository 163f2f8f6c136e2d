#!/usr/bin/env bash
# Builds the VictoriaMetrics single-node server that the metrics-source tests start on loopback.
#
#   hack/build-victoriametrics.sh DIR    -> DIR/victoria-metrics
#
# The version is pinned by the helper module hack/victoriametrics (go.mod + go.sum). The build is
# skipped when DIR/victoria-metrics exists and DIR/.version matches the pinned version, so `make test`
# only pays for it once per cache directory (TOOLS_DIR).
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $(basename "$0") OUTPUT_DIR" >&2
	exit 2
fi

out_dir=$1
repo_root=$(cd "$(dirname "$0")/.." && pwd)
helper_dir="$repo_root/hack/victoriametrics"
module=github.com/VictoriaMetrics/VictoriaMetrics

version=$(cd "$helper_dir" && go list -m -f '{{.Version}}' "$module")
stamp="$out_dir/.version"
binary="$out_dir/victoria-metrics"

if [[ -x "$binary" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
	echo "victoria-metrics $version already built in $out_dir"
	exit 0
fi

mkdir -p "$out_dir"
echo "building victoria-metrics $version into $out_dir"
# CGO_ENABLED=0 selects VictoriaMetrics' pure-Go zstd, so no C toolchain is needed.
# Build to a temporary name and rename, so an interrupted build never leaves a half-written binary.
(cd "$helper_dir" && CGO_ENABLED=0 go build -trimpath -o "$binary.tmp" "$module/app/victoria-metrics")
mv "$binary.tmp" "$binary"
echo "$version" >"$stamp"
echo "built $binary ($version)"
