"""Image layers: a tar of files, gzip-compressed, with the two digests an image needs.

Why: the images for the real node are root filesystems built here (debootstrap, busybox, a static
binary, Python distributions), not by a container engine, so their layers are written directly: a tar
stream (PAX, numeric owners only, since the machine's user names mean nothing in an image), through
gzip (level 1: the torch layer is gigabytes, and containerd unpacks gzip), into any binary sink. The
tar's SHA-256 is the layer's diff ID (the image config lists it); the compressed bytes' SHA-256 is its
blob digest. Nothing is held in memory but one file's buffer.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Protocol

# Directories whose contents a container runtime provides; the layer keeps them empty.
RUNTIME_DIRECTORIES: Final = ("dev", "proc", "sys")
COMPRESS_LEVEL: Final = 1


class Writable(Protocol):
    def write(self, data: memoryview, /) -> int: ...


class HashingSink(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through it to `target`."""

    def __init__(self, target: Writable, on_progress: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.on_progress = on_progress

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data)
        self.sha256.update(view)
        self.target.write(view)
        self.size += view.nbytes
        if self.on_progress is not None:
            self.on_progress(self.size)
        return view.nbytes


@dataclass(frozen=True)
class LayerDigests:
    """A written layer: `diff_id` (the tar's digest), `digest` and `size` of the compressed blob."""

    diff_id: str
    digest: str
    size: int


def _numeric_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uname = info.gname = ""
    return info


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    return _numeric_owner(info)


class LayerWriter:
    """Writes one layer into `sink`. Add entries, then `close()` for the digests. `on_progress` gets
    the number of bytes of tar written so far, at every write."""

    def __init__(self, sink: BinaryIO, on_progress: Callable[[int], None] | None = None) -> None:
        self._blob = HashingSink(sink)
        self._gzip = gzip.GzipFile(
            fileobj=self._blob,
            mode="wb",
            compresslevel=COMPRESS_LEVEL,
            mtime=0,
        )
        self._diff = HashingSink(self._gzip, on_progress)
        # A stream (mode "w|"): nothing is sought back; closed by close().
        self._tar = tarfile.open(fileobj=self._diff, mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self._directories: set[str] = set()
        self._mtime = int(time.time())  # of the entries made here (not copied from a file)

    def add_tree(self, root: Path) -> None:
        """Everything under `root` as the image's root filesystem, with owners, modes and hard links
        as they are; the runtime's directories (/dev, /proc, /sys) are kept empty."""
        for directory, subdirectories, files in os.walk(root):
            subdirectories.sort()
            relative = Path(directory).relative_to(root).as_posix()
            if relative in RUNTIME_DIRECTORIES:
                subdirectories.clear()
                continue
            for name in [*subdirectories, *sorted(files)]:
                path = Path(directory, name)
                arcname = path.relative_to(root).as_posix()
                self._tar.add(path, arcname, recursive=False, filter=_numeric_owner)
                if path.is_dir() and not path.is_symlink():
                    self._directories.add(arcname)

    def _made(self, arcname: str) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arcname)
        info.mtime = self._mtime
        return info

    def add_directory(self, arcname: str, mode: int = 0o755) -> None:
        """A directory owned by root, unless the layer has it already."""
        if arcname in self._directories:
            return
        info = self._made(arcname)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self._tar.addfile(info)
        self._directories.add(arcname)

    def _parents(self, arcname: str) -> None:
        parts = arcname.split("/")[:-1]
        for count in range(1, len(parts) + 1):
            self.add_directory("/".join(parts[:count]))

    def add_file(self, source: Path, arcname: str) -> None:
        """A file (or symlink) from the machine at `arcname`, owned by root, mode kept; its parent
        directories first."""
        self._parents(arcname)
        self._tar.add(source, arcname, recursive=False, filter=_root_owned)

    def add_bytes(self, arcname: str, data: bytes, mode: int = 0o644) -> None:
        """A file with the given content, owned by root."""
        self._parents(arcname)
        info = self._made(arcname)
        info.size = len(data)
        info.mode = mode
        self._tar.addfile(info, io.BytesIO(data))

    def add_symlink(self, arcname: str, target: str) -> None:
        self._parents(arcname)
        info = self._made(arcname)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        self._tar.addfile(info)

    def close(self) -> LayerDigests:
        self._tar.close()
        self._gzip.close()
        return LayerDigests(
            diff_id=f"sha256:{self._diff.sha256.hexdigest()}",
            digest=f"sha256:{self._blob.sha256.hexdigest()}",
            size=self._blob.size,
        )
