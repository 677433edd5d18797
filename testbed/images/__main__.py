"""`python3 -m testbed.images`: build the real node's images, or list them (see the package's docstring).

python3 -m testbed.images ensure [NAME ...]   # all without names; one line per image on stdout:
                                           #   <archive> <reference> <reference> ...
python3 -m testbed.images list                # name, references, key, built or not, size
python3 -m testbed.images pin-base            # record the base image's Debian package versions (root)
python3 -m testbed.images tag NAME IMG        # build NAME unless cached, tag it IMG (make docker-build)
python3 -m testbed.images push IMG            # push the build tagged IMG to IMG's registry (make docker-push)
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path

from testbed.common import REPO, Say, ToolError, reader_gone
from testbed.images import base, cache, push
from testbed.images.builder import IMAGES, describe, ensure, ensure_all
from testbed.images.cache import Image
from testbed.images.recipe import Context
from testbed.images.steps import Steps, remove_tree
from testbed.node import registry


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


def tag(name: str, reference: str) -> None:
    """`make docker-build`: the image built unless cached, then tagged `reference`."""
    push.parse_target(reference)
    image = ensure(name)
    push.tag(image, reference)
    print(image.archive, reference, flush=True)


def push_tagged(reference: str) -> None:
    """`make docker-push`: the build tagged `reference` pushed to its registry, with the credentials a
    docker config file holds for it ($REGISTRY_AUTH_FILE, else the local cluster's registry's own
    when it is that registry, else ~/.docker/config.json) and the local cluster's CA for its registry
    (the machine's trusted CAs for any other)."""
    target = push.parse_target(reference)
    image = push.tagged(reference)
    local = registry.local_access(target.host)
    explicit = os.environ.get("REGISTRY_AUTH_FILE")
    auth_file = Path(explicit) if explicit else local[0] if local else Path.home() / ".docker" / "config.json"
    context = ssl.create_default_context(cafile=str(local[1]) if local else None)
    began = time.monotonic()
    client = push.Registry(target.host, push.credentials_from(auth_file, target.host), context)
    digest = push.push(image, target, client)
    took = time.monotonic() - began
    print(
        f"pushed {reference} ({image.name}, {image.size / 1e6:.0f} MB) in {took:.1f}s: {digest}", flush=True
    )


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a session stopping its background builds) ends a build as an exception would: its
    temporary directory unmounted and removed, nothing half-built left in the cache."""
    raise SystemExit(128 + signum)


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
    tag_parser = commands.add_parser("tag", help="build an image unless cached and tag it IMG (docker-build)")
    tag_parser.add_argument("name", choices=list(IMAGES), metavar="NAME")
    tag_parser.add_argument("reference", metavar="IMG", help="<host[:port]>/<name>:<tag>")
    push_parser = commands.add_parser("push", help="push the build tagged IMG to its registry (docker-push)")
    push_parser.add_argument("reference", metavar="IMG")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "list":
            list_images()
        elif arguments.command == "pin-base":
            pin_base()
        elif arguments.command == "tag":
            tag(arguments.name, arguments.reference)
        elif arguments.command == "push":
            push_tagged(arguments.reference)
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
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    sys.exit(main())
