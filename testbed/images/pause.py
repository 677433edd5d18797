"""The `pause` image: containerd's sandbox image for the real node, one static binary (pause.c).

Why build it: the sandbox image is the first container of every pod, and the upstream one is on a
registry this machine cannot reach. Its whole job (hold the pod's namespaces, exit on SIGINT/SIGTERM,
reap children) is a few lines of C, compiled here with `gcc -static` into a one-file image that runs
as 65535:65535, as the upstream image does. The key covers the source and the flags (not the
compiler's version: a cached image is found without running any build tool).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from testbed.images.archive import RuntimeConfig, image_config
from testbed.images.elf import is_static_executable
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe

SOURCE: Final = Path(__file__).with_name("pause.c")
CFLAGS: Final = ("-static", "-O2", "-Wall", "-Wextra", "-Werror", "-s")
REFERENCE: Final = "trainingjob-dev/pause:1"


def references(context: Context) -> tuple[str, ...]:
    return (REFERENCE,)


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.file("pause.c", SOURCE)
    into.text("cflags", " ".join(CFLAGS))


def build(build: Build) -> dict[str, object]:
    binary = build.work / "pause"
    build.steps.run("gcc -static pause.c", ["gcc", *CFLAGS, "-o", str(binary), str(SOURCE)])
    if not is_static_executable(binary):
        build.steps.fail(f"gcc did not produce a static executable ({binary})")
    build.steps.output("pause -v", [str(binary), "-v"])
    layer = build.archive.add_layer(lambda layer: layer.add_file(binary, "pause"))
    runtime = RuntimeConfig(env=(), entrypoint=("/pause",), user="65535:65535")
    history = [{"created": build.created, "created_by": "gcc -static testbed/images/pause.c"}]
    return image_config(runtime, [layer.diff_id], history, build.created)


RECIPE: Final = Recipe(
    name="pause",
    summary="the sandbox image: pause.c built with gcc -static",
    revision=1,
    references=references,
    inputs=inputs,
    build=build,
    tools=(("gcc", "gcc"),),
)
