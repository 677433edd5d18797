"""The operator image's lock of runtime dependencies (requirements/runtime.txt): written by uv, checked
against setup.cfg.

Why: the Dockerfile installs the operator's dependencies from this file with `pip install
--require-hashes --only-binary=:all:`, so an image gets exactly the versions and the very files that
were locked, whatever the index serves that day; the package itself then goes in with --no-deps. The
lock is generated, never edited by hand: `make lock` has uv resolve setup.cfg's install_requires for
the image's Python (3.11) on Linux x86_64 and on arm64 (glibc 2.36, Debian bookworm's, the base
image's), every distribution of each pinned version with its sha256, and fails when the two platforms
would need different pins (one file serves both) or when a pin has no wheel for one of them (pip
downloads each platform's wheels against the lock's hashes, as the image installs: wheels only). An
existing lock's pins are kept where they still satisfy setup.cfg (`make lock LOCK_UPGRADE=1` moves
every pin to the newest allowed). `check` (CI runs it through tests/unit/test_lockfile.py) says in one
line, without the network, when setup.cfg's requirements and the lock have drifted apart.

    python -m image.lockfile write [--upgrade]    # make lock
    python -m image.lockfile check                # exit 1 and one line when the lock does not match

Runs with the test virtualenv's Python (`packaging` for the requirement syntax; uv from the dev extra).
"""

from __future__ import annotations

import argparse
import configparser
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testbed.common import REPO, ToolError

LOCK: Final = "requirements/runtime.txt"
REGENERATE: Final = "make lock"
PYTHON_VERSION: Final = "3.11"
# The image's platforms: Debian bookworm's glibc is 2.36.
PLATFORMS: Final = ("x86_64-manylinux_2_36", "aarch64-manylinux_2_36")
# The environment the requirements' markers are evaluated in: the image's.
IMAGE_ENVIRONMENT: Final = {
    "python_version": PYTHON_VERSION,
    "python_full_version": f"{PYTHON_VERSION}.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
_PIN: Final = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH: Final = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    """One locked distribution: its version, its files' hashes, and what asked for it (uv's `# via`)."""

    name: str
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]


def parse_lock(text: str) -> dict[str, Pin]:
    """A requirements file as uv writes it, by canonical name."""
    pins: dict[str, Pin] = {}
    current: tuple[str, str] | None = None
    hashes: list[str] = []
    via: list[str] = []

    def close() -> None:
        if current is not None:
            pins[canonicalize_name(current[0])] = Pin(current[0], current[1], tuple(hashes), tuple(via))

    for raw in text.splitlines():
        line = raw.strip()
        pin = _PIN.match(line)
        if pin:
            close()
            current, hashes, via = (pin.group(1), pin.group(2)), [], []
        hashes += _HASH.findall(line)
        comment = line.removeprefix("#").strip()
        if line.startswith("#") and current is not None and comment != "via":
            via.append(comment.removeprefix("via ").strip())
    close()
    return pins


def install_requires(setup_cfg: str) -> list[Requirement]:
    """setup.cfg's [options] install_requires, comments left out."""
    parser = configparser.ConfigParser()
    parser.read_string(setup_cfg)
    lines = parser["options"]["install_requires"].splitlines()
    return [Requirement(line.split("#", 1)[0].strip()) for line in lines if line.split("#", 1)[0].strip()]


def project_name(setup_cfg: str) -> str:
    parser = configparser.ConfigParser()
    parser.read_string(setup_cfg)
    return parser["metadata"]["name"]


def drift(setup_cfg: str, lock: str) -> str | None:
    """None when the lock was made from setup.cfg's requirements as they are; otherwise one line
    saying what differs and what to run."""
    pins = parse_lock(lock)
    asked_by_setup = f"{project_name(setup_cfg)} (setup.cfg)"
    fix = f"run `{REGENERATE}`"
    required: set[str] = set()
    for requirement in install_requires(setup_cfg):
        if requirement.marker is not None and not requirement.marker.evaluate(IMAGE_ENVIRONMENT):
            continue
        name = canonicalize_name(requirement.name)
        required.add(name)
        pin = pins.get(name)
        if pin is None:
            return f"{LOCK} has no pin for setup.cfg's {requirement}: {fix}"
        if not requirement.specifier.contains(pin.version, prereleases=True):
            return f"{LOCK} pins {pin.name}=={pin.version}, which setup.cfg's {requirement} refuses: {fix}"
        if asked_by_setup not in pin.via:
            return f"{LOCK} was not locked from setup.cfg's {requirement}: {fix}"
    for locked, pin in sorted(pins.items()):
        if asked_by_setup in pin.via and locked not in required:
            return f"{LOCK} still locks {pin.name} for setup.cfg, which no longer requires it: {fix}"
        if not pin.hashes:
            return f"{LOCK} pins {pin.name}=={pin.version} without a hash: {fix}"
    return None


# ---------------------------------------------------------------------------------------- writing


def uv() -> str:
    candidates = [Path(sys.executable).parent / "uv", shutil.which("uv")]
    found = next((str(path) for path in candidates if path and Path(path).exists()), None)
    if found is None:
        raise ToolError("uv not found: it comes with the dev extra (pip install -e '.[dev]')")
    return found


def compile_lock(output: Path, platform: str, *, upgrade: bool) -> None:
    """`uv pip compile` of setup.cfg for one platform into `output` (whose pins it keeps if it exists)."""
    command = [
        uv(),
        "pip",
        "compile",
        "setup.cfg",
        f"--python-version={PYTHON_VERSION}",
        f"--python-platform={platform}",
        "--generate-hashes",
        f"--custom-compile-command={REGENERATE}",
        f"--output-file={output}",
        "--quiet",
        *(["--upgrade"] if upgrade else []),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolError(f"uv pip compile for {platform} failed: {result.stderr.strip()}")


def manylinux_tags(platform: str) -> list[str]:
    """pip's --platform values for a uv platform such as `aarch64-manylinux_2_36`: every manylinux tag
    of that architecture up to that glibc (pip does not widen a --platform by itself)."""
    architecture, _, tag = platform.partition("-")
    newest = int(tag.rsplit("_", 1)[1])
    return ["manylinux2014_" + architecture] + [
        f"manylinux_2_{minor}_{architecture}" for minor in range(17, newest + 1)
    ]


def check_wheels(lock: Path, platform: str) -> None:
    """Downloads a wheel of every pin for `platform` with pip --require-hashes (as the Dockerfile
    installs: wheels only), so a lock that would need a build from source there is refused now."""
    platforms = [flag for tag in manylinux_tags(platform) for flag in ("--platform", tag)]
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"),
            *platforms,
            *(f"--python-version={PYTHON_VERSION}", "--implementation=cp", "--require-hashes"),
            *("--requirement", str(lock), "--dest", scratch),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ToolError(f"the lock has no wheel for {platform} of every pin: {last}")


def write(*, upgrade: bool) -> Path:
    """Regenerates the lock for the first platform, then checks that the others resolve the same and
    that every pin has a wheel, whose hash the lock holds, on each platform."""
    lock = REPO / LOCK
    lock.parent.mkdir(exist_ok=True)
    first, *others = PLATFORMS
    compile_lock(lock, first, upgrade=upgrade)
    with tempfile.TemporaryDirectory() as scratch:
        for platform in others:
            other = Path(scratch) / "lock.txt"
            shutil.copy(lock, other)
            compile_lock(other, platform, upgrade=False)
            if other.read_text() != lock.read_text():
                raise ToolError(
                    f"{platform} resolves setup.cfg to other pins than {first}: one lock cannot serve both"
                )
    for platform in PLATFORMS:
        check_wheels(lock, platform)
    return lock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m image.lockfile", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write_parser = commands.add_parser("write", help=f"regenerate {LOCK} with uv")
    write_parser.add_argument("--upgrade", action="store_true", help="move every pin to the newest allowed")
    check_parser = commands.add_parser("check", help=f"whether {LOCK} matches setup.cfg (no network)")
    check_parser.add_argument("--setup-cfg", type=Path, default=REPO / "setup.cfg")
    check_parser.add_argument("--lock", type=Path, default=REPO / LOCK)
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "write":
            print(f"wrote {write(upgrade=arguments.upgrade).relative_to(REPO)}")
            return 0
        problem = drift(arguments.setup_cfg.read_text(), arguments.lock.read_text())
    except ToolError as error:
        print(f"lock: {error}", file=sys.stderr)
        return 1
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
