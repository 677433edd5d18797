"""The `busybox` image: Debian's static busybox as /bin/busybox, with a link for every applet.

Why: the local-path provisioner creates and deletes a volume's directory from a helper pod running
`sh /script/setup` in a `busybox` image, and the upstream image is on a registry this machine cannot
reach. Debian's busybox-static is one static binary; the image holds it, a symlink per applet
(`busybox --list-full`: sh, mkdir, rm, ...), /tmp, /dev, /proc and /sys, and root and nobody in
/etc/passwd. It is filed as `busybox:latest` (what the provisioner names by default) and
`busybox:<version>`. The key covers the binary's content.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from testbed.common import ToolError
from testbed.images.archive import RuntimeConfig, image_config
from testbed.images.elf import is_static_executable
from testbed.images.keys import KeyInputs
from testbed.images.layers import LayerWriter
from testbed.images.recipe import Build, Context, Recipe

PATH: Final = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWD: Final = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP: Final = b"root:x:0:\nnogroup:x:65534:\n"


def static_busybox() -> Path:
    """The machine's busybox if it is the static one (Debian's busybox-static); ToolError otherwise."""
    found = shutil.which("busybox")
    binary = Path(found).resolve() if found else None
    if binary is None or not is_static_executable(binary):
        raise ToolError(
            "the busybox image needs a static busybox: install the Debian package busybox-static "
            "(`make node-tools` does)"
        )
    return binary


def applets(binary: Path) -> list[str]:
    """The applets' paths in the image (`usr/bin/[`, `bin/sh`, ...), as busybox lists them."""
    listed = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True, check=True)
    return sorted({line.strip().lstrip("/") for line in listed.stdout.splitlines() if line.strip()})


def version(binary: Path) -> str:
    """busybox's version (`1.35.0`), from the first line of its help."""
    shown = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False)
    match = re.search(r"BusyBox v(\d+(?:\.\d+)+)", shown.stdout + shown.stderr)
    if match is None:
        raise ToolError(f"{binary} does not say its version")
    return match.group(1)


def references(context: Context) -> tuple[str, ...]:
    return (f"busybox:{version(static_busybox())}", "busybox:latest")


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.file("busybox", static_busybox())  # its applet list is part of the binary


def _fill(layer: LayerWriter, binary: Path, links: list[str]) -> None:
    layer.add_file(binary, "bin/busybox")
    for link in links:
        if link != "bin/busybox":
            layer.add_symlink(link, "/bin/busybox")
    for mount_point in ("dev", "proc", "sys"):
        layer.add_directory(mount_point)
    layer.add_directory("tmp", 0o1777)
    layer.add_directory("root", 0o700)
    layer.add_bytes("etc/passwd", PASSWD)
    layer.add_bytes("etc/group", GROUP)


def build(build: Build) -> dict[str, object]:
    binary = static_busybox()
    links = applets(binary)
    layer = build.archive.add_layer(lambda layer: _fill(layer, binary, links))
    history = [
        {
            "created": build.created,
            "created_by": f"busybox-static {version(binary)}: /bin/busybox and applet links",
        }
    ]
    runtime = RuntimeConfig(env=(PATH,), cmd=("sh",))
    return image_config(runtime, [layer.diff_id], history, build.created)


RECIPE: Final = Recipe(
    name="busybox",
    summary="Debian's busybox-static with its applet links",
    revision=1,
    references=references,
    inputs=inputs,
    build=build,
)
