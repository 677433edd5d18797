"""A local cluster by its directory, as tests and the harness drive it: up (with optional components),
down, whether it runs, one component restarted, stopped or started, its admin kubectl, and a user of
its CA.

Why one handle: the session's cluster (`.dev/`, moved by TJ_DEV_DIR), a throwaway one for a test that
changes cluster-wide objects, and the harness's own (`.dev/bench`, `.dev/chaos`, `.dev/soak`) are all
driven the same way, through hack/dev-cluster.sh with TJ_DEV_DIR set, so each gets the script's lock,
its progress lines and its clean-up. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.cluster.kubectl import Kubectl
from testbed.cluster.pki import issue, kubeconfig_text
from testbed.common import DEV, REPO, ToolError, tail

SCRIPT: Final = REPO / "hack" / "dev-cluster.sh"


@dataclass(frozen=True)
class Cluster:
    """The local cluster whose state lives in `dev_dir` (its kubeconfig, logs and run directory)."""

    dev_dir: Path

    @classmethod
    def default(cls) -> Cluster:
        """The cluster of `.dev/`, or of TJ_DEV_DIR when it is set: the test session's."""
        return cls(DEV)

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (a client certificate in `system:masters`)."""
        return self.dev_dir / "kubeconfig"

    @property
    def kubectl(self) -> Kubectl:
        """The admin kubectl: the kubectl built with the control plane, with the admin's kubeconfig."""
        return Kubectl.from_dev_dir(self.dev_dir)

    @property
    def pki(self) -> Path:
        """The cluster's CA and certificates (new for every `up`, gone after `down`)."""
        return self.dev_dir / "run" / "pki"

    def state(self) -> dict[str, Any]:
        """What the script recorded: each process (pid and kernel start time), ports, versions."""
        state = json.loads((self.dev_dir / "run" / "state.json").read_text())
        assert isinstance(state, dict)
        return state

    def script(
        self, *args: str, check: bool = True, quiet: bool = False, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        """hack/dev-cluster.sh with these arguments for this cluster; its progress lines go to the
        caller's output unless `quiet` (then they are kept, and a failure's message ends with them)."""
        env = dict(os.environ, TJ_DEV_DIR=str(self.dev_dir))
        result = subprocess.run(
            [str(SCRIPT), *args], env=env, text=True, capture_output=quiet, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            kept = [*(result.stdout or "").splitlines()[-15:], *(result.stderr or "").splitlines()[-15:]]
            what = f"hack/dev-cluster.sh {' '.join(args)} failed (exit {result.returncode})"
            raise ToolError("\n".join([what, *kept]))
        return result

    def running(self) -> bool:
        """Whether the cluster runs, every component healthy (`status` exits 0)."""
        return self.script("status", check=False, quiet=True).returncode == 0

    def up(
        self,
        *components: str,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        images: tuple[str, ...] = (),
    ) -> None:
        """Starts the cluster (a no-op when it runs) with these optional components (kueue,
        coscheduling, real-node, network-policies), each built the first time; also adds them to a
        running cluster, or puts back what a test took away of them (their CRDs). `images`: the real
        node's images to import (`--images`; built first unless cached), else TJ_NODE_IMAGES's."""
        args = ["up"]
        if components:
            args += ["--with", ",".join(components)]
        if images:
            args += ["--images", ",".join(images)]
        if nodes is not None:
            args += ["--nodes", str(nodes)]
        if gpus_per_node is not None:
            args += ["--gpus-per-node", str(gpus_per_node)]
        self.script(*args)

    def down(self) -> None:
        """Stops every process of the cluster (the real node drained, the machine restored); a no-op
        when nothing runs."""
        self.script("down", check=False)

    def restart(self, component: str) -> None:
        """Restarts one component with the same flags and port (an API server restart also restarts
        the controller manager and the schedulers)."""
        self.script("restart", component)

    def stop(self, component: str) -> None:
        """Takes one component down on purpose (an outage as long as the caller needs)."""
        self.script("stop", component)

    def start(self, component: str) -> None:
        """Brings a component stopped on purpose back, and waits until it serves."""
        self.script("start", component)

    def user_kubeconfig(self, directory: Path, name: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for the user `name` in `groups`: a client certificate signed by the cluster's
        CA, made in `directory` (the CA's key is copied there only while it signs)."""
        pki = directory / f"pki-{name}"
        pki.mkdir(parents=True)
        for file in ("ca.crt", "ca.key"):
            shutil.copy(self.pki / file, pki / file)
        subject = "".join(f"/O={group}" for group in groups) + f"/CN={name}"
        issue(pki, name, subject, "extendedKeyUsage=clientAuth")
        (pki / "ca.key").unlink()
        server = json.loads(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        kubeconfig = directory / f"{name}.kubeconfig"
        kubeconfig.write_text(kubeconfig_text(server, pki, user=name))
        return kubeconfig

    def log(self, component: str, lines: int = 15) -> str:
        """The last lines of a component's log (`.dev/logs/<component>.log`)."""
        return tail(self.dev_dir / "logs" / f"{component}.log", lines)


@contextmanager
def throwaway_cluster(dev_dir: Path, *, nodes: int = 1) -> Iterator[Kubectl]:
    """A control plane of its own in `dev_dir`, stopped when the block ends; its admin kubectl.

    For tests that install and remove cluster-wide objects (a ClusterRole, the CRD) which the other
    tests of the session share on the session's cluster.
    """
    cluster = Cluster(dev_dir)
    cluster.script("up", "--nodes", str(nodes), quiet=True, timeout=600)
    try:
        yield cluster.kubectl
    finally:
        cluster.script("down", check=False, quiet=True, timeout=120)
