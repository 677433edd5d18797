"""What an image recipe is: its references, its key inputs and its build, and what each of them gets.

Why a shape shared by every image: the cache (testbed/images/cache.py) treats all images alike (a key,
a lock, a temporary directory renamed into place), so each recipe only says what is particular to it.
`Context` is where a recipe reads the machine and the repository from (tests point it at copies);
`Build` is what a build gets: a work directory, logged steps, the archive to write, and the images it
depends on, built first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from testbed.common import REPO, Say, ToolError
from testbed.images.apt_sources import APT_DIR
from testbed.images.archive import ArchiveContents, ArchiveWriter, open_member, read_archive
from testbed.images.cache import Image
from testbed.images.keys import KeyInputs
from testbed.images.steps import Steps

# The shared steps' revision (archive format, cache layout): raising it gives every image a new key.
SHARED_REVISION: Final = 1


@dataclass(frozen=True)
class Context:
    """Where recipes read their inputs: the repository, the machine's apt configuration and CA
    certificates, and the virtualenv whose installed packages the trainer images take."""

    repo: Path = REPO
    apt_dir: Path = APT_DIR
    ca_dir: Path = Path("/usr/local/share/ca-certificates")
    venv: Path | None = None

    def trainer_venv(self) -> Path:
        """The virtualenv of the tests: TJ_TRAINER_VENV, else the repository's .venv, else the one
        this interpreter runs in."""
        if self.venv is not None:
            return self.venv
        candidates = [os.environ.get("TJ_TRAINER_VENV", ""), str(self.repo / ".venv")]
        if sys.prefix != sys.base_prefix:
            candidates.append(sys.prefix)
        for candidate in filter(None, candidates):
            if (Path(candidate) / "bin" / "python").exists():
                return Path(candidate).absolute()
        raise ToolError(
            f"no virtualenv to take the trainer's packages from: `make venv` creates {self.repo / '.venv'}, "
            "or set TJ_TRAINER_VENV to one"
        )


@dataclass
class Build:
    """One build in progress: `work` is a scratch directory inside the temporary build directory."""

    name: str
    context: Context
    work: Path
    steps: Steps
    archive: ArchiveWriter
    dependencies: Mapping[str, Image]
    say: Say
    created: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def copy_layers_of(self, parent: str) -> ArchiveContents:
        """Writes the layers of the dependency `parent` into this image, first: the image is built on
        top of it. Returns the parent's contents, for `config_on_top`."""
        archive = self.dependencies[parent].archive
        contents = read_archive(archive)
        diff_ids = contents.config["rootfs"]["diff_ids"]
        for member, diff_id in zip(contents.layer_members, diff_ids, strict=True):
            with open_member(archive, member) as source:
                self.archive.copy_layer(source, diff_id)
        return contents

    def config_on_top(self, parent: ArchiveContents, added: list[str], created_by: str) -> dict[str, object]:
        """The parent's config with the layers this build `added` (their diff IDs) and one history
        entry for them."""
        config = dict(parent.config)
        config["created"] = self.created
        config["rootfs"] = {"type": "layers", "diff_ids": [*parent.config["rootfs"]["diff_ids"], *added]}
        config["history"] = [
            *parent.config.get("history", []),
            {"created": self.created, "created_by": created_by},
        ]
        return config


@dataclass(frozen=True)
class Recipe:
    """An image: `references(context)` it is filed under (short, no registry host), `inputs(context,
    keys, into)` lists what its key covers (`keys` holds its dependencies' keys), `build(build)`
    writes its layers and config through `build.archive` and returns the config to finish it with.
    `revision` is raised when the recipe itself changes."""

    name: str
    summary: str
    revision: int
    references: Callable[[Context], tuple[str, ...]]
    inputs: Callable[[Context, Mapping[str, str], KeyInputs], None]
    build: Callable[[Build], dict[str, object]]
    depends: tuple[str, ...] = ()
    # (program, Debian package) the build runs, checked before it starts; and whether it needs root
    # (debootstrap and chroot, or buildah's mount namespace).
    tools: tuple[tuple[str, str], ...] = ()
    needs_root: bool = False
