"""The base image's Debian packages, pinned: the versions testbed/images/base-packages.txt records are the
ones a cold build of the base image must install.

Why: the base image stands in for the Dockerfile's FROM, which names its image by digest. No digest
can name a root filesystem built here, and debootstrap installs whatever the machine's Debian mirror
serves that day, which moves with each point release. So the stand-in's equivalent of a digest is the
list of its packages and their versions: recorded by `make pin-base-image` (`python3 -m testbed.images
pin-base`), part of the base image's key, and compared with what debootstrap installed on every cold
build, which says in one warning line what differs when the mirror has moved on (a mirror serves only
the newest version of each package, so the build cannot install an older one; it goes on with what
the mirror serves and records that in the image). Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

PINS: Final = "testbed/images/base-packages.txt"
REPIN: Final = "make pin-base-image"
HEADER: Final = f"""\
# The Debian packages of the real node's base image (testbed/images/base.py, the stand-in for the
# Dockerfile's FROM) and their versions, as debootstrap installed them from the mirror when they were
# last recorded: `{REPIN}` writes this file. A cold build that installs anything else stops.
"""
SHOWN: Final = 3  # differences named in the one line; the rest are counted


def parse(text: str) -> dict[str, str]:
    """`package version` lines (comments and blank lines skipped) as {package: version}; ValueError
    naming a line that is not one."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{PINS} line {number}: {line!r} is not `package version`")
        pins[fields[0]] = fields[1]
    return pins


def render(packages: Mapping[str, str]) -> str:
    """The pins file for these packages, sorted by name."""
    return HEADER + "".join(f"{name} {packages[name]}\n" for name in sorted(packages))


def difference(pinned: Mapping[str, str], found: Mapping[str, str]) -> str | None:
    """None when debootstrap installed exactly the pinned packages; otherwise one line naming the first
    differences and what to run."""
    changes = [
        f"{name} {found[name]} where {pinned[name]} is pinned"
        for name in sorted(pinned.keys() & found.keys())
        if pinned[name] != found[name]
    ]
    changes += [f"{name} {found[name]} is new" for name in sorted(found.keys() - pinned.keys())]
    changes += [f"{name} is gone" for name in sorted(pinned.keys() - found.keys())]
    if not changes:
        return None
    more = f", and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
    return (
        f"the mirror's packages are not the ones {PINS} pins: {'; '.join(changes[:SHOWN])}{more}; "
        f"`{REPIN}` records what the mirror serves now (review the difference, then commit it)"
    )


def query(rootfs: Path) -> list[str]:
    """The command that lists what dpkg installed in a root filesystem (parse its output with
    `installed`)."""
    return [
        "chroot",
        str(rootfs),
        "dpkg-query",
        "--show",
        "--showformat=${db:Status-Abbrev} ${Package} ${Version}\\n",
    ]


def installed(output: str) -> dict[str, str]:
    """`query`'s output as {package: version}, for the packages installed (status `ii`) only."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "ii":
            found[fields[1]] = fields[2]
    return found


def read(repo: Path) -> dict[str, str]:
    return parse((repo / PINS).read_text(encoding="utf-8"))
