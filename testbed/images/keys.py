"""Cache keys: a short hash over everything an image is built from.

Why: an image is rebuilt when, and only when, one of its inputs changes (a file the Dockerfile copies,
a package version, the base image, the references it is filed under, the recipe). Each recipe lists
its inputs into a `KeyInputs`, line by line (`label=value`, a file as its path, mode and content
digest); the key is the first 16 hex digits of the SHA-256 of those lines, as hack/kube-bins.sh's
keys are. The lines are kept with the build (IMAGE.json), so a changed key can be explained.
"""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

KEY_LENGTH: Final = 16


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content (a symlink: of its target's text)."""
    if path.is_symlink():
        return hashlib.sha256(str(path.readlink()).encode()).hexdigest()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class KeyInputs:
    """The inputs of one image, in the order a recipe lists them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def text(self, label: str, value: str) -> None:
        """A value (a version, a list of packages, a reference) under a label."""
        self.lines.append(f"{label}={value}")

    def file(self, label: str, path: Path) -> None:
        """A file: whether it is executable, and its content."""
        executable = bool(path.lstat().st_mode & stat.S_IXUSR)
        self.lines.append(f"{label}={'x' if executable else '-'} {file_digest(path)}")

    def files(self, root: Path, relative_paths: Iterable[str]) -> None:
        """Files under `root`, each under its relative path."""
        for relative in relative_paths:
            self.file(f"file:{relative}", root / relative)

    def key(self) -> str:
        return hashlib.sha256("\n".join(self.lines).encode()).hexdigest()[:KEY_LENGTH]
