#!/usr/bin/env bash
# Checks, before `make demo` installs or starts anything, that this machine has what the demo needs,
# and says exactly what is missing and how to get it. Every problem is listed, not just the first;
# the exit status is 1 when there is any, and then nothing has been installed or started.
#
#   hack/preflight.sh
#
# Reads PYTHON (default python3), DEMO_METRICS_PORT (default 8080), DEMO_HEALTH_PORT (default 8081),
# TJ_DEV_DIR, TJ_CACHE_DIR and
# TJ_CGROUP_FS (where the cgroup hierarchies are mounted, default /sys/fs/cgroup).
# Needed: Python 3.11+ with venv, make, openssl, free 127.0.0.1 ports for the operator's metrics and probes,
# Go 1.24+ when the control plane has to be built (without Go, hack/kube-bins.sh uses a cached build
# of the pinned versions, whatever Go made it), and for the real node the job runs on: root, cgroup v1
# and Debian's packages (installed by `make node-tools` when apt-get is there).
set -uo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HACK_DIR")
PYTHON=${PYTHON:-python3}
METRICS_PORT=${DEMO_METRICS_PORT:-8080}
HEALTH_PORT=${DEMO_HEALTH_PORT:-8081}
DEV_DIR=${TJ_DEV_DIR:-$REPO/.dev}
CGROUP_FS=${TJ_CGROUP_FS:-/sys/fs/cgroup}
MIN_GO=1.24

problems=()
found=()
problem() { problems+=("$1"); }

# version_at_least HAVE WANT: true when dotted version HAVE >= WANT (numeric, major.minor[.patch]).
version_at_least() {
  local have=$1 want=$2 h w i
  IFS=. read -r -a h <<<"$have"
  IFS=. read -r -a w <<<"$want"
  for i in 0 1 2; do
    if ((${h[i]:-0} > ${w[i]:-0})); then return 0; fi
    if ((${h[i]:-0} < ${w[i]:-0})); then return 1; fi
  done
  return 0
}

# --- Python 3.11+ with venv (the operator's virtualenv) -------------------------------------------
python_ok=false
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  problem "python3 not found: the operator needs Python 3.11 or newer with its venv module. Install it
      (Debian/Ubuntu: sudo apt-get install python3 python3-venv; others: https://www.python.org/downloads/)
      or name one with PYTHON=/path/to/python3.11 make demo"
else
  py_version=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo 0)
  if ! version_at_least "$py_version" 3.11; then
    problem "$PYTHON is Python $py_version; the operator needs 3.11 or newer. Install a newer one
      (Debian/Ubuntu: sudo apt-get install python3.11 python3.11-venv) and run PYTHON=python3.11 make demo"
  elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    short=${py_version%.*}
    problem "$PYTHON (Python $py_version) cannot create virtualenvs: its venv/ensurepip modules are missing.
      Debian/Ubuntu: sudo apt-get install python$short-venv"
  else
    python_ok=true
    found+=("python $py_version")
  fi
fi

# --- make, openssl ---------------------------------------------------------------------------------
if command -v make >/dev/null 2>&1; then
  found+=("make")
else
  problem "make not found. Debian/Ubuntu: sudo apt-get install make; Fedora: sudo dnf install make"
fi
if command -v openssl >/dev/null 2>&1; then
  found+=("openssl")
else
  problem "openssl not found: the local cluster makes its certificates with it.
      Debian/Ubuntu: sudo apt-get install openssl; Fedora: sudo dnf install openssl"
fi

# --- Go, unless the cluster already runs or its binaries are cached --------------------------------
if $python_ok && TJ_DEV_DIR=$DEV_DIR PYTHONPATH=$REPO "$PYTHON" -m testbed.cluster status >/dev/null 2>&1; then
  found+=("the local cluster (running)")
elif ! command -v go >/dev/null 2>&1 && cache=$("$HACK_DIR/kube-bins.sh" dir 2>/dev/null); then
  found+=("the control plane, cached in $cache (no Go needed)")
elif ! command -v go >/dev/null 2>&1; then
  problem "go not found: Go $MIN_GO or newer builds the local Kubernetes control plane from Go modules on
      the first run (about 15 minutes and 6 GB of disk, cached under ~/.cache/trainingjob-operator) and
      finds the cached build afterwards. Install it from https://go.dev/dl/ (or your distribution's
      golang package, if it is $MIN_GO or newer) and put it on PATH"
else
  go_version=$( (cd / && GOTOOLCHAIN=local go env GOVERSION) 2>/dev/null || echo unknown)
  cache=$("$HACK_DIR/kube-bins.sh" dir 2>/dev/null || true)
  if [[ -n "$cache" && -f "$cache/VERSIONS" ]]; then
    found+=("$go_version (control plane cached in $cache)")
  elif ! version_at_least "${go_version#go}" "$MIN_GO" 2>/dev/null; then
    problem "$go_version is too old to build the local control plane (Kubernetes needs Go $MIN_GO or newer).
      Install a newer Go from https://go.dev/dl/ and put it first on PATH"
  else
    for tool in flock sha256sum; do
      command -v "$tool" >/dev/null 2>&1 ||
        problem "$tool not found: the control plane build needs it (Debian/Ubuntu: util-linux, coreutils)"
    done
    found+=("$go_version (the first run builds the control plane: about 15 minutes, then cached)")
  fi
fi

# --- the real node (its job runs in containers: testbed/node/realnode.py) ------------------------
if [[ $(id -u) != 0 ]]; then
  problem "the demo runs its job in containers on a real node (kubelet, containerd), which needs root:
      a network namespace, cgroups and mounts. Run make demo as root (e.g. in a VM or container host)."
fi
if [[ ! -e $CGROUP_FS/memory/cgroup.procs || ! -d $CGROUP_FS/cpu ]]; then
  problem "no cgroup v1 memory and cpu hierarchies under $CGROUP_FS: the real node's kubelet is set up
      for cgroup v1 (testbed/node/README.md)"
fi
for package in runc containernetworking-plugins iptables debootstrap buildah busybox-static; do
  if ! dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q ' installed$'; then
    if ! command -v apt-get >/dev/null 2>&1; then
      problem "the Debian package $package is missing and there is no apt-get to install it: the real
      node needs runc, containernetworking-plugins, iptables, debootstrap, buildah and busybox-static"
    fi
    break
  fi
done
found+=("root and cgroup v1 for the real node")

# --- free ports for the operator's metrics and probes ----------------------------------------------
# check_port VARIABLE PORT WHAT EXAMPLE: the port is free, or held by the demo's own operator.
check_port() {
  local variable=$1 port=$2 what=$3 example=$4 port_check
  port_check=$("$PYTHON" - "$variable" "$port" "$DEV_DIR/run/state.json" <<'PY'
import json, os, socket, sys

variable, port, state_path = sys.argv[1], sys.argv[2], sys.argv[3]
if not port.isdigit() or not 0 < int(port) < 65536:
    print(f"{variable}={port} is not a port number")
    sys.exit()
probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
# As the operator's servers bind (SO_REUSEADDR): connections a stopped operator closed, in TIME_WAIT
# for a minute after `make demo-down`, do not keep it from binding, and must not fail this check.
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind(("127.0.0.1", int(port)))
    print("free")
except OSError:
    # In use: fine when it is the demo's own operator from an earlier `make demo` (it is reused).
    try:
        operator = json.load(open(state_path)).get("extras", {}).get("operator", {})
    except (OSError, ValueError):
        operator = {}
    ours = f"127.0.0.1:{port}" in " ".join(operator.get("command", [])) and os.path.exists(
        f"/proc/{operator.get('pid', 0)}"
    )
    print("ours" if ours else "busy")
finally:
    probe.close()
PY
)
  case "$port_check" in
    free) found+=("port $port free") ;;
    ours) found+=("port $port (the demo's operator, reused)") ;;
    busy) problem "port $port on 127.0.0.1 is in use by another program; the operator's $what go there.
      Stop that program or pick another port: make demo $variable=$example" ;;
    *) problem "$port_check" ;;
  esac
}
if $python_ok; then
  check_port DEMO_METRICS_PORT "$METRICS_PORT" metrics 18080
  check_port DEMO_HEALTH_PORT "$HEALTH_PORT" probes 18081
fi

if ((${#problems[@]})); then
  echo "preflight: make demo cannot run on this machine yet; nothing was installed or started." >&2
  for item in "${problems[@]}"; do
    echo "  - $item" >&2
  done
  exit 1
fi
summary=$(printf '%s, ' "${found[@]}")
echo "preflight: ok: ${summary%, }" >&2
