"""The test session's local cluster, as the tests of the operator use it (the testbed's API, `testbed`,
does the work).

Why apart from the testbed: the session shares one cluster (`.dev/`, moved by TJ_DEV_DIR; conftest.py
starts it), and a few helpers only make sense for it: the repository's root, the session cluster's
directory, its script, and an optional component's API withdrawn for a block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed import Cluster, Kubectl, wait_for

REPO = Path(__file__).resolve().parent.parent
SESSION = Cluster.default()
DEV = SESSION.dev_dir


def dev_cluster(*args: str) -> None:
    """hack/dev-cluster.sh with these arguments for the session's cluster (its progress lines go to the
    test's output)."""
    SESSION.script(*args)


def require_optional(name: str) -> None:
    """Makes an optional component (kueue, coscheduling) run on the dev cluster: `up --with <name>`
    adds it (built the first time) or, when it runs, puts back any of its CRDs a test took away."""
    SESSION.up(name)


def api_served(kubectl: Kubectl, group_version: str, plurals: set[str]) -> bool:
    """Whether the API server's discovery lists every resource of `plurals` in `group_version`."""
    result = kubectl.attempt("get", "--raw", f"/apis/{group_version}")
    if result.returncode != 0:
        return False
    names = {entry.get("name") for entry in json.loads(result.stdout).get("resources", [])}
    return plurals <= names


@contextmanager
def optional_api_withdrawn(
    kubectl: Kubectl, component: str, crd: str, group_version: str, plurals: set[str], *, restart: bool
) -> Iterator[None]:
    """An optional component's API (`plurals` in `group_version`) not served in the block, as on a
    cluster without the component. When the session's cluster runs it, its CRD `crd` is deleted for
    the block and `up --with component` puts it back afterwards (`restart`: the component restarted
    too, so that its informers start afresh instead of sitting out their relist backoff)."""
    present = kubectl.get_or_none("crd", crd) is not None
    if present:
        kubectl.run("delete", "crd", crd, "--wait=true", "--timeout=60s")
    try:
        wait_for(f"{crd} not in discovery", lambda: not api_served(kubectl, group_version, plurals))
        yield
    finally:
        if present:
            require_optional(component)
            if restart:
                SESSION.restart(component)
