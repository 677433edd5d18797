"""testbed/images/trainer_mpi.py's layer of differences: what a root filesystem adds to or changes in
the base image's layer, staged with owners and modes, and the user the MPI pods run as."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

from testbed.images import trainer_mpi


def base_layer(path: Path, files: dict[str, bytes], links: dict[str, str]) -> Path:
    """A gzip'd tar like a base layer, in an archive member named `layer.tar.gz` of `path`."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    with tarfile.open(path, "w") as archive:
        info = tarfile.TarInfo("layer.tar.gz")
        info.size = len(buffer.getvalue())
        archive.addfile(info, io.BytesIO(buffer.getvalue()))
    return path


def test_only_what_is_new_or_changed_goes_into_the_layer(tmp_path: Path) -> None:
    archive = base_layer(
        tmp_path / "base.tar",
        {"etc/passwd": b"root:x:0:0::/root:/bin/sh\n", "usr/bin/python3": b"python"},
        {"usr/bin/python": "python3"},
    )
    before = trainer_mpi.base_entries(archive, "layer.tar.gz")
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "etc/passwd").write_bytes(b"root:x:0:0::/root:/bin/sh\n")
    (rootfs / "usr/bin/python3").write_bytes(b"python")
    os.symlink("python3", rootfs / "usr/bin/python")
    (rootfs / "usr/bin/mpirun").write_bytes(b"mpirun")
    trainer_mpi.add_user(rootfs)
    found = trainer_mpi.changed(rootfs, before)
    assert found == ["etc/group", "etc/passwd", "home/mpi/.keep", "usr/bin/mpirun"]
    assert "mpi:x:1000:1000:MPI jobs:/home/mpi:/bin/sh" in (rootfs / "etc/passwd").read_text()

    staged = tmp_path / "layer"
    trainer_mpi.stage(rootfs, found, staged)
    assert (staged / "usr/bin/mpirun").read_bytes() == b"mpirun"
    assert not (staged / "usr/bin/python3").exists()
    home = (staged / "home/mpi").stat()
    assert (home.st_uid, home.st_gid) == (1000, 1000)
