"""Image archives in the `docker save` format, written and read with the standard library.

Why this format: `ctr -n k8s.io images import` reads both this and an OCI layout archive, but only a
docker archive's names (manifest.json's RepoTags) are normalized on import (`python:3.11-slim` is
filed under Docker's default domain and `library/`, where the CRI plugin looks for a pod's image); an
OCI archive's names are taken as they are. So every image is one tar: its layers (gzip blobs), its
config (`<digest>.json`) and manifest.json, written last. Layers are streamed straight into the
archive: a member's header is written once its size is known (GNU headers are always one block for
the short names used here, whatever the size).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, Final

from testbed.images.layers import HashingSink, LayerDigests, LayerWriter

BLOCK: Final = 512
MACHINE_ARCHITECTURES: Final = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def architecture() -> str:
    """This machine's architecture as an image config names it."""
    machine = platform.machine()
    return MACHINE_ARCHITECTURES.get(machine, machine)


@dataclass(frozen=True)
class RuntimeConfig:
    """What a container starts with: the image config's `config` object."""

    env: tuple[str, ...]
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    working_dir: str = ""

    def as_json(self) -> dict[str, Any]:
        config: dict[str, Any] = {"Env": list(self.env)}
        if self.entrypoint:
            config["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            config["Cmd"] = list(self.cmd)
        if self.user:
            config["User"] = self.user
        if self.working_dir:
            config["WorkingDir"] = self.working_dir
        return config


class ArchiveWriter:
    """Writes an image archive to `path`: layers first, then `finish(config)`. `on_progress` gets the
    bytes written so far of the layer being written (uncompressed for a new one)."""

    def __init__(
        self, path: Path, references: tuple[str, ...], on_progress: Callable[[int], None] | None = None
    ) -> None:
        self.path = path
        self.references = references
        self.on_progress = on_progress
        self.layers: list[tuple[str, LayerDigests]] = []  # (member name, digests)
        self._out = path.open("wb")

    @contextmanager
    def _member(self, name_of: Callable[[], str]) -> Iterator[BinaryIO]:
        """A member whose content is written to the yielded stream; its name (`name_of()`, called
        once the content is written) and size go into the header written afterwards."""
        header_at = self._out.tell()
        self._out.write(b"\0" * BLOCK)
        start = self._out.tell()
        yield self._out
        size = self._out.tell() - start
        self._out.write(b"\0" * (-size % BLOCK))
        end = self._out.tell()
        info = tarfile.TarInfo(name_of())
        info.size = size
        info.mode = 0o644
        header = info.tobuf(format=tarfile.GNU_FORMAT)
        if len(header) != BLOCK:
            raise ValueError(f"archive member name too long: {info.name}")
        self._out.seek(header_at)
        self._out.write(header)
        self._out.seek(end)

    def _bytes(self, name: str, data: bytes) -> None:
        with self._member(lambda: name) as sink:
            sink.write(data)

    def add_layer(self, fill: Callable[[LayerWriter], None]) -> LayerDigests:
        """A new layer: `fill` adds its entries to the LayerWriter it gets."""
        digests: list[LayerDigests] = []
        with self._member(lambda: f"{digests[0].digest.removeprefix('sha256:')}.tar.gz") as sink:
            writer = LayerWriter(sink, self.on_progress)
            fill(writer)
            digests.append(writer.close())
        self.layers.append((f"{digests[0].digest.removeprefix('sha256:')}.tar.gz", digests[0]))
        return digests[0]

    def copy_layer(self, source: IO[bytes], diff_id: str) -> LayerDigests:
        """A layer blob (gzip) from elsewhere, e.g. the base image's archive or an OCI layout."""
        hashed: list[HashingSink] = []
        with self._member(lambda: f"{hashed[0].sha256.hexdigest()}.tar.gz") as sink:
            hashing = HashingSink(sink, self.on_progress)
            shutil.copyfileobj(source, hashing, 1 << 20)
            hashed.append(hashing)
        digests = LayerDigests(diff_id, f"sha256:{hashed[0].sha256.hexdigest()}", hashed[0].size)
        self.layers.append((f"{hashed[0].sha256.hexdigest()}.tar.gz", digests))
        return digests

    def finish(self, config: dict[str, Any]) -> str:
        """Writes the config (whose rootfs must list the layers' diff IDs in order) and manifest.json,
        closes the file and returns the config's digest (the image ID containerd shows)."""
        diff_ids = [digests.diff_id for _, digests in self.layers]
        if config.get("rootfs", {}).get("diff_ids") != diff_ids:
            raise ValueError("the image config's rootfs.diff_ids do not match the archive's layers")
        data = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_digest = hashlib.sha256(data).hexdigest()
        self._bytes(f"{config_digest}.json", data)
        manifest = [
            {
                "Config": f"{config_digest}.json",
                "RepoTags": list(self.references),
                "Layers": [name for name, _ in self.layers],
            }
        ]
        self._bytes("manifest.json", json.dumps(manifest, indent=1).encode())
        self._out.write(b"\0" * (2 * BLOCK))
        self._out.close()
        return f"sha256:{config_digest}"

    def abandon(self) -> None:
        self._out.close()


def image_config(
    runtime: RuntimeConfig, diff_ids: list[str], history: list[dict[str, Any]], created: str
) -> dict[str, Any]:
    """An image config (OCI, which Docker's is a superset of) for this machine's platform."""
    return {
        "architecture": architecture(),
        "os": "linux",
        "created": created,
        "config": runtime.as_json(),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }


# ------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class ArchiveContents:
    """What an archive holds: its references, config (and digest) and layer members in order."""

    references: tuple[str, ...]
    config: dict[str, Any]
    config_digest: str
    layer_members: tuple[str, ...]


def read_archive(path: Path) -> ArchiveContents:
    """The manifest and config of an image archive written by ArchiveWriter (one image)."""
    with tarfile.open(path, "r:") as archive:
        manifest_file = archive.extractfile("manifest.json")
        if manifest_file is None:
            raise ValueError(f"{path}: no manifest.json")
        (manifest,) = json.load(manifest_file)
        config_file = archive.extractfile(manifest["Config"])
        if config_file is None:
            raise ValueError(f"{path}: no config {manifest['Config']}")
        data = config_file.read()
    return ArchiveContents(
        references=tuple(manifest["RepoTags"]),
        config=json.loads(data),
        config_digest=f"sha256:{hashlib.sha256(data).hexdigest()}",
        layer_members=tuple(manifest["Layers"]),
    )


@contextmanager
def open_member(path: Path, name: str) -> Iterator[IO[bytes]]:
    """One member of an archive (e.g. a layer blob) as a readable stream."""
    with tarfile.open(path, "r:") as archive:
        member = archive.extractfile(name)
        if member is None:
            raise ValueError(f"{path}: no member {name}")
        yield member
