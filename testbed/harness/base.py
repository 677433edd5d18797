"""What the harness's programs share: their settings, a cluster of their own, and running to the end.

Why one base: `make bench` (with bench-peer and bench-status), `make chaos` and `make soak` each used to
carry its own copy of the same option parsing (a flag per setting whose default comes from a BENCH_*,
CHAOS_* or SOAK_* variable, and --dev-dir for the throwaway cluster) and of the same set-up (stop what an
earlier run left in that directory, start a fresh cluster, apply the CRD and wait until it is
Established, create the namespace; stop it all at the end, also after a failure or Ctrl-C). This is the
one copy: `HarnessParser`, `HarnessCluster` and `run_to_end`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from controller.resources import CRDS, NAMESPACES, from_kubeconfig
from controller.runtime.client import KubeClient
from controller.runtime.errors import AlreadyExists, KubeError
from controller.runtime.transport import DEFAULT_POOL_SIZE
from crd import contract
from testbed.cluster.handle import Cluster
from testbed.common import DEV, REPO, ToolError

# ------------------------------------------------------------------------------------------ settings


class HarnessParser(argparse.ArgumentParser):
    """A program's flags, each also read from an environment variable named after it and the program
    (`--round-timeout` of chaos: CHAOS_ROUND_TIMEOUT): the flag wins, the variable sets the default,
    so `make chaos CHAOS_JOBS=20` and `python -m testbed.harness.chaos --jobs 20` agree. Every program
    has `--dev-dir`, its throwaway cluster's directory (default `.dev/<program>`, under TJ_DEV_DIR)."""

    def __init__(self, program: str, prefix: str, description: str, *, dev_dir: str, epilog: str = ""):
        super().__init__(prog=f"python -m testbed.harness.{program}", description=description, epilog=epilog)
        self.prefix = prefix
        self.setting(
            "--dev-dir",
            Path,
            DEV / dev_dir,
            "the throwaway cluster's directory: any cluster there is stopped first",
        )

    def variable(self, flag: str) -> str:
        return f"{self.prefix}_{flag.lstrip('-').replace('-', '_').upper()}"

    def setting(
        self, flag: str, kind: Callable[[str], Any], default: Any, help: str = "", *, variable: str = ""
    ) -> None:
        """A flag of type `kind` whose default is $`variable` (by default named after the flag)."""
        variable = variable or self.variable(flag)
        text = os.environ.get(variable, "")
        try:
            value = kind(text) if text else default
        except ValueError:
            self.error(f"${variable}: {text!r} is not a valid {flag}")
        shown = DEV.name + str(default)[len(str(DEV)) :] if str(default).startswith(str(DEV)) else default
        note = f"${variable}, default {shown}"
        self.add_argument(flag, type=kind, default=value, help=f"{help} ({note})" if help else f"({note})")

    def switch(self, flag: str, help: str) -> None:
        """An on/off flag (`--profile`, `--no-profile`), on when its variable is set to anything but
        0 or false."""
        variable = self.variable(flag)
        on = os.environ.get(variable, "") not in ("", "0", "false")
        self.add_argument(
            flag, action=argparse.BooleanOptionalAction, default=on, help=f"{help} (${variable})"
        )


# ------------------------------------------------------------------------------------------ cluster


class HarnessCluster:
    """A program's own cluster in its directory: `start` stops whatever an earlier run left there and
    starts a fresh one, with the CRD Established and the program's namespace; `stop` stops it, and only
    if this run started it (a run refused by its options leaves a cluster it never started alone)."""

    def __init__(self, name: str, dev_dir: Path, say: Callable[[str], None]) -> None:
        self.name = name
        self.cluster = Cluster(dev_dir)
        self.say = say
        self.started = False
        self._client: KubeClient | None = None

    @property
    def dev_dir(self) -> Path:
        return self.cluster.dev_dir

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            raise ToolError(f"the {self.name} cluster is not up")
        return self._client

    def start(
        self,
        namespace: str | None = None,
        *,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        pool_size: int | None = None,
    ) -> KubeClient:
        """A fresh cluster (`nodes` kwok nodes of `gpus_per_node`, the script's defaults otherwise)
        and a client of it without a client-side rate limit."""
        self.stop_earlier()
        shape = f": {nodes} kwok nodes" if nodes else ""
        self.say(f"starting the {self.name} cluster in {self.dev_dir}{shape}")
        self.started = True
        self.cluster.up(nodes=nodes, gpus_per_node=gpus_per_node)
        pool = DEFAULT_POOL_SIZE if pool_size is None else pool_size
        self._client = from_kubeconfig(str(self.kubeconfig), None, qps=0, burst=0, pool_size=pool)
        install_crd(self._client)
        if namespace is not None:
            create_namespace(self._client, namespace)
        return self._client

    def stop_earlier(self) -> None:
        """Stops the cluster an earlier run left in the directory, if any: a cluster that held
        thousands of pods keeps its controllers busy for minutes, and nobody would measure on a
        machine it keeps loaded."""
        self.close_client()
        self.cluster.down()

    def restart(self, component: str) -> None:
        self.cluster.restart(component)

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def stop(self) -> None:
        self.close_client()
        if self.started:
            self.say(f"stopping the {self.name} cluster")
            self.cluster.down()


def install_crd(client: KubeClient, timeout: float = 60.0) -> None:
    """Server-side applies the CRD (the cluster installed it already; this is idempotent) and waits
    until it is Established."""
    for path in sorted((REPO / "crd").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                client.patch(
                    CRDS, None, doc["metadata"]["name"], doc, patch_type="apply", field_manager="bench"
                )
    wait_established(client, f"{contract.PLURAL}.{contract.GROUP}", timeout)


def wait_established(client: KubeClient, name: str, timeout: float = 60.0) -> None:
    """Waits until the CRD `name` is Established: its resource is served."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = client.get(CRDS, None, name)
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        time.sleep(0.5)
    raise ToolError(f"CRD {name} not Established after {timeout:.0f}s")


def create_namespace(client: KubeClient, namespace: str) -> None:
    with contextlib.suppress(AlreadyExists):
        client.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )


# ------------------------------------------------------------------------------------------- ending


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C does, so the clean-up runs."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_interrupts() -> None:
    """A second Ctrl-C must not cut the clean-up short; children inherit the ignore."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def run_to_end(run: Callable[[], int], down: Callable[[], None], say: Callable[[str], None]) -> int:
    """Runs a program to its end: `run`'s exit code; one line and exit code 2 for an error (a ToolError,
    a refused API request), 130 when interrupted (SIGTERM and SIGHUP count as Ctrl-C); `down` always,
    and a second Ctrl-C cannot cut it short."""
    with signals_as_interrupts():
        try:
            return run()
        except ToolError as error:
            say(f"error: {error}")
            return 2
        except KubeError as error:
            say(f"error: API request failed: {error}")
            return 2
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        finally:
            ignore_interrupts()
            down()
