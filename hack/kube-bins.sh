#!/usr/bin/env bash
# Builds and caches the local control plane's binaries, and optional components, from Go modules.
#
# Why: these machines have no container engine and cannot download release binaries, but they reach
# the Go module proxy. etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok
# are compiled once per (versions, Go version, recipe revision) and cached under the home directory.
# Optional components (Helm, ...) are built the same way, each under a key of its own, and only when
# asked for by name. A cached use never runs `go` (the Go version comes from the toolchain's VERSION
# file) and so never touches the network.
#
#   hack/kube-bins.sh dir [COMPONENT]     print the cache directory (built or not)
#   hack/kube-bins.sh ensure [COMPONENT]  build into the cache unless it is already there; print it
#   hack/kube-bins.sh components          list the optional components and their pinned versions
#
# Without COMPONENT: the control plane. With one: that optional component, whose directory holds its
# binary under the component's name (e.g. `$(hack/kube-bins.sh ensure helm)/helm`).
# Without Go on PATH, a cached build of the pinned versions (whatever Go built it) is used as is.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
CACHE_BASE=${TJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingjob-operator}
CACHE_ROOT=$CACHE_BASE/kube-bins
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# ------------------------------------------------------------------------------ optional components
# One function per component, `component_<name>` (dashes as underscores), setting:
#   MODULE        the Go module, VERSION its pinned version (from versions.env)
#   PACKAGE       the main package, relative to the module (`.`: the module's root); or PACKAGES,
#                 several main packages of one module, each binary named after its package (the
#                 first is the one whose version is checked)
#   HOW           install:   `go install MODULE/PACKAGE@VERSION` (for a module without replace lines)
#                 in-module: `go build ./PACKAGE` inside a copy of the module's source, so that its
#                            own go.mod, replace lines included, applies
#                 kubernetes: `go build` in the control plane's wrapper module (k8s.io/kubernetes
#                            with its staging modules replaced by their published versions)
#   TAGS          optional Go build tags
#   VERSION_ARGS  arguments that make the binary print its version; the output must contain VERSION
#                 (the exit status does not count: it runs with an empty environment, so a program
#                 without a version flag may print its version as it starts and then exit); or a
#                 function `version_<name> BINARY WORK` printing it, for a program that cannot say it
#   RECIPE        the entry's revision: raise it when the entry's recipe changes (a new cache key)
#   ASSETS        optional: paths in the module (CRDs, configuration) copied next to the binary
# and optionally a function `patch_<name>` run inside the copy of the module (in-module builds) to
# change its source before the build,
# and a function `ldflags_<name> GOMOD` printing the -X flags that stamp the version (GOMOD
# is the module's go.mod, for versions the stamps derive from its requirements).

component_helm() {
  MODULE=helm.sh/helm/v3 VERSION=$HELM_VERSION PACKAGE=cmd/helm HOW=install RECIPE=1
  VERSION_ARGS=(version --short)
}

# What helm's own Makefile stamps: its version, and the Kubernetes version its client libraries
# implement (the default of .Capabilities.KubeVersion in `helm template` and `helm lint`).
ldflags_helm() {
  local client_go minor flags="" pkg
  client_go=$(required_version "$1" k8s.io/client-go)
  minor=$(echo "$client_go" | cut -d. -f2)
  flags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  echo "$flags"
}

# Kueue's controller manager, with its CRDs and its webhook configurations (testbed/addons/kueue.py
# points them at the local manager). It has no version flag: it logs its version as it starts, then
# exits for the kubeconfig that is not there.
component_kueue() {
  MODULE=sigs.k8s.io/kueue VERSION=$KUEUE_VERSION PACKAGE=cmd/kueue HOW=install RECIPE=2
  VERSION_ARGS=(--kubeconfig=/nonexistent/kubeconfig)
  ASSETS=(config/components/crd/bases config/components/webhook)
}

ldflags_kueue() { echo " -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit="; }

# The kube-scheduler with the scheduler-plugins (coscheduling among them), with the PodGroup CRD and
# the coscheduling configuration. Its go.mod replaces the Kubernetes staging modules, so it is built
# inside a copy of the module.
component_scheduler_plugins() {
  MODULE=sigs.k8s.io/scheduler-plugins VERSION=$SCHEDULER_PLUGINS_VERSION PACKAGE=cmd/scheduler HOW=in-module
  RECIPE=1 VERSION_ARGS=(--version)
  ASSETS=(manifests/coscheduling)
}

ldflags_scheduler_plugins() { echo " -X k8s.io/component-base/version.gitVersion=$SCHEDULER_PLUGINS_VERSION"; }

# Volcano's scheduler and controller manager (testbed/addons/volcano.py), with its CRDs. Its go.mod
# replaces the Kubernetes staging modules, so both are built inside one copy of the module; each binary
# is named after its package (`scheduler`, `controller-manager`). Its admission webhooks are not built:
# the PodGroups the operator creates name their queue, so the only PodGroup webhook (which fills in a
# missing queue) has nothing to do, and none of the others concerns PodGroups or plain pods.
component_volcano() {
  MODULE=volcano.sh/volcano VERSION=$VOLCANO_VERSION PACKAGES=(cmd/scheduler cmd/controller-manager)
  HOW=in-module RECIPE=1 VERSION_ARGS=(--version)
  ASSETS=(config/crd/volcano/bases)
}

ldflags_volcano() { echo " -X volcano.sh/volcano/pkg/version.Version=$VOLCANO_VERSION -X volcano.sh/volcano/pkg/version.GitSHA="; }

# Kubeflow's training-operator v1 (the peer of `make bench-peer`), with its CRDs. Its webhook server
# listens on every interface and no flag chooses the address, so it is built inside a copy of the
# module with one change: main.go gives webhook.Options the host 127.0.0.1 (patch_training_operator).
# It has no version flag or stamp: the check reads the build information Go records in the binary
# (`go version -m`: its main package, and the dependencies v1.9.3's go.mod pins) and the version of
# the module source it was built from, as the Go module proxy delivered it against go.sum.
component_training_operator() {
  MODULE=github.com/kubeflow/training-operator VERSION=$TRAINING_OPERATOR_VERSION
  PACKAGE=cmd/training-operator.v1 HOW=in-module RECIPE=1
  ASSETS=(manifests/base/crds)
}

patch_training_operator() {
  local main=cmd/training-operator.v1/main.go
  sed -i 's|webhook.NewServer(webhook.Options{|webhook.NewServer(webhook.Options{Host: "127.0.0.1",|' "$main"
  grep -q 'Host: "127.0.0.1"' "$main" || { echo "$main no longer builds its webhook server as expected" >&2; return 1; }
}

version_training_operator() {
  go version -m "$1" | awk -v main="$MODULE/$PACKAGE" '$1 == "path" && $2 == main { print; found = 1 } END { exit !found }' || return 1
  python3 -c 'import json, sys; print("source", json.load(open(sys.argv[1]))["Version"])' "$2/module.json"
}

# The real node (testbed/node/realnode.py): the kubelet and kube-proxy of the control plane's
# Kubernetes version, built through the same wrapper module as the control plane (HOW=kubernetes),
# containerd with its runc shim and ctr, CoreDNS, and the local-path provisioner for PersistentVolumes.
component_kubelet() {
  MODULE=k8s.io/kubernetes VERSION=$KUBE_VERSION PACKAGES=(cmd/kubelet cmd/kube-proxy) HOW=kubernetes RECIPE=1
  VERSION_ARGS=(--version)
}

# containerd 2 from Go modules (Debian's 1.6 is past its end of life), static, without the snapshotters
# that need C libraries; the runc shim and ctr (images are imported with it) beside it.
component_containerd() {
  MODULE=github.com/containerd/containerd/v2 VERSION=$CONTAINERD_VERSION HOW=install RECIPE=1
  PACKAGES=(cmd/containerd cmd/containerd-shim-runc-v2 cmd/ctr) TAGS="no_btrfs no_devmapper no_zfs"
  VERSION_ARGS=(--version)
}

ldflags_containerd() { echo " -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"; }

component_coredns() {
  MODULE=github.com/coredns/coredns VERSION=$COREDNS_VERSION PACKAGE=. HOW=install RECIPE=1
}

# CoreDNS says `CoreDNS-1.12.4`: the version without its leading v.
version_coredns() { "$1" -version | sed -n 's/^CoreDNS-\(.*\)$/v\1/p'; }

# Rancher's local-path provisioner: PersistentVolumes as directories of the real node, made and removed
# by helper pods (testbed/node/storage.py). Its version is a variable of its main package.
component_local_path_provisioner() {
  MODULE=github.com/rancher/local-path-provisioner VERSION=$LOCAL_PATH_PROVISIONER_VERSION PACKAGE=.
  HOW=install RECIPE=1 VERSION_ARGS=(--version)
}

ldflags_local_path_provisioner() { echo " -X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION"; }

# The NetworkPolicy enforcer of the real node (testbed/node/netpolicies.py): kube-network-policies
# judges the first packet of each connection of a pod that a policy selects in user space, through
# nfnetlink_queue. It is built inside a copy of the module with three changes (patch_kube_network_policies):
# - its nftables rules hand packets to the queue with the xtables NFQUEUE target (through nft_compat)
#   instead of nftables' own `queue` expression, which kernels built without CONFIG_NFT_QUEUE refuse
#   (this machine kind's: "Could not process rule: No such file or directory"); same queue, same
#   verdicts;
# - it reads $KUBECONFIG when set (upstream takes the in-cluster configuration only, whose token and CA
#   sit at fixed paths under /var/run/secrets); unset, it still falls back to the in-cluster one;
# - SIGTERM stops it like SIGINT, so that it removes its nftables table on the way out (otherwise the
#   packets of the pods it guarded would wait in a queue no one reads, and be dropped).
# It has no version flag: the check reads Go's build information and the module source's version.
component_kube_network_policies() {
  MODULE=sigs.k8s.io/kube-network-policies VERSION=$KUBE_NETWORK_POLICIES_VERSION PACKAGE=cmd
  HOW=in-module RECIPE=1
}

patch_kube_network_policies() {
  local pkg=pkg/networkpolicy main=cmd/main.go
  cat >"$pkg/xtqueue.go" <<'GO'
package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// xtQueue hands a packet to nfnetlink_queue `num` with the xtables NFQUEUE target, revision 3
// (struct xt_NFQ_info_v3: queue number, number of queues, flags; 1 = bypass when no one listens).
func xtQueue(num int, bypass bool) *expr.Target {
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:], uint16(num))
	binary.NativeEndian.PutUint16(info[2:], 1)
	if bypass {
		binary.NativeEndian.PutUint16(info[4:], 1)
	}
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}
GO
  perl -0pi -e 's/queue := &expr\.Queue\{Num: uint16\(c\.config\.QueueID\)\}\n\tif c\.config\.FailOpen \{\n\t\tqueue\.Flag = expr\.QueueFlagBypass\n\t\}/queue := xtQueue(c.config.QueueID, c.config.FailOpen)/g' "$pkg/controller.go"
  perl -0pi -e 's/&expr\.Queue\{Num: uint16\(n\.nfQueueID\), Flag: expr\.QueueFlagBypass\}/xtQueue(n.nfQueueID, true)/g' "$pkg/dnsagent.go"
  if grep -n 'expr\.Queue' "$pkg"/*.go | grep -v _test.go; then
    echo "kube-network-policies no longer queues packets as expected (expr.Queue left above)" >&2
    return 1
  fi
  sed -i -e 's|"k8s.io/client-go/rest"|"k8s.io/client-go/tools/clientcmd"|' \
    -e 's|config, err := rest.InClusterConfig()|config, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))|' \
    -e 's|os.Interrupt, unix.SIGINT)|os.Interrupt, unix.SIGINT, unix.SIGTERM)|' "$main"
  local expected
  for expected in 'clientcmd.BuildConfigFromFlags' 'unix.SIGTERM)'; do
    grep -qF "$expected" "$main" || { echo "$main no longer reads its configuration as expected" >&2; return 1; }
  done
}

version_kube_network_policies() {
  go version -m "$1" | awk -v main="$MODULE/$PACKAGE" '$1 == "path" && $2 == main { print; found = 1 } END { exit !found }' || return 1
  python3 -c 'import json, sys; print("source", json.load(open(sys.argv[1]))["Version"])' "$2/module.json"
}

# The image registry of the local cluster (testbed/node/registry.py): the CNCF distribution project's
# `registry`, stamped with its version as its Makefile does. Built without the build tags of the cloud
# storage drivers: it stores on the filesystem only.
component_registry() {
  MODULE=github.com/distribution/distribution/v3 VERSION=$REGISTRY_VERSION PACKAGE=cmd/registry HOW=install
  RECIPE=1 VERSION_ARGS=(--version)
}

ldflags_registry() {
  local pkg=github.com/distribution/distribution/v3
  echo " -X $pkg/version.version=$REGISTRY_VERSION -X $pkg/version.mainpkg=$pkg"
}

components() { declare -F | sed -n 's/^declare -f component_//p' | tr _ -; }

describe_component() {
  local name=$1
  if ! declare -F "component_${name//-/_}" >/dev/null; then
    echo "kube-bins: unknown component '$name'; one of: $(echo $(components))" >&2
    exit 2
  fi
  ASSETS=() VERSION_ARGS=() PACKAGE="" PACKAGES=() TAGS=""
  "component_${name//-/_}"
  if ((${#PACKAGES[@]} == 0)); then PACKAGES=("$PACKAGE"); fi
}

# ------------------------------------------------------------------------------------------ helpers

# The Go toolchain's version, read from its VERSION file so that a cached use runs no `go` command.
go_version() {
  local go root version
  go=$(command -v go)
  go=$(readlink -f "$go" 2>/dev/null || echo "$go")
  root=$(dirname "$(dirname "$go")")
  if [[ -z "${GOROOT:-}" && -f "$root/VERSION" ]] && read -r version <"$root/VERSION" && [[ $version == go* ]]; then
    echo "$version"
  else
    (cd / && go env GOVERSION)
  fi
}

# hash_key WORDS...: the cache key of a build described by WORDS and made with this Go.
hash_key() { printf '%s go=%s' "$*" "$(go_version)" | sha256sum | cut -c1-16; }

# cached_by_any_go ROOT LINE...: a build under ROOT whose VERSIONS file holds every LINE, whatever Go
# version made it (for machines without Go).
cached_by_any_go() {
  local root=$1 versions line
  shift
  for versions in "$root"/*/VERSIONS; do
    [[ -f "$versions" ]] || continue
    for line in "$@"; do grep -qxF "$line" "$versions" || continue 2; done
    dirname "$versions"
    return 0
  done
  return 1
}

# required_version GOMOD MODULE: the version a go.mod requires of MODULE.
required_version() {
  awk -v module="$2" '$1 == module && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == module { print $3; exit }' "$1"
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

# cached_build DEST ROOT WHAT BUILD...: prints DEST once it holds a finished build. When DEST/VERSIONS
# is missing, it takes ROOT/.lock (waiting for another build of the same thing), runs `BUILD... TMP`
# to fill a temporary directory under ROOT (BUILD writes TMP/VERSIONS last) and renames it to DEST,
# so nothing half-built is ever in the cache. A build stopped by a signal removes its temporary
# directory (the EXIT trap); one left by a build killed outright (SIGKILL) is removed by the next
# build that holds the lock.
cached_build() {
  local dest=$1 root=$2 what=$3 tmp
  shift 3
  if [[ -f "$dest/VERSIONS" ]]; then echo "$dest"; return; fi
  mkdir -p "$root"
  exec 9>"$root/.lock"
  if ! flock -n 9; then
    say "another build holds $root/.lock; waiting for it"
    flock 9
  fi
  if [[ -f "$dest/VERSIONS" ]]; then echo "$dest"; return; fi
  # Whoever made these is gone (the lock is ours); a module copied from Go's cache is read-only.
  chmod -R u+w "$root"/.build-* 2>/dev/null || true
  rm -rf "$root"/.build-*
  tmp=$(mktemp -d "$root/.build-XXXXXX")
  # shellcheck disable=SC2064 # expand now: $tmp is local to this function
  trap "rm -rf '$tmp'" EXIT
  say "cold build of $what with $(go_version) into $dest"
  "$@" "$tmp"
  mv "$tmp/bin" "$dest"
  say "built and cached in $dest"
  echo "$dest"
}

# ---------------------------------------------------------------------------------- control plane

cache_dir() {
  if command -v go >/dev/null 2>&1; then
    # (The words' order predates hash_key; kept so existing caches stay valid.)
    echo "$CACHE_ROOT/$(printf 'kube=%s etcd=%s kwok=%s go=%s recipe=%s' "$KUBE_VERSION" "$ETCD_VERSION" \
      "$KWOK_VERSION" "$(go_version)" "$RECIPE_REVISION" | sha256sum | cut -c1-16)"
  elif ! cached_by_any_go "$CACHE_ROOT" "KUBE_VERSION=$KUBE_VERSION" "ETCD_VERSION=$ETCD_VERSION" \
    "KWOK_VERSION=$KWOK_VERSION" "RECIPE_REVISION=$RECIPE_REVISION"; then
    echo "kube-bins: go not found and no cached build of Kubernetes $KUBE_VERSION in $CACHE_ROOT:" \
      "install Go 1.24+ (https://go.dev/dl/) to build it once" >&2
    return 1
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

# kubernetes_stamp: the -X flags that make Kubernetes binaries report $KUBE_VERSION.
kubernetes_stamp() {
  local stamp="" pkg minor
  minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$stamp"
}

# kubernetes_wrapper DIR LOG WHAT: the wrapper module of k8s.io/kubernetes in DIR, downloaded; the
# shell is left in DIR, where `go build k8s.io/kubernetes/cmd/...` works.
kubernetes_wrapper() {
  local dir=$1 log=$2 what=$3 v=$KUBE_VERSION
  mkdir -p "$dir"
  run_step "$what" "$log" write_wrapper_gomod "$dir" k8s.io/kubernetes "$v" "v0.${v#v1.}"
  cd "$dir"
  run_step "$what" "$log" go mod download k8s.io/kubernetes
}

build_kubernetes() {
  local out=$1 work=$2 log=$3
  kubernetes_wrapper "$work/kubernetes" "$log" kubernetes
  run_step kubernetes "$log" go build -trimpath -ldflags "-s -w$(kubernetes_stamp)" -o "$out/" \
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

build_control_plane() {
  local tmp=$1 logs=$CACHE_ROOT/logs
  mkdir -p "$tmp/bin" "$logs"
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
}

# ---------------------------------------------------------------------------- optional components

optional_dir() {
  local name=$1 root=$CACHE_BASE/components/$1
  describe_component "$name"
  if command -v go >/dev/null 2>&1; then
    echo "$root/$(hash_key "component=$name module=$MODULE version=$VERSION recipe=$RECIPE.$COMPONENT_RECIPE_REVISION")"
  elif ! cached_by_any_go "$root" "VERSION=$VERSION" "RECIPE=$RECIPE.$COMPONENT_RECIPE_REVISION"; then
    echo "kube-bins: go not found and no cached build of $name $VERSION in $root:" \
      "install Go 1.24+ (https://go.dev/dl/) to build it once" >&2
    return 1
  fi
}

# download_module MODULE@VERSION JSON: the module's source into Go's module cache; its paths as JSON.
download_module() { go mod download -json "$1" >"$2"; }

build_component() {
  local name=$1 tmp=$2 work=$2/work log=$CACHE_BASE/components/$1/build.log ldflags=""
  describe_component "$name"
  mkdir -p "$tmp/bin" "$work"
  : >"$log"
  say "$name: log $log"
  cd "$work"
  run_step "$name" "$log" download_module "$MODULE@$VERSION" "$work/module.json"
  local source gomod
  source=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["Dir"])' "$work/module.json")
  gomod=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$work/module.json")
  if declare -F "ldflags_${name//-/_}" >/dev/null; then ldflags=$("ldflags_${name//-/_}" "$gomod"); fi
  case "$HOW" in
    install)
      local targets=() pkg
      for pkg in "${PACKAGES[@]}"; do
        if [[ $pkg == . ]]; then targets+=("$MODULE@$VERSION"); else targets+=("$MODULE/$pkg@$VERSION"); fi
      done
      run_step "$name" "$log" env GOBIN="$work/gobin" GOFLAGS= go install -trimpath -tags "$TAGS" \
        -ldflags "-s -w$ldflags" "${targets[@]}"
      if ((${#PACKAGES[@]} == 1)); then mv "$work/gobin"/* "$tmp/bin/$name"; else mv "$work/gobin"/* "$tmp/bin/"; fi
      ;;
    in-module)
      cp -r "$source" "$work/src"
      chmod -R u+w "$work/src"
      cd "$work/src"
      if declare -F "patch_${name//-/_}" >/dev/null; then run_step "$name" "$log" "patch_${name//-/_}"; fi
      if ((${#PACKAGES[@]} == 1)); then
        run_step "$name" "$log" go build -trimpath -tags "$TAGS" -ldflags "-s -w$ldflags" -o "$tmp/bin/$name" "./$PACKAGE"
      else
        local pkg
        for pkg in "${PACKAGES[@]}"; do
          run_step "$name" "$log" go build -trimpath -tags "$TAGS" -ldflags "-s -w$ldflags" -o "$tmp/bin/" "./$pkg"
        done
      fi
      ;;
    kubernetes)
      local packages=() pkg
      for pkg in "${PACKAGES[@]}"; do packages+=("$MODULE/$pkg"); done
      kubernetes_wrapper "$work/kubernetes" "$log" "$name"
      run_step "$name" "$log" go build -trimpath -ldflags "-s -w$(kubernetes_stamp)" -o "$tmp/bin/" "${packages[@]}"
      ;;
    *) say "component $name: unknown HOW=$HOW"; exit 1 ;;
  esac
  local asset
  for asset in "${ASSETS[@]}"; do
    mkdir -p "$(dirname "$tmp/bin/$asset")"
    cp -r "$source/$asset" "$tmp/bin/$asset"
    chmod -R u+w "$tmp/bin/$asset"
  done
  local reported checked=$tmp/bin/$name
  # Several binaries, each named after its package: the first package's is checked.
  if [[ ! -e $checked ]] && ((${#PACKAGES[@]} > 1)); then checked=$tmp/bin/$(basename "${PACKAGES[0]}"); fi
  if declare -F "version_${name//-/_}" >/dev/null; then
    say "$name: version_${name//-/_} $name"
    reported=$("version_${name//-/_}" "$checked" "$work" 2>&1 || true)
  else
    say "$name: $name ${VERSION_ARGS[*]}"
    reported=$(cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" timeout 60 "$checked" "${VERSION_ARGS[@]}" 2>&1 || true)
  fi
  echo "$reported" >>"$log"
  if ! grep -qF -- "$VERSION" <<<"$reported"; then
    say "FAILED building $name: \`$name ${VERSION_ARGS[*]}\` does not report $VERSION; last lines of $log:"
    tail -n 25 "$log" >&2
    exit 1
  fi
  {
    echo "NAME=$name"
    echo "MODULE=$MODULE"
    echo "VERSION=$VERSION"
    echo "GO_VERSION=$(go_version)"
    echo "RECIPE=$RECIPE.$COMPONENT_RECIPE_REVISION"
    echo "BUILD_SECONDS=$((SECONDS - START))"
  } >"$tmp/bin/VERSIONS"
}

# ------------------------------------------------------------------------------------------ main

ensure() {
  local dest
  if (($# == 0)); then
    dest=$(cache_dir)
    command -v go >/dev/null 2>&1 || { echo "$dest"; return; }
    cached_build "$dest" "$CACHE_ROOT" "$KUBE_VERSION / etcd $ETCD_VERSION / kwok $KWOK_VERSION" build_control_plane
  else
    dest=$(optional_dir "$1")
    command -v go >/dev/null 2>&1 || { echo "$dest"; return; }
    describe_component "$1"
    cached_build "$dest" "$CACHE_BASE/components/$1" "$1 $VERSION" build_component "$1"
  fi
}

case "${1:-}" in
  dir) if (($# > 1)); then optional_dir "$2"; else cache_dir; fi ;;
  ensure) shift; ensure "$@" ;;
  components)
    for name in $(components); do describe_component "$name"; echo "$name $MODULE $VERSION"; done
    ;;
  *) echo "usage: $0 dir|ensure [COMPONENT] | components" >&2; exit 2 ;;
esac
