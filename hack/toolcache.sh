#!/usr/bin/env bash
# The cache of the real components the tests run against (kube-apiserver, etcd,
# kube-controller-manager, VictoriaMetrics, helm, kustomize, the patched istio.io/istio copy,
# controller-gen). They are built from the Go module proxy once per user and version, outside any
# checkout, as setup-envtest keeps its binaries: a second clone reuses them.
#
# Each component lives in TOOLS_DIR/NAME/ID, where ID is the pinned version followed by a hash of
# what the component is built from (its helper module under hack/ and its build script). A
# changed pin gives a new ID, so only that component is rebuilt and an old version's folder is
# never taken for the new one. A component is built into a temporary folder beside its own and
# renamed when complete: a folder that exists is a finished build; an interrupted build leaves
# only a temporary folder (.building-ID.pidPID.*), which the next build removes once process PID
# is gone.
#
#   hack/toolcache.sh id NAME     prints NAME's ID
#   hack/toolcache.sh dir NAME    prints TOOLS_DIR/NAME/ID; for NAME envtest, the KUBEBUILDER_ASSETS
#                                 folder that links the kube-apiserver and the etcd in force
#   source hack/toolcache.sh      for toolcache_build, used by the hack/build-*.sh scripts
#
# TOOLS_DIR defaults to the user cache directory: $XDG_CACHE_HOME/adaptive-lb/tools, else
# ~/Library/Caches/adaptive-lb/tools on macOS and ~/.cache/adaptive-lb/tools elsewhere (the
# Makefile computes the same default).

toolcache_hack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

toolcache_default_dir() {
  if [[ -n "${XDG_CACHE_HOME:-}" ]]; then
    echo "$XDG_CACHE_HOME/adaptive-lb/tools"
  elif [[ "$(uname -s)" == Darwin ]]; then
    echo "$HOME/Library/Caches/adaptive-lb/tools"
  else
    echo "$HOME/.cache/adaptive-lb/tools"
  fi
}

# toolcache_sources NAME prints, one a line: the helper module folder (or -), the module whose
# version names the component, and the build script.
toolcache_sources() {
  case $1 in
    kube-apiserver) echo "envtest/kube-apiserver k8s.io/kubernetes build-envtest-assets.sh" ;;
    etcd) echo "envtest/etcd go.etcd.io/etcd/server/v3 build-envtest-assets.sh" ;;
    kube-controller-manager) echo "envtest/kube-controller-manager k8s.io/kubernetes build-envtest-assets.sh" ;;
    victoria-metrics) echo "victoriametrics github.com/VictoriaMetrics/VictoriaMetrics build-victoriametrics.sh" ;;
    helm) echo "helm helm.sh/helm/v3 build-helm.sh" ;;
    kustomize) echo "kustomize sigs.k8s.io/kustomize/kustomize/v5 build-kustomize.sh" ;;
    controller-gen) echo "tools sigs.k8s.io/controller-tools build-controller-gen.sh" ;;
    istio) echo "- istio.io/istio build-istiod-module.sh" ;;
    *) echo "hack/toolcache.sh: no component $1; known: kube-apiserver etcd kube-controller-manager victoria-metrics helm kustomize controller-gen istio" >&2; return 2 ;;
  esac
}

toolcache_sha256() {
  if command -v sha256sum >/dev/null; then sha256sum | cut -c1-12; else shasum -a 256 | cut -c1-12; fi
}

# toolcache_id NAME prints VERSION-HASH: the version the helper module (or, for istio, the build
# script) pins, and 12 hex digits of a SHA-256 over the helper module's files and the build script.
toolcache_id() {
  local sources helper module script version
  sources=$(toolcache_sources "$1") || return
  read -r helper module script <<<"$sources"
  if [[ "$helper" == - ]]; then
    version=$(sed -n 's/^istio_version=//p' "$toolcache_hack/$script")
  else
    # The pin is either `require MODULE vX` or a line `MODULE vX` of a require block.
    version=$(sed -n -E "s#^(require)?[[:space:]]*$module (v[^ ]+)\$#\\2#p" "$toolcache_hack/$helper/go.mod" | head -n 1)
  fi
  if [[ -z "$version" ]]; then
    echo "hack/toolcache.sh: cannot read the version of $module that $1 is built from (hack/$helper/go.mod or hack/$script)" >&2
    return 1
  fi
  local hash
  hash=$(
    if [[ "$helper" != - ]]; then
      find "$toolcache_hack/$helper" -maxdepth 1 -type f | LC_ALL=C sort | while read -r f; do
        printf '%s\n' "${f##*/}"
        cat "$f"
      done
    fi
    cat "$toolcache_hack/$script"
  ) || return
  echo "$version-$(toolcache_sha256 <<<"$hash")"
}

toolcache_dir() {
  local root=${TOOLS_DIR:-$(toolcache_default_dir)} id
  if [[ "$1" == envtest ]]; then
    id="kube-apiserver-$(toolcache_id kube-apiserver)_etcd-$(toolcache_id etcd)" || return
  else
    id=$(toolcache_id "$1") || return
  fi
  echo "$root/$1/$id"
}

# toolcache_estimate NAME says roughly how long NAME takes to build on 2 cores in a first `make
# test` (empty Go caches, the components built in the Makefile's order), as measured in
# docs/benchmarks.md ("The README's two commands"). It includes downloading its modules.
toolcache_estimate() {
  case $1 in
    kube-apiserver) echo "about 6 min on 2 cores with empty Go caches" ;;
    etcd) echo "about 1 min on 2 cores after kube-apiserver" ;;
    kube-controller-manager) echo "about 2 min on 2 cores after kube-apiserver, whose packages it shares" ;;
    victoria-metrics) echo "under a minute on 2 cores" ;;
    helm) echo "about 2 min on 2 cores after the Kubernetes components" ;;
    kustomize) echo "under a minute on 2 cores after helm" ;;
    controller-gen) echo "under a minute on 2 cores after the Kubernetes components" ;;
    istio) echo "a few seconds, most of it the download" ;;
  esac
}

# toolcache_build NAME WHAT BUILD_FUNCTION FILE builds NAME into its folder unless the folder is
# there with FILE in it: BUILD_FUNCTION is called with a temporary folder to fill, which is renamed
# into place when the function succeeds and has left FILE. WHAT says what the component is for.
toolcache_build() {
  local name=$1 what=$2 build=$3 file=$4 dest id
  dest=$(toolcache_dir "$name") || return
  if [[ -e "$dest/$file" ]]; then
    return 0
  fi
  # A folder without its file was emptied by hand: build it again.
  rm -rf "$dest"
  id=${dest##*/}
  local parent=${dest%/*}
  mkdir -p "$parent"
  # Leftovers of an interrupted build of this version: a temporary folder whose builder is gone.
  # One whose builder runs (another checkout building the same version now) is left alone.
  local leftover pid
  for leftover in "$parent/.building-$id".pid*; do
    [[ -e "$leftover" ]] || continue
    pid=${leftover##*.pid}
    pid=${pid%%.*}
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -rf "$leftover"
    fi
  done
  local tmp
  tmp=$(mktemp -d "$parent/.building-$id.pid$$.XXXXXX")
  chmod 755 "$tmp"
  echo "Building $name ${id%-*} ($what) into $dest: $(toolcache_estimate "$name"), once per user and version..."
  local start=$SECONDS
  # The build runs in a subshell with errexit on, so that its first failing command fails it (in
  # the condition of an if, bash would ignore errexit inside the function).
  local errexit=false status=0
  [[ $- == *e* ]] && errexit=true
  set +e
  (
    set -e
    "$build" "$tmp"
  )
  status=$?
  if $errexit; then set -e; fi
  if [[ $status -ne 0 || ! -e "$tmp/$file" ]]; then
    rm -rf "$tmp"
    echo "Building $name ${id%-*} failed (see above); nothing was cached. Rerun the same make target to retry." >&2
    return 1
  fi
  echo "built from $(cd "$toolcache_hack/.." && pwd) at $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(go env GOVERSION) for $(go env GOOS)/$(go env GOARCH)" >"$tmp/BUILD-INFO"
  # Another checkout may have finished the same build meanwhile; its folder is as good as ours.
  # (Should it finish between this test and the rename, ours lands inside its folder, unused.)
  if [[ -d "$dest" ]]; then
    rm -rf "$tmp"
  else
    mv "$tmp" "$dest"
  fi
  local took=$((SECONDS - start))
  echo "Built $name ${id%-*} in $((took / 60)) min $((took % 60)) s."
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case ${1:-} in
    id) toolcache_id "${2:?usage: $0 id NAME}" ;;
    dir) toolcache_dir "${2:?usage: $0 dir NAME}" ;;
    *) echo "usage: $0 id|dir NAME" >&2; exit 2 ;;
  esac
fi
