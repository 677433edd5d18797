"""The MLflow tracking server's image: the base image plus one layer with MLflow installed by pip.

Why: the dev cluster's MLflow server (`hack/dev-cluster.sh up --with mlflow`, testbed/addons/mlflow.py)
runs on the real node, which pulls nothing from the internet, so its image is built here like the
trainer images. Unlike them it is not copied from the test virtualenv: the server's dependencies
(Flask, SQLAlchemy, graphene, pandas, pyarrow, ...) belong to no test and one of them (graphene) wants
a python-dateutil older than the one the operator's Kubernetes client requires, so they cannot share
an environment. pip installs `mlflow==MLFLOW_VERSION` (pinned in hack/versions.env) with its
dependencies, binary wheels only, into the layer's /usr/local/lib/python3.11/dist-packages, where the
base image's Debian Python finds them; the server runs as `python3 -m mlflow server`.

The key covers the pin, the Python that runs pip and the base image's key: the dependencies' versions
are those PyPI resolved at the cold build, and stay as built while the key holds.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from typing import Final

from testbed.common import REPO, ToolError
from testbed.images.base import PYTHON_VERSION
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe

NAME: Final = "mlflow"
VERSIONS_FILE: Final = REPO / "hack" / "versions.env"
DIST_PACKAGES: Final = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"


def version(context: Context | None = None) -> str:
    """MLFLOW_VERSION as hack/versions.env pins it (its default; the environment does not move it:
    the image's key must say what it holds)."""
    path = (context.repo if context else REPO) / "hack" / "versions.env"
    match = re.search(r"^MLFLOW_VERSION=\$\{MLFLOW_VERSION:-([^}]+)\}", path.read_text(), re.MULTILINE)
    if match is None:
        raise ToolError(f"MLFLOW_VERSION is not pinned in {path}")
    return match.group(1)


def reference(context: Context | None = None) -> str:
    """The server image's reference, as the dev cluster's Deployment names it."""
    return f"trainingjob-dev/mlflow:{version(context)}"


def references(context: Context) -> tuple[str, ...]:
    return (reference(context),)


def _pip_python(context: Context) -> str:
    """The test virtualenv's Python runs pip: its Python version is the base image's (checked), so
    pip picks the wheels the image's interpreter loads."""
    return str(context.trainer_venv() / "bin" / "python")


def _python_version(python: str) -> str:
    command = [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.text("requirement", f"mlflow=={version(context)}")
    into.text("python", _python_version(_pip_python(context)))


def build(build: Build) -> dict[str, object]:
    python = _pip_python(build.context)
    if _python_version(python) != PYTHON_VERSION:
        build.steps.fail(f"{python} is not Python {PYTHON_VERSION}, the base image's")
    root = build.work / "root"
    target = root / DIST_PACKAGES
    requirement = f"mlflow=={version(build.context)}"
    build.steps.run(
        f"pip install {requirement}",
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--only-binary=:all:",
            "--target",
            str(target),
            requirement,
        ],
    )
    base = build.copy_layers_of("base")
    layer = build.archive.add_layer(lambda writer: writer.add_tree(root))
    return build.config_on_top(base, [layer.diff_id], f"pip install {requirement}")


RECIPE: Final = Recipe(
    name=NAME,
    summary="the base image plus the MLflow tracking server from PyPI (dev cluster's `--with mlflow`)",
    revision=1,
    references=references,
    inputs=inputs,
    build=build,
    depends=("base",),
)
