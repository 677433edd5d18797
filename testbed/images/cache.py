"""The image cache: one directory per image and key, filled under a lock, renamed into place when done.

Why: the same conventions as hack/kube-bins.sh's binaries, so that a cached image costs nothing and a
half-built one never looks built. Under `~/.cache/trainingjob-operator/images/` (TJ_CACHE_DIR or
XDG_CACHE_HOME move it), `<name>/<key>/` holds `image.tar` (the archive) and `IMAGE.json` (name, key,
references, config digest, size, build time, the key's input lines), written last. A build takes
`<name>/.lock` (a second build of the same image waits, then finds it built), works in
`<name>/.build-XXXXXX/` and renames it to `<key>/`; on failure the temporary directory is removed.
`<name>/build.log` is the last build's log. Builds of other keys are pruned down to the most
recently used few (a trainer image is gigabytes).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.images.steps import remove_tree

ARCHIVE: Final = "image.tar"
METADATA: Final = "IMAGE.json"
KEEP_BUILDS: Final = 2


def cache_root() -> Path:
    """The images' cache directory (TJ_CACHE_DIR, as for hack/kube-bins.sh)."""
    base = os.environ.get("TJ_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainingjob-operator"
    )
    return Path(base) / "images"


@dataclass(frozen=True)
class Image:
    """An image for the real node. `archive` is what `ctr -n k8s.io images import` takes (it exists
    once `built`); `config_digest` is its image ID, as the CRI reports it."""

    name: str
    key: str
    references: tuple[str, ...]
    archive: Path
    built: bool
    config_digest: str = ""
    size: int = 0
    build_seconds: float = 0.0


def build_dir(name: str, key: str) -> Path:
    return cache_root() / name / key


def cached(name: str, key: str, references: tuple[str, ...]) -> Image:
    """The image as the cache has it: built (with its metadata) or not."""
    directory = build_dir(name, key)
    try:
        metadata = json.loads((directory / METADATA).read_text())
    except (OSError, ValueError):
        return Image(name, key, references, directory / ARCHIVE, built=False)
    return Image(
        name,
        key,
        tuple(metadata["references"]),
        directory / ARCHIVE,
        built=True,
        config_digest=str(metadata["config_digest"]),
        size=int(metadata["size"]),
        build_seconds=float(metadata["build_seconds"]),
    )


@contextmanager
def locked(name: str, on_wait: Callable[[], None]) -> Iterator[None]:
    """Holds `<name>/.lock`, calling `on_wait` first if another process holds it."""
    root = cache_root() / name
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_into_cache(
    name: str,
    key: str,
    references: tuple[str, ...],
    key_lines: list[str],
    fill: Callable[[Path], str],
) -> Image:
    """Runs `fill(tmp)` (it writes `tmp/image.tar` and returns the config digest) in a temporary
    directory, writes IMAGE.json and renames the directory to the key's; the caller holds the lock."""
    root = cache_root() / name
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    tmp.chmod(0o755)
    try:
        config_digest = fill(tmp)
        metadata: dict[str, Any] = {
            "name": name,
            "key": key,
            "references": list(references),
            "config_digest": config_digest,
            "size": (tmp / ARCHIVE).stat().st_size,
            "build_seconds": round(time.monotonic() - started, 1),
            "inputs": key_lines,
        }
        for leftover in tmp.iterdir():
            if leftover.name != ARCHIVE:
                remove_tree(leftover)
        (tmp / METADATA).write_text(json.dumps(metadata, indent=1) + "\n")
        tmp.rename(build_dir(name, key))
    finally:
        remove_tree(tmp)
    return cached(name, key, references)


def mark_used(image: Image) -> None:
    """Records a use (the metadata's mtime), which pruning goes by."""
    os.utime(image.archive.parent / METADATA)


def prune(name: str, keep: str) -> list[Path]:
    """Removes builds of `name` other than `keep` beyond the most recently used KEEP_BUILDS - 1, and
    temporary directories left by builds that were killed (no process holds the lock now: the
    caller does). Returns what it removed."""
    root = cache_root() / name
    others = sorted(
        (path for path in root.iterdir() if (path / METADATA).is_file() and path.name != keep),
        key=lambda path: (path / METADATA).stat().st_mtime,
        reverse=True,
    )
    removed = others[KEEP_BUILDS - 1 :] + [path for path in root.glob(".build-*") if path.is_dir()]
    for path in removed:
        remove_tree(path)
    return removed
