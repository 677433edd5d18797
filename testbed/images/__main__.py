"""`python3 -m testbed.images`: build the real node's images, or list them (see the package's docstring).

python3 -m testbed.images ensure [NAME ...]   # all without names; one line per image on stdout:
                                           #   <archive> <reference> <reference> ...
python3 -m testbed.images list                # name, references, key, built or not, size
python3 -m testbed.images pin-base            # record the base image's Debian package versions (root)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from testbed.common import REPO, Say, ToolError, reader_gone
from testbed.images import base, cache
from testbed.images.builder import IMAGES, describe, ensure_all
from testbed.images.cache import Image
from testbed.images.recipe import Context
from testbed.images.steps import Steps, remove_tree


def list_images() -> None:
    """One line per image; an image whose key cannot be computed here says why."""
    memo: dict[str, Image] = {}
    for name in IMAGES:
        try:
            image = describe(name, memo=memo)
        except ToolError as error:
            print(f"{name:14} {'?':16}  {error}")
            continue
        state = f"built, {image.size / 1e6:.1f} MB" if image.built else "not built"
        print(f"{name:14} {image.key}  {state:18} {' '.join(image.references)}")


def pin_base() -> None:
    """debootstrap into a scratch directory and record its packages (testbed/images/debian_pins.py)."""
    if os.geteuid() != 0:
        raise ToolError("pinning the base image runs debootstrap: run it as root")
    root = cache.cache_root() / "base"
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".pin-", dir=root))
    try:
        steps = Steps("base", root / "pin.log", Say("images"))
        path = base.pin(Context(), work, steps)
    finally:
        remove_tree(work)
    print(f"wrote {path.relative_to(REPO)}: review `git diff` and commit it; the base image rebuilds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m testbed.images", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ensure_parser = commands.add_parser(
        "ensure", help="build the images not cached yet; print their archives"
    )
    ensure_parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"of: {', '.join(IMAGES)} (default: all)"
    )
    commands.add_parser("list", help="the images: key, built or not, size, references")
    commands.add_parser("pin-base", help="record the Debian package versions the base image is built from")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "list":
            list_images()
        elif arguments.command == "pin-base":
            pin_base()
        else:
            for image in ensure_all(arguments.names or None):
                print(image.archive, *image.references, flush=True)
    except ToolError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return reader_gone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
