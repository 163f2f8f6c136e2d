#!/usr/bin/env bash
# Builds the VictoriaMetrics single-node server that the metrics-source tests start on loopback,
# at the version pinned by the helper module hack/victoriametrics (go.mod + go.sum), into the tool
# cache (hack/toolcache.sh).
# Usage: TOOLS_DIR=DIR hack/build-victoriametrics.sh
#   (`hack/toolcache.sh dir victoria-metrics`/victoria-metrics; idempotent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/toolcache.sh"
build() {
  # CGO_ENABLED=0 selects VictoriaMetrics' pure-Go zstd, so no C toolchain is needed.
  (cd "$here/victoriametrics" && CGO_ENABLED=0 go build -trimpath -o "$1/victoria-metrics" github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics)
}
toolcache_build victoria-metrics "the metrics-source tests' TSDB" build victoria-metrics
