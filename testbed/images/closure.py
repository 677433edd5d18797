"""The installed dependency closure of some distributions, as a virtualenv's interpreter sees it.

Why: the trainer images carry the framework exactly as the tests use it, so their packages are the
ones installed in the test virtualenv, not a fresh resolution. This file runs with that virtualenv's
Python (`<venv>/bin/python testbed/images/closure.py torch`): it starts from the named distributions,
follows each one's requirements whose environment markers hold there (with the extras asked for,
e.g. `cuda-toolkit[cublas,...]`), and prints one JSON object per distribution: name, version, its
site-packages directory, the SHA-256 of its RECORD's rows inside site-packages and the files
RECORD lists (relative to site-packages; console scripts appear as `../../../bin/<name>`). Left out
of the digest: the rows outside site-packages, as a console script's `#!` line names the
virtualenv's path, so its hash differs between two checkouts with the same packages (the image
rewrites that line anyway, and what the script runs is in entry_points.txt, which is inside); and
pip's notes of how the distribution was installed (INSTALL_RECORDS).
A required distribution that is not installed is an error. Markers are evaluated with
`packaging`: the installed one, else pip's vendored copy, which every virtualenv with pip has
(`make demo`'s has no `packaging` of its own).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    from packaging.requirements import Requirement
except ImportError:  # a virtualenv without packaging installed (make demo's): pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted(requirement: str, extras: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    """(name, its extras) if `requirement` applies here for a distribution installed with `extras`."""
    parsed = Requirement(requirement)
    if parsed.marker is not None:
        contexts = [{"extra": extra} for extra in sorted(extras)] or [{"extra": ""}]
        if not any(parsed.marker.evaluate(context) for context in contexts):
            return None
    return canonical(parsed.name), frozenset(parsed.extras)


def closure(
    roots: list[str], requires: Callable[[str], list[str]], installed: Callable[[str], bool]
) -> list[str]:
    """The canonical names of `roots` and everything they require here, transitively, in the order
    found; ValueError naming a required distribution that is not installed."""
    seen: dict[str, frozenset[str]] = {}
    queue = [(canonical(root), frozenset[str]()) for root in roots]
    while queue:
        name, extras = queue.pop(0)
        if name in seen and extras <= seen[name]:
            continue
        if not installed(name):
            raise ValueError(f"{name} is required but not installed")
        seen[name] = seen.get(name, frozenset()) | extras
        for requirement in requires(name):
            found = wanted(requirement, seen[name])
            if found is not None:
                queue.append(found)
    return list(seen)


# What pip writes of how a distribution was installed, not of what it holds: REQUESTED marks one
# asked for by name rather than pulled in by another, which differs between two virtualenvs with
# the same packages.
INSTALL_RECORDS = ("INSTALLER", "REQUESTED", "direct_url.json")


def record_digest(record: str) -> str:
    """SHA-256 of a RECORD's rows for the files inside site-packages that the distribution holds,
    whatever the virtualenv's path and however it came to be installed."""

    def kept(path: str) -> bool:
        directory, _, name = path.rpartition("/")
        installed_how = directory.endswith(".dist-info") and name in INSTALL_RECORDS
        return not path.startswith("../") and not installed_how

    rows = [row for row in csv.reader(io.StringIO(record)) if row and kept(row[0])]
    return hashlib.sha256("\n".join(",".join(row) for row in rows).encode()).hexdigest()


def describe(distribution: metadata.Distribution) -> dict[str, Any]:
    """What the image build needs to know of one installed distribution."""
    record = distribution.read_text("RECORD") or ""
    files = [row[0] for row in csv.reader(io.StringIO(record)) if row]
    site_packages = distribution.locate_file("")
    return {
        "name": distribution.metadata["Name"],
        "version": distribution.version,
        "site_packages": str(site_packages),
        "record_sha256": record_digest(record),
        "files": files,
    }


def installed_distributions() -> dict[str, Path]:
    """Every distribution on sys.path (the first of a name wins, as for imports): canonical name to
    its .dist-info directory, named `<name>-<version>.dist-info`, so no metadata is parsed here."""
    found: dict[str, Path] = {}
    for entry in sys.path:
        directory = Path(entry or ".")
        for info in sorted(directory.glob("*.dist-info")) if directory.is_dir() else []:
            found.setdefault(canonical(info.name.removesuffix(".dist-info").rsplit("-", 1)[0]), info)
    return found


def main(roots: list[str]) -> int:
    installed = installed_distributions()

    def requires(name: str) -> list[str]:
        return list(metadata.Distribution.at(installed[name]).requires or [])

    try:
        names = closure(roots, requires, lambda name: name in installed)
    except ValueError as error:
        print(f"closure of {' '.join(roots)}: {error}", file=sys.stderr)
        return 1
    distributions = [describe(metadata.Distribution.at(installed[name])) for name in names]
    print(
        json.dumps({"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "distributions": distributions})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
