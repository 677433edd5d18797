"""The `trainer-mpi` image: the torch trainer plus Debian's OpenMPI, OpenSSH and mpi4py, for MPI jobs.

Why a recipe of its own: the other trainer images add Python distributions from the test virtualenv to
the base image; an MPI job also needs programs from Debian (mpirun and orted, sshd and ssh, and mpi4py
built against that OpenMPI), which pip cannot give. So this image is `trainer-torch`'s layers (the base
and torch) and one more: what `debootstrap` of the base's packages plus PACKAGES adds to or changes in
the base's root filesystem (the packages' files, dpkg's database, the linker cache), compared file by
file with the base layer. It also has the user the MPI pods run as (crd/contract.py NON_ROOT_USER,
`mpi`, home /home/mpi): OpenSSH refuses a user without an /etc/passwd entry. The SSH host keys
openssh-server's installation generates are left out (the operator gives each job its own key).

References: `trainingjob-trainer:mpi-<torch version>` and framework mpi's default image
(crd.contract.DEFAULT_IMAGES, Kubeflow's mpioperator/openmpi), which it stands in for on the real node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from crd.contract import DEFAULT_IMAGES, NON_ROOT_GROUP, NON_ROOT_USER
from testbed.images import apt_sources, base
from testbed.images.archive import open_member
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe
from testbed.images.steps import unmount_all
from testbed.images.trainer import installed_closure, tag_safe

NAME: Final = "trainer-mpi"
PACKAGES: Final = ("openmpi-bin", "openssh-server", "openssh-client", "python3-mpi4py")
USER: Final = "mpi"
HOME: Final = f"home/{USER}"
HOST_KEYS: Final = "etc/ssh/ssh_host_*"


def references(context: Context) -> tuple[str, ...]:
    """Named by the torch of the test virtualenv (as trainer-torch is), which it contains."""
    torch = installed_closure(context.trainer_venv(), ("torch",)).distributions[0]
    return (f"trainingjob-trainer:mpi-{tag_safe(torch.version)}", DEFAULT_IMAGES["mpi"])


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.text("suite", base.SUITE)
    into.text("packages", " ".join((*base.PACKAGES, *PACKAGES)))
    into.text("mirror", apt_sources.machine_mirror(base.SUITE, context.apt_dir))
    into.text("user", f"{USER} {NON_ROOT_USER}:{NON_ROOT_GROUP}")
    for certificate in base.ca_certificates(context):
        into.file(f"ca:{certificate.name}", certificate)


@dataclass(frozen=True)
class Entry:
    """A path of the base layer: a file's size and digest, or a symlink's target."""

    kind: str
    value: str


def base_entries(archive: Path, member: str) -> dict[str, Entry]:
    """The files and symlinks of the base image's layer, by path."""
    entries: dict[str, Entry] = {}
    with open_member(archive, member) as blob, tarfile.open(fileobj=blob, mode="r|gz") as layer:
        for info in layer:
            name = info.name.removeprefix("./")
            if info.issym():
                entries[name] = Entry("link", info.linkname)
            elif info.isfile():
                source = layer.extractfile(info)
                digest = hashlib.sha256(source.read() if source is not None else b"").hexdigest()
                entries[name] = Entry("file", f"{info.size}:{digest}")
    return entries


def _entry(path: Path) -> Entry | None:
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return Entry("link", os.readlink(path))
    if stat.S_ISREG(mode):
        return Entry("file", f"{path.stat().st_size}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return None


def changed(rootfs: Path, before: Mapping[str, Entry]) -> list[str]:
    """The files and symlinks of `rootfs` that the base layer does not have as they are."""
    found = []
    for directory, subdirectories, files in os.walk(rootfs):
        subdirectories.sort()
        for name in sorted([*files, *(d for d in subdirectories if Path(directory, d).is_symlink())]):
            path = Path(directory, name)
            relative = path.relative_to(rootfs).as_posix()
            entry = _entry(path)
            if entry is not None and before.get(relative) != entry:
                found.append(relative)
    return found


def stage(rootfs: Path, paths: list[str], into: Path) -> None:
    """A tree of `paths` of `rootfs`, with their directories, owners and modes as they are there."""
    into.mkdir()
    shutil.copystat(rootfs, into)
    for relative in paths:
        parts = Path(relative).parts
        for count in range(1, len(parts)):
            directory = Path(*parts[:count])
            target = into / directory
            if not target.exists():
                source = rootfs / directory
                target.mkdir()
                shutil.copystat(source, target)
                os.chown(target, source.lstat().st_uid, source.lstat().st_gid)
        source, target = rootfs / relative, into / relative
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
        os.chown(target, source.lstat().st_uid, source.lstat().st_gid, follow_symlinks=False)


def add_user(rootfs: Path) -> None:
    """The MPI pods' user and group, with a home of its own."""
    with (rootfs / "etc/passwd").open("a", encoding="utf-8") as passwd:
        passwd.write(f"{USER}:x:{NON_ROOT_USER}:{NON_ROOT_GROUP}:MPI jobs:/{HOME}:/bin/sh\n")
    with (rootfs / "etc/group").open("a", encoding="utf-8") as group:
        group.write(f"{USER}:x:{NON_ROOT_GROUP}:\n")
    home = rootfs / HOME
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, NON_ROOT_USER, NON_ROOT_GROUP)
    (home / ".keep").write_text("")
    os.chown(home / ".keep", NON_ROOT_USER, NON_ROOT_GROUP)


def build(build: Build) -> dict[str, object]:
    rootfs = build.work / "rootfs"
    mirror = apt_sources.machine_mirror(base.SUITE, build.context.apt_dir)
    packages = ",".join((*base.PACKAGES, *PACKAGES))
    command = ["debootstrap", "--variant=minbase", f"--include={packages}", base.SUITE, str(rootfs), mirror]
    try:
        build.steps.run(f"debootstrap {base.SUITE} with {', '.join(PACKAGES)}", command)
    finally:
        unmount_all(rootfs)
    certificates = base.ca_certificates(build.context)
    for certificate in certificates:
        shutil.copy(certificate, rootfs / "usr/local/share/ca-certificates" / certificate.name)
    build.steps.run("update-ca-certificates", ["chroot", str(rootfs), "update-ca-certificates"])
    shown = build.steps.output("mpirun --version", ["chroot", str(rootfs), "mpirun", "--version"])
    build.say(f"{NAME}: {shown.splitlines()[0] if shown else 'mpirun'}")
    for key in sorted(rootfs.glob(HOST_KEYS)):
        key.unlink()
    add_user(rootfs)
    base.slim(rootfs)

    torch = build.dependencies["trainer-torch"]
    contents = build.copy_layers_of(torch.name)
    before = base_entries(torch.archive, contents.layer_members[0])
    paths = changed(rootfs, before)
    build.say(f"{NAME}: {len(paths)} files beyond the base image's")
    staged = build.work / "layer"
    stage(rootfs, paths, staged)
    layer = build.archive.add_layer(lambda writer: writer.add_tree(staged))
    return build.config_on_top(contents, [layer.diff_id], f"Debian's {' '.join(PACKAGES)}; user {USER}")


RECIPE: Final = Recipe(
    name=NAME,
    summary="trainer-torch plus Debian's OpenMPI, OpenSSH and mpi4py (stands in for mpioperator/openmpi)",
    revision=1,
    references=references,
    inputs=inputs,
    build=build,
    depends=("trainer-torch",),
    tools=(("debootstrap", "debootstrap"),),
    needs_root=True,
)
