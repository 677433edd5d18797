"""The trainer image's closure script in a bare virtualenv: no `packaging` installed (as in `make
demo`'s), nothing imported at start-up beyond the interpreter's own.

Why: make demo's virtualenv has the runtime dependencies and torch, none of which needs `packaging`,
so the script falls back to pip's vendored copy; and the script runs isolated (-I), or its folder's
operator.py would shadow the standard library's. Either way the trainer image's key could not be
computed there, and the demo could not start its real node.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testbed.images.trainer import installed_closure


def test_the_closure_of_an_installed_distribution_without_packaging_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    has_packaging = subprocess.run([str(python), "-c", "import packaging"], capture_output=True, check=False)
    assert has_packaging.returncode != 0, "a fresh virtualenv has packaging installed: nothing is tested"
    closure = installed_closure(venv, ("pip",))
    assert [distribution.name for distribution in closure.distributions] == ["pip"]
    assert closure.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
