"""The Go-built binaries from Python: the control plane's directory, and optional components by name.

Why: hack/kube-bins.sh owns building and caching (see hack/README.md); the dev cluster and the tests
only need "the directory of the control plane" or "the path of helm", built on first use. Its
progress lines go to this process's stderr as they come (a cold build takes minutes), and a failed
build is one ToolError naming the component; the script has printed the end of its log already.

    from hack.kube_bins import component_binary
    helm = component_binary("helm")   # builds helm once, then returns the cached binary at once
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from hack.common import REPO, ToolError

SCRIPT: Final = REPO / "hack" / "kube-bins.sh"


def cache_base() -> Path:
    """The project's cache directory under the home directory (as hack/kube-bins.sh computes it)."""
    explicit = os.environ.get("TJ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainingjob-operator"


def ensure(component: str | None = None) -> Path:
    """The cache directory of the control plane (no `component`) or of one optional component,
    building it first unless it is cached."""
    what = component or "the control plane"
    command = [str(SCRIPT), "ensure", *([component] if component else [])]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ToolError(f"building {what} failed (see the messages above)")
    return Path(result.stdout.strip().splitlines()[-1])


def component_binary(component: str) -> Path:
    """The path of an optional component's binary (e.g. "helm"), built on first use. Each component's
    cache directory holds its binary under the component's name."""
    return ensure(component) / component
