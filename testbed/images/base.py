"""The `base` image: Debian bookworm with Python 3.11, filed under the names of the Dockerfile's FROM.

Why: the Dockerfile starts from python:3.11-slim-bookworm by digest, which lives on a registry this
machine cannot reach. A Debian root filesystem with python3, python3-venv, python3-pip (with
setuptools and wheel), python-is-python3 and ca-certificates (`debootstrap --variant=minbase`, from
the mirror the machine's apt uses) does what the Dockerfile asks of it (`python -m venv`, `pip
--python`, `pip wheel --no-build-isolation`, `ldd`, `ldconfig`, `chroot`), so it stands in under the
FROM lines' names without their digests (a digest names the upstream manifest, which no image built
here can have: testbed/images/operator.py gives buildah the Dockerfile with the digests dropped), and
under `python:3.11-slim`, the name the real node's plain-Python pods use. Its Python is Debian's 3.11,
which is also what the trainer images need (their packages come from a Python 3.11 virtualenv).

What pins the stand-in, as the digest pins the real base: the Debian package versions recorded in
testbed/images/base-packages.txt (testbed/images/debian_pins.py), part of the key and compared on every
cold build: a difference (the mirror has moved on; it serves only the newest versions) is one warning
line and is written into the image's history, not a failed build.

Outbound TLS on this machine is re-signed, so pip inside the image must trust the machine's extra
CA certificates: they are copied into /usr/local/share/ca-certificates and `update-ca-certificates`
runs in the root filesystem; the key covers them. The image is kept lean: no documentation, no apt
lists or package caches, no logs, and neither the machine's resolv.conf nor its hostname.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from testbed.images import apt_sources, debian_pins, dockerfile
from testbed.images.archive import RuntimeConfig, image_config
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe
from testbed.images.steps import Steps, unmount_all

SUITE: Final = "bookworm"
PYTHON_VERSION: Final = "3.11"  # bookworm's python3
# python3-pip brings setuptools and wheel: the Dockerfile's build stage builds the package's wheel with
# the base image's own build backend, as python:3.11-slim's setuptools and wheel do.
PACKAGES: Final = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
# The name the real node's plain-Python pods use (JAX's default image, crd/contract.py; the tests' pods
# in tests/e2e/realnode.py): the base answers to it too.
PLAIN_PYTHON: Final = "python:3.11-slim"
# Debian's codenames, to refuse a FROM tag that names another release than SUITE.
DEBIAN_RELEASES: Final = ("buster", "bullseye", "bookworm", "trixie", "forky")
ENV: Final = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
# What a lean image leaves out (globs in the root filesystem), except KEPT; under LOG_DIRECTORY only
# files go, so the directories programs log into stay.
REMOVED: Final = (
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/lintian/*",
    "usr/share/locale/*",
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/debconf/*-old",
    "tmp/*",
)
KEPT: Final = ("usr/share/locale/locale.alias", "var/lib/apt/lists/partial", "var/lib/apt/lists/lock")
LOG_DIRECTORY: Final = "var/log"
# Files the runtime provides in a container; the image keeps them empty.
TRUNCATED: Final = ("etc/resolv.conf", "etc/hostname")


def references(context: Context) -> tuple[str, ...]:
    """The external images the Dockerfile's FROM lines name, without their digests, and PLAIN_PYTHON."""
    text = (context.repo / "Dockerfile").read_text(encoding="utf-8")
    named = [dockerfile.without_digest(image) for image in dockerfile.base_images(text)]
    return tuple(dict.fromkeys([*named, PLAIN_PYTHON]))


def ca_certificates(context: Context) -> list[Path]:
    return sorted(context.ca_dir.glob("*.crt")) if context.ca_dir.is_dir() else []


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.text("suite", SUITE)
    into.text("packages", " ".join(PACKAGES))
    into.text("mirror", apt_sources.machine_mirror(SUITE, context.apt_dir))
    for certificate in ca_certificates(context):
        into.file(f"ca:{certificate.name}", certificate)
    into.file("pinned-packages", context.repo / debian_pins.PINS)


def check_python_name(reference: str, python_version: str) -> None:
    """A `python:X.Y...` reference must be filled with Python X.Y (a Dockerfile moving to another
    Python needs another base recipe), and a tag naming a Debian release must name SUITE; ValueError
    otherwise."""
    name, _, tag = reference.partition(":")
    if name.rsplit("/", 1)[-1] != "python":
        return
    if not (tag == python_version or tag.startswith((python_version + "-", python_version + "."))):
        raise ValueError(
            f"the Dockerfile builds from {reference}, but the base image has Python {python_version}"
        )
    releases = [release for release in DEBIAN_RELEASES if release in tag.split("-")]
    if releases and releases != [SUITE]:
        raise ValueError(f"the Dockerfile builds from {reference}, but the base image is Debian {SUITE}")


def slim(rootfs: Path) -> None:
    """Leaves out what a container does not need: REMOVED (but KEPT), the logs, and the machine's
    TRUNCATED files."""
    for pattern in REMOVED:
        for path in sorted(rootfs.glob(pattern)):
            if path.relative_to(rootfs).as_posix() in KEPT:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path in sorted((rootfs / LOG_DIRECTORY).rglob("*")):
        if path.is_file() or path.is_symlink():
            path.unlink()
    for name in TRUNCATED:
        path = rootfs / name
        if path.is_symlink():
            path.unlink()
        path.write_bytes(b"")


def bootstrap(rootfs: Path, steps: Steps, context: Context) -> dict[str, str]:
    """debootstrap into `rootfs` (nothing left mounted); returns the packages installed, by version."""
    mirror = apt_sources.machine_mirror(SUITE, context.apt_dir)
    command = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(rootfs),
        mirror,
    ]
    try:
        steps.run(f"debootstrap {SUITE} ({', '.join(PACKAGES)})", command)
    finally:
        unmount_all(rootfs)
    return debian_pins.installed(steps.output("the installed packages", debian_pins.query(rootfs)))


def pin(context: Context, work: Path, steps: Steps) -> Path:
    """Records the packages a debootstrap from the mirror installs now in the pins file (`make
    pin-base-image`); `work` is a scratch directory. Returns the file."""
    found = bootstrap(work / "rootfs", steps, context)
    path = context.repo / debian_pins.PINS
    path.write_text(debian_pins.render(found), encoding="utf-8")
    return path


def build(build: Build) -> dict[str, object]:
    rootfs = build.work / "rootfs"
    for reference in build.archive.references:
        check_python_name(reference, PYTHON_VERSION)
    pinned = debian_pins.read(build.context.repo)
    found = bootstrap(rootfs, build.steps, build.context)
    drift = debian_pins.difference(pinned, found)
    if drift:
        # Debian's mirror keeps only the newest version of a package, so a pinned version that has been
        # superseded (a point release, a security update) cannot be installed any more: refusing to
        # build would stop every fresh machine's CI until someone re-pins. The build goes on with what
        # the mirror serves, says so in one line, and records what it installed in the image.
        build.say(f"{build.name}: warning: {drift}")
    certificates = ca_certificates(build.context)
    for certificate in certificates:
        shutil.copy(certificate, rootfs / "usr/local/share/ca-certificates" / certificate.name)
    build.steps.run(
        f"update-ca-certificates in the root filesystem ({len(certificates)} extra)",
        ["chroot", str(rootfs), "update-ca-certificates"],
    )
    shown = build.steps.output("python3 --version", ["chroot", str(rootfs), "python3", "--version"])
    if not shown.split()[-1].startswith(PYTHON_VERSION + "."):
        build.steps.fail(f"the root filesystem has {shown.strip()}, not Python {PYTHON_VERSION}")
    slim(rootfs)
    layer = build.archive.add_layer(lambda layer: layer.add_tree(rootfs))
    created_by = (
        f"debootstrap --variant=minbase {SUITE} with {' '.join(PACKAGES)}; the machine's CA certificates; "
        f"{'packages as pinned' if not drift else 'packages differing from the pins: ' + drift}"
    )
    history = [{"created": build.created, "created_by": created_by}]
    return image_config(RuntimeConfig(env=ENV, cmd=("python3",)), [layer.diff_id], history, build.created)


RECIPE: Final = Recipe(
    name="base",
    summary=f"Debian {SUITE} minbase with Python {PYTHON_VERSION} (stands in for the Dockerfile's FROM)",
    revision=2,
    references=references,
    inputs=inputs,
    build=build,
    tools=(("debootstrap", "debootstrap"),),
    needs_root=True,
)
