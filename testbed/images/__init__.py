"""Container images for the local real node, built on this machine: no registry is reachable.

    python3 -m testbed.images ensure [NAME ...]   # build what is not cached; one line per image
    python3 -m testbed.images list                # references, key, built or not, size

    from testbed.images import ensure, IMAGES
    built = ensure("operator")   # Image(name, key, references, archive, built, config_digest, ...)

Each image is a docker archive that `ctr -n k8s.io images import` takes, filed under short references
(no registry host; containerd normalizes them on import). `pause` (containerd's sandbox image, a
static binary from pause.c), `busybox` (Debian's busybox-static, for the storage provisioner's helper
pods), `base` (Debian bookworm with Python 3.11 from debootstrap, under the name the Dockerfile's FROM
uses), `operator` (the project's Dockerfile built with buildah on that base) and `trainer-torch` (the
base plus torch and its dependencies from the test virtualenv). Each is cached under
~/.cache/trainingjob-operator/images/ by a key over all its inputs and rebuilt only when one changes
(README.md beside this file). Standard library only: runs with the system's python3.
"""

from typing import Final

from testbed.images.builder import IMAGES, describe, ensure, ensure_all, unavailable
from testbed.images.cache import Image

# Every image's name, in the order `ensure` without names builds them.
NAMES: Final = tuple(IMAGES)

__all__ = ["IMAGES", "NAMES", "Image", "describe", "ensure", "ensure_all", "unavailable"]
