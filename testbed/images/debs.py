"""Shared libraries from Debian packages for a trainer image whose Python wheels need them.

Why: a wheel may link a system library it does not ship (paddlepaddle's libpaddle.so needs libgomp.so.1,
which its upstream image, paddlepaddle/paddle, has and the base image's minimal Debian does not). The
trainer image then carries the package's files as the upstream image has them: `apt-get download`
fetches the .deb of the base's suite from the machine's mirror (this machine runs the same Debian
release; its apt is what debootstrap used for the base) and `dpkg-deb -x` unpacks it. Its documentation
is left out, as in the base image. The key covers each package's version and the .deb's SHA256 as apt
lists them, so a new version on the mirror makes a new image.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from testbed.common import ToolError
from testbed.images.keys import KeyInputs
from testbed.images.layers import LayerWriter
from testbed.images.steps import Steps

LEFT_OUT = ("usr/share/doc/", "usr/share/lintian/")


def listed(package: str) -> str:
    """The package's version and .deb digest as the machine's apt lists them (its candidate)."""
    command = ["apt-cache", "show", "--no-all-versions", package]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    fields = dict(
        line.split(": ", 1)
        for line in result.stdout.splitlines()
        if line.startswith(("Version: ", "SHA256: "))
    )
    if result.returncode != 0 or len(fields) != 2:
        raise ToolError(f"apt-cache show {package}: {result.stderr.strip() or 'no Version and SHA256'}")
    return f"{fields['Version']} {fields['SHA256']}"


def inputs(packages: Sequence[str], into: KeyInputs) -> None:
    for package in packages:
        into.text(f"deb:{package}", listed(package))


def unpack(packages: Sequence[str], work: Path, steps: Steps) -> Path:
    """Downloads and unpacks `packages` under `work`; the root they are unpacked in."""
    downloads, root = work / "debs", work / "deb-root"
    downloads.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    steps.run(f"apt-get download {' '.join(packages)}", ["apt-get", "download", *packages], cwd=downloads)
    for deb in sorted(downloads.glob("*.deb")):
        steps.run(f"dpkg-deb -x {deb.name}", ["dpkg-deb", "-x", str(deb), str(root)])
    return root


def fill(layer: LayerWriter, root: Path) -> None:
    """The unpacked files (and symlinks) under `root`, but documentation, in a stable order."""
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for name in sorted(files):
            source = Path(directory) / name
            arcname = source.relative_to(root).as_posix()
            if not arcname.startswith(LEFT_OUT):
                layer.add_file(source, arcname)
