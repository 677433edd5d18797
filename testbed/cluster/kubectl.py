"""The cluster's admin kubectl for tests, and waits with deadlines.

Why: tests talk to the local cluster the way users do, through the kubectl built with the control plane
(`.dev/bin/kubectl`), bound to one kubeconfig (the admin's, or one impersonating a user); and they wait
for conditions with deadlines (`wait_for`), never with fixed sleeps. Standard library only.

Usage::

    from testbed import Cluster, wait_for
    kubectl = Cluster.default().kubectl
    wait_for("job failed",
             lambda: kubectl.get_json("trainingjob", "job", "-n", "ns")["status"].get("state") == "Failed")
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.common import DEV

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline; the message says what was awaited and the last value."""


def wait_for(
    description: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Polls `probe` until it returns something truthy, and returns it; fails after `timeout` seconds.

    Tests wait for conditions with deadlines like this, never with fixed sleeps.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {description} (last: {last!r})")
        time.sleep(interval)


class KubectlError(Exception):
    def __init__(self, args: tuple[str, ...], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.command = args
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Kubectl:
    """The project's built kubectl bound to one kubeconfig (admin, or an impersonating one)."""

    binary: Path
    kubeconfig: Path
    extra: tuple[str, ...] = ()

    @classmethod
    def from_dev_cluster(cls) -> Kubectl:
        return cls.from_dev_dir(DEV)

    @classmethod
    def from_dev_dir(cls, dev_dir: Path) -> Kubectl:
        """The admin kubectl of the cluster in `dev_dir`."""
        return cls(dev_dir / "bin" / "kubectl", dev_dir / "kubeconfig")

    def as_user(self, user: str, groups: tuple[str, ...] = ()) -> Kubectl:
        extra = (*self.extra, f"--as={user}", *(f"--as-group={group}" for group in groups))
        return Kubectl(self.binary, self.kubeconfig, extra)

    def command(self) -> list[str]:
        """kubectl with this kubeconfig, for a process the test starts itself (`logs -f`, `port-forward`)."""
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", *self.extra]

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        command = [*self.command(), *args]
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(tuple(args), result.returncode, result.stderr)
        return result.stdout

    def attempt(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs kubectl and returns the whole result, for tests that expect a refusal."""
        command = [*self.command(), *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, check=False)

    def get_json(self, *args: str) -> dict[str, Any]:
        out = self.run("get", *args, "-o", "json")
        value = json.loads(out)
        assert isinstance(value, dict)
        return value

    def get_or_none(self, *args: str) -> dict[str, Any] | None:
        result = self.attempt("get", *args, "-o", "json")
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise KubectlError(tuple(args), result.returncode, result.stderr)
        value = json.loads(result.stdout)
        assert isinstance(value, dict)
        return value

    def apply(self, manifest: dict[str, Any] | str, *extra: str) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.run("apply", "-f", "-", *extra, stdin=text)

    def items(self, *args: str) -> list[dict[str, Any]]:
        items = self.get_json(*args).get("items", [])
        assert isinstance(items, list)
        return items
