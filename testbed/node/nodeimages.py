"""The real node's images in its containerd: which to import, importing them, and what goes.

Why apart from testbed/node/realnode.py: the node's own images (pause, busybox) are always there, the
others only when asked for (`make demo` asks for the torch trainer alone; the tests for every one), and
what an import removes from containerd's store (which the cache keeps across `down`) depends on what
was asked for; that choice and its rules are here, the node's processes in realnode.py. `ctr` is the
node's `ctr` bound to its containerd (realnode.ctr).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from testbed import images
from testbed.cluster.state import say
from testbed.common import ToolError
from testbed.images import mlflow as mlflow_image
from testbed.images import refs as images_refs

# The node's `ctr` with its address and namespace: ctr(*args, timeout=...) -> its output.
Ctr = Callable[..., str]

# The images the node runs itself, always imported: containerd's sandbox image (pause) and the
# storage provisioner's helper pods' (busybox).
OWN_IMAGES: Final = ("pause", "busybox")
# Every image the node can hold. Beyond its own, it imports those asked for (`up --with real-node
# --images NAME,...`, TJ_NODE_IMAGES): `make demo` asks for trainer-torch alone (built on base), and
# `all`, the default (the tests'), is every one whose packages are installed here.
IMAGES: Final = (
    "pause",
    "busybox",
    "base",
    "operator",
    "trainer-torch",
    "trainer-tensorflow",
    "trainer-jax",
    "trainer-xgboost",
    "trainer-paddle",
    "trainer-mpi",
)
ALL_IMAGES: Final = "all"
# `--images first`: what a test session's real node starts with, the images its first tests use (the
# node's pods, the deployed operator, the torch trainer of the examples); `make test` builds them
# before the session, and the session builds the others in the background while its tests run and
# imports each before the first test that names it (conftest.py, the `images` marker).
FIRST: Final = "first"
FIRST_IMAGES: Final = (*OWN_IMAGES, "base", "operator", "trainer-torch")
# Images imported by an optional component of their own (`up --with mlflow`: its server), never by
# `--images`: an import of the others leaves them alone, as the component's pods may still use them.
ON_REQUEST_IMAGES: Final = (mlflow_image.NAME,)
IMAGE_KEY_LABEL: Final = "ml.example.com/image-key"
# containerd's CRI reports an image with this label as pinned, and the kubelet never collects those.
PINNED_LABEL: Final = "io.cri-containerd.pinned=pinned"
# The trainer image (3 GB, 5.4 GB unpacked) took 93 s to import on 2 cores.
IMPORT_TIMEOUT: Final = 900.0


def selected_images(text: str) -> tuple[str, ...]:
    """`--images`: `all`, `first` (FIRST_IMAGES), or image names separated by commas; the node's own
    images come first either way. `all` leaves out a trainer image whose framework the virtualenv
    lacks (`make demo`'s has torch alone), in one line; a name asked for that cannot be built is an
    error."""
    if text.strip() == FIRST:
        names = list(FIRST_IMAGES)
    elif text.strip() == ALL_IMAGES:
        names = []
        for name in IMAGES:
            reason = images.unavailable(name)
            if reason is None:
                names.append(name)
            else:
                say(f"real node: without image {name}: {reason}")
    else:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in IMAGES]
        if unknown:
            raise ToolError(
                f"--images: no image {', '.join(unknown)}; the images are: {', '.join(IMAGES)}, "
                f"or {FIRST} ({', '.join(FIRST_IMAGES)}), or {ALL_IMAGES}"
            )
    return tuple(dict.fromkeys([*OWN_IMAGES, *names]))


def import_images(ctr: Ctr, names: tuple[str, ...] = IMAGES) -> None:
    """Imports each image of `names` unless containerd holds it already under every reference, labelled
    with the key it was built under (containerd's root is kept in the cache across `down`, and the
    trainer image takes a minute and a half to import), and pinned: the kubelet's image garbage
    collection (under disk pressure, whatever its thresholds say) never removes a pinned image, and
    these cannot be pulled again. So what this tree does not build as it is goes first, and
    synchronously: containerd collects a replaced image's layers only after a hundred changes to its
    store or at its next start, and the store kept two or three generations of the torch image
    (5 GB unpacked each). With some images only (`make demo`'s), the others containerd holds stay:
    only a rebuilt image of `names` replaces its older build."""
    built = {name: images.ensure(name) for name in names}
    paths = {
        name: [images_refs.repository_path(ref) for ref in image.references] for name, image in built.items()
    }
    wanted = {path: built[name].key for name, image_paths in paths.items() for path in image_paths}
    held = imported_keys(ctr)
    others = {images_refs.repository_path(ref) for ref in on_request_references(names)}
    held = {ref: key for ref, key in held.items() if not any(ref.endswith("/" + path) for path in others)}
    for reference in stale_images(held, wanted, every_image=set(names) == set(IMAGES)):
        say(f"real node: removing {reference}, which this tree does not build as it is")
        ctr("images", "rm", "--sync", reference, timeout=IMPORT_TIMEOUT)
    listing = [line.split() for line in ctr("images", "list").splitlines()[1:] if line.strip()]
    for reference in orphaned_image_ids([(fields[0], fields[2]) for fields in listing]):
        ctr("images", "rm", "--sync", reference, timeout=IMPORT_TIMEOUT)
    held = imported_keys(ctr)
    for name, image in built.items():
        imported = all(any(ref.endswith("/" + path) for ref in held) for path in paths[name])
        began = time.monotonic()
        if not imported:
            say(f"real node: importing {name} ({image.size / 1e6:.0f} MB)")
            ctr("images", "import", str(image.archive), timeout=IMPORT_TIMEOUT)
        for reference in imported_references(ctr, paths[name]):
            ctr("images", "label", reference, f"{IMAGE_KEY_LABEL}={image.key}", PINNED_LABEL)
        if not imported:
            took = time.monotonic() - began
            say(f"real node: imported {name} ({', '.join(image.references)}) in {took:.1f}s")


def on_request_references(names: tuple[str, ...]) -> list[str]:
    """The references of the on-request images not among `names`: what an import of `names` keeps."""
    return [mlflow_image.reference()] if mlflow_image.NAME not in names else []


def stale_images(held: dict[str, str], wanted: dict[str, str], *, every_image: bool = True) -> list[str]:
    """Of the references a build of this project imported (`held`: reference -> the key it carries
    in its label), those this tree does not build as they are (`wanted`: repository path -> key): a
    path it no longer builds (a trainer tagged with an older framework version) or one it builds
    under another key. Images imported by hand or pulled carry no such label and are not held.
    When `wanted` is not `every_image` (some images asked for), a path it does not name may be one of
    the others and stays; only its own paths held under another key go."""

    def wanted_key(reference: str) -> str | None:
        return next((key for path, key in wanted.items() if reference.endswith("/" + path)), None)

    return sorted(
        reference
        for reference, key in held.items()
        if wanted_key(reference) != key and (every_image or wanted_key(reference) is not None)
    )


def orphaned_image_ids(images_and_targets: list[tuple[str, str]]) -> list[str]:
    """The image records named by an image ID (`sha256:...`, which the kubelet's image service adds
    beside each tag) whose image no named reference points at any more: they alone kept a removed
    image's layers, 5 GB unpacked for the torch trainer, in the store."""
    named = {target for name, target in images_and_targets if not name.startswith("sha256:")}
    return sorted(
        name for name, target in images_and_targets if name.startswith("sha256:") and target not in named
    )


def imported_references(ctr: Ctr, paths: list[str]) -> list[str]:
    """containerd's full names of the references whose repository paths are `paths`."""
    names = [line.split()[0] for line in ctr("images", "list").splitlines()[1:] if line.strip()]
    return [name for name in names if any(name.endswith("/" + path) for path in paths)]


def imported_keys(ctr: Ctr) -> dict[str, str]:
    """Each image reference containerd holds, with the build key it was labelled with on import."""
    keys: dict[str, str] = {}
    for line in ctr("images", "list").splitlines()[1:]:
        fields = line.split()
        if not fields:
            continue
        for label in fields[-1].split(","):
            key, _, value = label.partition("=")
            if key == IMAGE_KEY_LABEL:
                keys[fields[0]] = value
    return keys
