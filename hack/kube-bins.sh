#!/usr/bin/env bash
# Builds and caches the local control plane's binaries from Go modules.
#
# Why: these machines have no container engine and cannot download release binaries, but they reach
# the Go module proxy. etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok
# are compiled once per (versions, Go version, recipe revision) and cached under the home directory;
# a cached start never runs `go` against the network.
#
#   hack/kube-bins.sh dir     print the cache directory for the pinned versions (built or not)
#   hack/kube-bins.sh ensure  build into the cache unless it is already there; print the directory
#
# Without Go on PATH, a cached build of the pinned versions (whatever Go built it) is used as is.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
CACHE_ROOT=${TJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingjob-operator}/kube-bins
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

go_version() { (cd / && go env GOVERSION); }

cache_key() {
  printf 'kube=%s etcd=%s kwok=%s go=%s recipe=%s' \
    "$KUBE_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$(go_version)" "$RECIPE_REVISION" |
    sha256sum | cut -c1-16
}

# A cached build of the pinned versions made by any Go version (for machines without Go).
cached_by_any_go() {
  local versions
  for versions in "$CACHE_ROOT"/*/VERSIONS; do
    [[ -f "$versions" ]] || continue
    if grep -qx "KUBE_VERSION=$KUBE_VERSION" "$versions" && grep -qx "ETCD_VERSION=$ETCD_VERSION" "$versions" &&
      grep -qx "KWOK_VERSION=$KWOK_VERSION" "$versions" && grep -qx "RECIPE_REVISION=$RECIPE_REVISION" "$versions"; then
      dirname "$versions"
      return 0
    fi
  done
  return 1
}

cache_dir() {
  if command -v go >/dev/null 2>&1; then
    echo "$CACHE_ROOT/$(cache_key)"
  elif ! cached_by_any_go; then
    echo "kube-bins: go not found and no cached build of Kubernetes $KUBE_VERSION in $CACHE_ROOT:" \
      "install Go 1.24+ (https://go.dev/dl/) to build it once" >&2
    return 1
  fi
}

START=$SECONDS
say() { printf '[kube-bins %3dm%02ds] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*" >&2; }

# run_step COMPONENT LOGFILE CMD...: runs CMD with its output in LOGFILE, printing elapsed time every
# 30 s; on failure names the component and the log and exits non-zero.
run_step() {
  local component=$1 log=$2
  shift 2
  say "$component: $*"
  "$@" >>"$log" 2>&1 &
  local pid=$! rc=0 last=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - last >= 30)); then
      last=$SECONDS
      say "$component: still working (log: $log)"
    fi
  done
  wait "$pid" || rc=$?
  if ((rc != 0)); then
    say "FAILED building $component (exit $rc); last lines of $log:"
    tail -n 25 "$log" >&2
    exit 1
  fi
}

# write_wrapper_gomod DIR MODULE VERSION SIBLING_VERSION: a go.mod for a module that depends on MODULE
# and repeats MODULE's own local-path replace lines as module replaces at SIBLING_VERSION (a
# dependency's replaces are ignored by Go, so the wrapper has to state them itself).
write_wrapper_gomod() {
  local dir=$1 module=$2 version=$3 sibling=$4 upstream
  upstream=$(cd "$dir" && go mod download -json "$module@$version" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')
  python3 - "$upstream" "$module" "$version" "$sibling" >"$dir/go.mod" <<'PY'
import re, sys
upstream, module, version, sibling = sys.argv[1:]
text = open(upstream).read()
go_line = re.search(r"^go \S+$", text, re.M)
godebug = re.findall(r"^godebug .*$", text, re.M)
local = re.findall(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+(\.\.?/\S*)\s*$", text, re.M)
print("module tjdev/wrapper\n")
print(go_line.group(0) if go_line else "go 1.24.0")
print("\n".join(godebug))
print(f"\nrequire {module} {version}\n")
replaces = [f"\t{name} => {name} {sibling}" for name, path in local if "FORBIDDEN" not in path]
if replaces:
    print("replace (\n" + "\n".join(replaces) + "\n)")
PY
}

build_kubernetes() {
  local out=$1 work=$2 log=$3 v=$KUBE_VERSION minor
  minor=$(echo "$v" | cut -d. -f2)
  local staging="v0.${v#v1.}"
  mkdir -p "$work/kubernetes"
  run_step kubernetes "$log" write_wrapper_gomod "$work/kubernetes" k8s.io/kubernetes "$v" "$staging"
  local stamp="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  cd "$work/kubernetes"
  run_step kubernetes "$log" go mod download k8s.io/kubernetes
  run_step kubernetes "$log" go build -trimpath -ldflags "-s -w$stamp" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
}

build_etcd() {
  local out=$1 work=$2 log=$3
  mkdir -p "$work/etcd"
  run_step etcd "$log" write_wrapper_gomod "$work/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION"
  cd "$work/etcd"
  run_step etcd "$log" go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=release" \
    -o "$out/etcd" go.etcd.io/etcd/server/v3
}

build_kwok() {
  local out=$1 work=$2 log=$3
  mkdir -p "$work/kwok"
  cd "$work/kwok"
  run_step kwok "$log" env GOBIN="$out" GOFLAGS= go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

check_versions() {
  local out=$1 log=$2
  run_step etcd "$log" "$out/etcd" --version
  run_step kube-apiserver "$log" "$out/kube-apiserver" --version
  run_step kube-controller-manager "$log" "$out/kube-controller-manager" --version
  run_step kube-scheduler "$log" "$out/kube-scheduler" --version
  run_step kubectl "$log" "$out/kubectl" version --client
  run_step kwok "$log" "$out/kwok" --version
  grep -q "Kubernetes $KUBE_VERSION" "$log" || { say "kube-apiserver does not report $KUBE_VERSION (see $log)"; exit 1; }
}

ensure() {
  local dest
  dest=$(cache_dir)
  if ! command -v go >/dev/null 2>&1; then
    echo "$dest"
    return
  fi
  if [[ -f "$dest/VERSIONS" ]]; then echo "$dest"; return; fi
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  if ! flock -n 9; then
    say "another build holds $CACHE_ROOT/.lock; waiting for it"
    flock 9
  fi
  if [[ -f "$dest/VERSIONS" ]]; then echo "$dest"; return; fi
  local tmp logs
  tmp=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
  logs="$CACHE_ROOT/logs"
  mkdir -p "$tmp/bin" "$logs"
  # shellcheck disable=SC2064 # expand now: $tmp is local to this function
  trap "rm -rf '$tmp'" EXIT
  say "cold build of $KUBE_VERSION / etcd $ETCD_VERSION / kwok $KWOK_VERSION with $(go_version) into $dest"
  say "logs: $logs/<component>.log"
  : >"$logs/etcd.log"; : >"$logs/kubernetes.log"; : >"$logs/kwok.log"; : >"$logs/versions.log"
  build_etcd "$tmp/bin" "$tmp/work" "$logs/etcd.log"
  build_kwok "$tmp/bin" "$tmp/work" "$logs/kwok.log"
  build_kubernetes "$tmp/bin" "$tmp/work" "$logs/kubernetes.log"
  check_versions "$tmp/bin" "$logs/versions.log"
  {
    echo "KUBE_VERSION=$KUBE_VERSION"
    echo "ETCD_VERSION=$ETCD_VERSION"
    echo "KWOK_VERSION=$KWOK_VERSION"
    echo "GO_VERSION=$(go_version)"
    echo "RECIPE_REVISION=$RECIPE_REVISION"
    echo "BUILD_SECONDS=$((SECONDS - START))"
  } >"$tmp/bin/VERSIONS"
  mv "$tmp/bin" "$dest"
  say "built and cached in $dest"
  echo "$dest"
}

case "${1:-}" in
  dir) cache_dir ;;
  ensure) ensure ;;
  *) echo "usage: $0 dir|ensure" >&2; exit 2 ;;
esac
