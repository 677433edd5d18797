"""Keys and builds: `describe` says what an image's key is and whether it is built, `ensure` builds it
(dependencies first) unless the cache has it.

Why here: the recipes say what an image is made of; this module applies the cache's rules to all of
them alike. An image's key covers its name, its recipe's revision (and the shared steps'), its
references and whatever its recipe lists, which includes its dependencies' keys, so a new base image
means a new operator and trainer image. A cached `ensure` computes keys and reads one small file:
no build tool runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from testbed.common import Say, ToolError
from testbed.images import base, busybox, cache, mlflow, operator, pause, previous, trainer, trainer_mpi
from testbed.images.archive import ArchiveWriter
from testbed.images.keys import KeyInputs
from testbed.images.recipe import SHARED_REVISION, Build, Context, Recipe
from testbed.images.steps import Steps

IMAGES: Final[Mapping[str, Recipe]] = {
    recipe.name: recipe
    for recipe in (
        pause.RECIPE,
        busybox.RECIPE,
        base.RECIPE,
        operator.RECIPE,
        previous.RECIPE,
        *(trainer.recipe(spec) for spec in trainer.TRAINERS),
        mlflow.RECIPE,
        trainer_mpi.RECIPE,
    )
}

SAY: Final = Say("images")


def recipe_of(name: str) -> Recipe:
    if name not in IMAGES:
        raise ToolError(f"no image named {name!r}; the images are: {', '.join(IMAGES)}")
    return IMAGES[name]


def key_inputs(name: str, context: Context, memo: dict[str, cache.Image] | None = None) -> KeyInputs:
    """The lines an image's key is the hash of (its dependencies described first)."""
    recipe = recipe_of(name)
    keys = {dependency: describe(dependency, context, memo).key for dependency in recipe.depends}
    into = KeyInputs()
    into.text("image", name)
    into.text("recipe", f"{recipe.revision}.{SHARED_REVISION}")
    into.text("references", " ".join(recipe.references(context)))
    for dependency, key in sorted(keys.items()):
        into.text(f"image:{dependency}", key)
    recipe.inputs(context, keys, into)
    return into


def describe(
    name: str, context: Context | None = None, memo: dict[str, cache.Image] | None = None
) -> cache.Image:
    """The image's key, references and whether the cache has it built (nothing is built)."""
    context = context or Context()
    memo = {} if memo is None else memo
    if name not in memo:
        key = key_inputs(name, context, memo).key()
        memo[name] = cache.cached(name, key, recipe_of(name).references(context))
    return memo[name]


def _check_tools(recipe: Recipe) -> None:
    missing = [
        f"{command} (Debian package {package})"
        for command, package in recipe.tools
        if not shutil.which(command)
    ]
    if missing:
        raise ToolError(
            f"building image {recipe.name} needs {', '.join(missing)}: `make node-tools` installs them"
        )
    if recipe.needs_root and os.geteuid() != 0:
        raise ToolError(
            f"building image {recipe.name} needs root (debootstrap, chroot, mounts): run it as root"
        )


def unavailable(name: str, context: Context | None = None) -> str | None:
    """Why image `name` cannot be built from what is installed here (a trainer whose framework the
    virtualenv lacks), or None."""
    context = context or Context()
    specs = [spec for spec in trainer.TRAINERS if spec.name == recipe_of(name).name]
    if specs:
        return trainer.not_installed(specs[0], context)
    # An image built on a trainer (trainer-mpi on trainer-torch) needs what that one needs.
    return next(
        filter(None, (unavailable(dependency, context) for dependency in recipe_of(name).depends)), None
    )


def ensure(name: str, context: Context | None = None) -> cache.Image:
    """The image `name`, built first (with its dependencies) unless the cache has it."""
    context = context or Context()
    recipe = recipe_of(name)
    image = describe(name, context)
    if image.built:
        cache.mark_used(image)
        return image
    dependencies = {dependency: ensure(dependency, context) for dependency in recipe.depends}
    _check_tools(recipe)
    inputs = key_inputs(name, context)
    key = inputs.key()
    with cache.locked(name, on_wait=lambda: SAY(f"{name}: another build holds its lock; waiting for it")):
        image = cache.cached(name, key, image.references)
        if image.built:
            return image
        log = cache.cache_root() / name / "build.log"
        log.write_text("")
        SAY(f"{name}: cold build of {recipe.summary} into {cache.build_dir(name, key)} (log: {log})")

        def fill(directory: Path) -> str:
            work = directory / "work"
            work.mkdir()
            steps = Steps(name, log, SAY)
            archive = ArchiveWriter(
                directory / cache.ARCHIVE, image.references, steps.progress("writing a layer")
            )
            try:
                config = recipe.build(Build(name, context, work, steps, archive, dependencies, SAY))
            except BaseException:
                archive.abandon()
                raise
            return archive.finish(dict(config))

        image = cache.build_into_cache(name, key, image.references, inputs.lines, fill)
        for removed in cache.prune(name, keep=key):
            SAY(f"{name}: removed an older build, {removed}")
    SAY(f"{name}: built in {image.build_seconds:.0f}s, {image.size / 1e6:.0f} MB: {image.archive}")
    return image


def ensure_all(names: list[str] | None = None, context: Context | None = None) -> list[cache.Image]:
    """Every image named (all, without names), each built unless cached."""
    return [ensure(name, context) for name in (names or list(IMAGES))]
