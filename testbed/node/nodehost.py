"""What the real node changes on the machine, and how each change is undone.

Why: a kubelet and a container runtime are built to own their machine. Here they share it with
everything else, so every change they need (a network namespace and a veth pair, cgroups, kernel
tunables the kubelet sets, mounts of pod volumes and container root filesystems, sockets at fixed
paths) is made by this module, written down in state.json as it is made, and undone by `down` from
that record, also by a later process after a crash. The record is kept on the machine too
(`HOST_RECORD`), so that a node whose run was killed before its `down` (its checkout's state gone
with it, or another checkout's) is undone by the next `up` on the machine. `snapshot()` reads the
machine-wide state these touch, so a test can compare the machine before `up` and after `down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from testbed.common import ToolError
from testbed.node import nodeconfig
from testbed.node.nodeconfig import (
    CGROUP_ROOT,
    HOST_IP,
    HOST_LINK,
    KERNEL_TUNABLES,
    LINK_PREFIX,
    NETNS,
    NODE_IP,
    NODE_LINK,
    RUNTIME_CGROUP,
    SERVICE_CIDR,
)

CGROUP_FS: Final = Path("/sys/fs/cgroup")
SYSCTL: Final = Path("/proc/sys")
NETNS_DIR: Final = Path("/run/netns")
# What the node changed on the machine, beside its checkout's state.json; /run is emptied by a reboot,
# as is most of what the node changes.
HOST_RECORD: Final = Path("/run/trainingjob-node.json")
# Fixed paths the kubelet and the runtime use whatever their configuration says.
DEVICE_PLUGINS: Final = Path("/var/lib/kubelet/device-plugins")
SHIM_SOCKETS: Final = Path("/run/containerd/s")


def missing_prerequisites() -> list[str]:
    """Why the real node cannot start on this machine (empty when it can): root, cgroup v1 hierarchies,
    and the tools from Debian's packages it runs."""
    reasons: list[str] = []
    if os.geteuid() != 0:
        reasons.append("the real node needs root (network namespaces, cgroups, mounts)")
    if not (CGROUP_FS / "memory" / "cgroup.procs").exists() or not (CGROUP_FS / "cpu").is_dir():
        reasons.append("no cgroup v1 memory and cpu hierarchies under /sys/fs/cgroup")
    for tool in ("/usr/sbin/ip", "/usr/bin/nsenter", str(nodeconfig.RUNC), "/usr/sbin/iptables"):
        if not Path(tool).exists():
            reasons.append(f"{tool} is missing (`make node-tools` installs it)")
    if not (nodeconfig.CNI_BIN_DIR / "bridge").exists():
        reasons.append(f"the CNI plugins are missing ({nodeconfig.CNI_BIN_DIR}/bridge; `make node-tools`)")
    return reasons


def run(*command: str, check: bool = True, timeout: float = 60) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise ToolError(f"{' '.join(command)} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


# -------------------------------------------------------------------------- the machine's record


def save_record(record: dict[str, Any]) -> None:
    HOST_RECORD.write_text(json.dumps(record, indent=1) + "\n")


def forget_record() -> None:
    HOST_RECORD.unlink(missing_ok=True)


def running_pids() -> set[int]:
    """Processes of a real node running on this machine: in its cgroups or its network namespace."""
    pids = cgroup_pids([CGROUP_ROOT, RUNTIME_CGROUP])
    if (NETNS_DIR / NETNS).exists():
        pids |= {int(pid) for pid in run("ip", "netns", "pids", NETNS, check=False).split()}
    return pids


def left_behind() -> dict[str, Any] | None:
    """The record of what a node whose processes are gone left on the machine, or None when it left
    nothing. Without the machine's record (a node from before it was kept), what is found is named:
    the namespace and the veth pair, the cgroups and the node's own directories are undone; kernel
    tunables cannot be restored without the values from before."""
    record: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(HOST_RECORD.read_text())
    if (NETNS_DIR / NETNS).exists():
        record.setdefault("netns", NETNS)
    if run("ip", "link", "show", HOST_LINK, check=False):
        record.setdefault("link", HOST_LINK)
    found = (
        record
        or any((h / name).is_dir() for h in hierarchies() for name in (CGROUP_ROOT, RUNTIME_CGROUP))
        or nodeconfig.SOCKETS_DIR.exists()
        or nodeconfig.STATE_DIR.exists()
    )
    return record if found else None


# --------------------------------------------------------------------------------------- network


def create_network(record: dict[str, Any]) -> None:
    """The node's network namespace, joined to the machine by a veth pair; loopback up inside."""
    record["netns_dir_existed"] = NETNS_DIR.exists()
    run("ip", "netns", "add", NETNS)
    record["netns"] = NETNS
    peer = f"{HOST_LINK}p"
    run("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", peer)
    record["link"] = HOST_LINK
    run("ip", "link", "set", peer, "netns", NETNS)
    inside = ("ip", "netns", "exec", NETNS)
    run(*inside, "ip", "link", "set", peer, "name", NODE_LINK)
    run(*inside, "ip", "addr", "add", f"{NODE_IP}/{LINK_PREFIX}", "dev", NODE_LINK)
    run(*inside, "ip", "link", "set", NODE_LINK, "up")
    run(*inside, "ip", "link", "set", "lo", "up")
    # The node's own processes may use Service addresses too (kube-proxy rewrites them on the way out);
    # pods reach them through the bridge.
    run(*inside, "ip", "route", "add", SERVICE_CIDR, "dev", NODE_LINK)
    run("ip", "addr", "add", f"{HOST_IP}/{LINK_PREFIX}", "dev", HOST_LINK)
    run("ip", "link", "set", HOST_LINK, "up")


def remove_network(record: dict[str, Any]) -> None:
    """The namespace goes with its interfaces, bridge, iptables chains and sysctls; the veth pair with
    it. /run/netns itself is removed when the node made it."""
    if record.get("netns"):
        run("ip", "netns", "delete", record["netns"], check=False)
    if record.get("link"):
        run("ip", "link", "delete", record["link"], check=False)
    if record.get("netns_dir_existed") is False and NETNS_DIR.exists() and not any(NETNS_DIR.iterdir()):
        run("umount", str(NETNS_DIR), check=False)
        with contextlib.suppress(OSError):
            NETNS_DIR.rmdir()


# --------------------------------------------------------------------------------------- sysctls


def save_tunables(record: dict[str, Any]) -> None:
    record["sysctls"] = {name: (SYSCTL / name).read_text().strip() for name in KERNEL_TUNABLES}


def restore_tunables(record: dict[str, Any]) -> None:
    for name, value in (record.get("sysctls") or {}).items():
        with contextlib.suppress(OSError):
            (SYSCTL / name).write_text(value + "\n")


# --------------------------------------------------------------------------------------- cgroups


def hierarchies() -> list[Path]:
    """Every mounted cgroup v1 hierarchy (the directories under /sys/fs/cgroup with a cgroup.procs)."""
    return sorted(path for path in CGROUP_FS.iterdir() if (path / "cgroup.procs").exists())


def create_cgroups(record: dict[str, Any]) -> None:
    """The kubelet's cgroup root and the runtime's cgroup in every hierarchy (cpuset needs its cpus
    and mems set before a process may join)."""
    made: list[str] = []
    record["cgroups"] = made
    for hierarchy in hierarchies():
        for name in (CGROUP_ROOT, RUNTIME_CGROUP):
            path = hierarchy / name
            if not path.exists():
                path.mkdir()
                made.append(str(path))
            for setting in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / setting).exists():
                    (path / setting).write_text((hierarchy / setting).read_text())


def cgroup_pids(names: Iterable[str]) -> set[int]:
    pids: set[int] = set()
    for hierarchy in hierarchies():
        for name in names:
            root = hierarchy / name
            if not root.is_dir():
                continue
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_cgroups(names: Iterable[str], timeout: float = 10.0) -> None:
    """SIGKILL every process in the cgroup trees `names` until none is left (containers, shims)."""
    names = list(names)
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(names):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ToolError(f"processes {sorted(pids)} in cgroups {', '.join(names)} outlived SIGKILL")
        time.sleep(0.1)


def remove_cgroups(record: dict[str, Any]) -> None:
    """Every cgroup under the node's two, deepest first (the kubelet made kubepods and the pods'),
    in every hierarchy."""
    for hierarchy in hierarchies():
        for name in (CGROUP_ROOT, RUNTIME_CGROUP):
            root = hierarchy / name
            if not root.is_dir():
                continue
            for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    path.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
    record["cgroups"] = []


# ---------------------------------------------------------------------------------------- mounts


def mounts_under(prefixes: Iterable[Path]) -> list[str]:
    """Mount points under any of `prefixes` (from /proc/self/mountinfo), deepest first."""
    roots = [str(prefix) for prefix in prefixes]
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == root or point.startswith(root + "/") for root in roots):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def unmount_under(prefixes: Iterable[Path]) -> None:
    """Unmounts what the kubelet and the runtime mounted (volumes, root filesystems, network namespace
    files), deepest first; a busy one is detached (lazy)."""
    prefixes = list(prefixes)
    for _ in range(5):
        points = mounts_under(prefixes)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    left = mounts_under(prefixes)
    if left:
        raise ToolError(f"mounts left under the node's directories: {', '.join(left)}")


# ------------------------------------------------------------------------------- fixed paths


def note_fixed_paths(record: dict[str, Any]) -> None:
    """Which of the fixed paths existed before the node (those are left; the rest is removed)."""
    record["existed"] = {str(path): path.exists() for path in fixed_paths()}
    record["shim_sockets"] = sorted(p.name for p in SHIM_SOCKETS.iterdir()) if SHIM_SOCKETS.is_dir() else []


def fixed_paths() -> list[Path]:
    """Paths the kubelet and containerd use whatever they are told, and the node's own short ones,
    outermost first."""
    return [
        Path("/var/lib/kubelet"),
        DEVICE_PLUGINS,
        Path("/run/containerd"),
        SHIM_SOCKETS,
        nodeconfig.SOCKETS_DIR,
        nodeconfig.STATE_DIR,
    ]


def remove_fixed_paths(record: dict[str, Any]) -> None:
    existed: dict[str, bool] = record.get("existed") or {}
    kept_sockets = set(record.get("shim_sockets") or [])
    if SHIM_SOCKETS.is_dir():
        for socket_file in SHIM_SOCKETS.iterdir():
            if socket_file.name not in kept_sockets:
                with contextlib.suppress(OSError):
                    socket_file.unlink()
    with contextlib.suppress(OSError):
        (DEVICE_PLUGINS / "kubelet.sock").unlink()
    for path in reversed(fixed_paths()):
        if existed.get(str(path)) is False and path.is_dir():
            _remove_tree(path)


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
    with contextlib.suppress(OSError):
        path.rmdir()


# ------------------------------------------------------------------------------------ snapshot


def snapshot() -> dict[str, Any]:
    """The machine-wide state the node touches, for comparing before `up` with after `down`."""
    listening = subprocess.run(["ss", "-Hltnu"], capture_output=True, text=True, check=False).stdout
    return {
        "sysctls": {name: (SYSCTL / name).read_text().strip() for name in KERNEL_TUNABLES},
        "ip_forward": (SYSCTL / "net/ipv4/ip_forward").read_text().strip(),
        "links": sorted(line.split(":")[1].strip() for line in run("ip", "-o", "link").splitlines()),
        "addresses": sorted(run("ip", "-o", "addr").splitlines()),
        "routes": sorted(run("ip", "route").splitlines()),
        "netns": sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else None,
        "iptables": _iptables_rules(),
        "mounts": sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()),
        "cgroups": sorted(
            str(path.relative_to(CGROUP_FS)) for h in hierarchies() for path in h.iterdir() if path.is_dir()
        ),
        "fixed_paths": {str(path): path.exists() for path in fixed_paths()},
        "listening": sorted(
            address for line in listening.splitlines() if not _loopback(address := line.split()[4])
        ),
    }


def _loopback(address: str) -> bool:
    """Whether a listening address (ss's `host:port`) is on loopback: the control planes, operators and
    tests of other clusters on the machine listen there, and start and stop beside the node; the
    node's own processes listen in its network namespace, which ss here does not see."""
    host = address.rpartition(":")[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1")


def _iptables_rules() -> list[str]:
    rules: list[str] = []
    for command in ("iptables-save", "ip6tables-save"):
        result = subprocess.run([command], capture_output=True, text=True, check=False)
        # Chains without their packet counters, rules as they are.
        rules += [line.split()[0] if line.startswith(":") else line for line in result.stdout.splitlines()]
        rules = [line for line in rules if not line.startswith("#")]
    return sorted(rules)
