"""`python3 -m hack.images`: build the real node's images, or list them (see the package's docstring).

python3 -m hack.images ensure [NAME ...]   # all without names; one line per image on stdout:
                                           #   <archive> <reference> <reference> ...
python3 -m hack.images list                # name, references, key, built or not, size
"""

from __future__ import annotations

import argparse
import sys

from hack.common import ToolError
from hack.images.builder import IMAGES, describe, ensure_all
from hack.images.cache import Image


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hack.images", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ensure_parser = commands.add_parser(
        "ensure", help="build the images not cached yet; print their archives"
    )
    ensure_parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"of: {', '.join(IMAGES)} (default: all)"
    )
    commands.add_parser("list", help="the images: key, built or not, size, references")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "list":
            list_images()
        else:
            for image in ensure_all(arguments.names or None):
                print(image.archive, *image.references, flush=True)
    except ToolError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
