"""testbed/images, without building: how the base image is pinned and named after the Dockerfile's FROM.

The promises: the Dockerfile names its base by digest and the local build gets it with the digests
dropped (FROM lines only); the stand-in answers to the FROM's tag and to the name plain-Python pods
use, and refuses a tag of another Python or Debian release; its Debian package versions are pinned,
read and written in one format, part of its key (and so of the operator's), and a mirror that moved on
is one line naming the packages and the command that re-pins. The images are built in
testbed/tests/test_images_build.py; the rest of testbed/images' pure parts in testbed/tests/test_images.py.
"""

from __future__ import annotations

import pytest

from crd.contract import DEFAULT_IMAGES
from testbed.common import REPO
from testbed.images import base, debian_pins, dockerfile
from testbed.images.builder import key_inputs
from testbed.images.recipe import Context


def key(name: str, context: Context) -> str:
    return key_inputs(name, context).key()


def test_the_dockerfile_names_its_base_by_digest_and_the_stand_in_by_its_tag() -> None:
    project = (REPO / "Dockerfile").read_text()
    (pinned,) = dockerfile.base_images(project)
    assert dockerfile.digest(pinned) is not None, "the Dockerfile names its base by digest"
    tag = dockerfile.without_digest(pinned)
    assert tag.startswith("python:3.11.")
    assert base.references(Context()) == (tag, base.PLAIN_PYTHON)
    assert DEFAULT_IMAGES["jax"] == base.PLAIN_PYTHON, "JAX's default image is the base on the real node"


def test_the_build_gets_the_dockerfile_with_its_digests_dropped() -> None:
    digest = "sha256:" + "ab" * 32
    text = f"""\
# FROM python:3.11@{digest} in a comment stays
FROM --platform=$BUILDPLATFORM python:3.11.16-slim-bookworm@{digest} AS build
RUN echo python:3.11@{digest}
from busybox:1.36@{digest}
FROM build AS again
FROM scratch
"""
    local = dockerfile.without_digests(text)
    assert local.splitlines()[1] == "FROM --platform=$BUILDPLATFORM python:3.11.16-slim-bookworm AS build"
    assert local.splitlines()[3] == "from busybox:1.36"
    assert local.splitlines()[0] == text.splitlines()[0]
    assert local.splitlines()[2] == text.splitlines()[2], "only FROM lines change"
    assert local.splitlines()[4:] == text.splitlines()[4:]
    assert dockerfile.digest(f"python:3.11@{digest}") == digest
    assert dockerfile.digest("python:3.11") is None
    assert dockerfile.base_images(local) == ("python:3.11.16-slim-bookworm", "busybox:1.36")


def test_the_base_key_covers_the_pinned_debian_packages(context: Context) -> None:
    first_base, first_operator = key("base", context), key("operator", context)
    pins = context.repo / debian_pins.PINS
    original = pins.read_text()
    pins.write_text(original.replace("libc6 ", "libc6 9", 1))
    assert key("base", context) != first_base
    assert key("operator", context) != first_operator
    pins.write_text(original)
    assert key("base", context) == first_base


def test_the_pinned_packages_are_read_and_written_as_debootstrap_found_them() -> None:
    pinned = debian_pins.read(REPO)
    for package in (*base.PACKAGES, "libc6", "libssl3", "python3.11", "dpkg"):
        assert package in pinned, f"{package} is not pinned"
    assert debian_pins.parse(debian_pins.render(pinned)) == pinned
    assert debian_pins.render(pinned) == (REPO / debian_pins.PINS).read_text(), "written by render()"
    with pytest.raises(ValueError, match="line 2"):
        debian_pins.parse("# comment\nlibc6\n")
    output = "ii libc6 2.36-9+deb12u14\nrc gone-package 1.0\nii  python3 3.11.2-1+b1\n"
    assert debian_pins.installed(output) == {"libc6": "2.36-9+deb12u14", "python3": "3.11.2-1+b1"}


def test_a_moved_mirror_is_one_line_naming_the_command_that_repins() -> None:
    pinned = {
        "libc6": "2.36-9+deb12u14",
        "libssl3": "3.0.20-1~deb12u2",
        "zlib1g": "1:1.2.13.dfsg-1",
        "old": "1",
    }
    assert debian_pins.difference(pinned, dict(pinned)) is None
    found = {**pinned, "libssl3": "3.0.21-1~deb12u1", "libnew": "1.0"}
    del found["old"]
    problem = debian_pins.difference(pinned, found)
    assert problem is not None
    assert "\n" not in problem
    assert "libssl3 3.0.21-1~deb12u1 where 3.0.20-1~deb12u2 is pinned" in problem
    assert "libnew 1.0 is new" in problem
    assert "old is gone" in problem
    assert debian_pins.REPIN in problem
    many = dict.fromkeys(pinned, "2")
    assert "and 1 more" in (debian_pins.difference(pinned, many) or "")


def test_a_python_name_must_get_its_python_version() -> None:
    base.check_python_name("python:3.11-slim", "3.11")
    base.check_python_name("python:3.11", "3.11")
    base.check_python_name("python:3.11.16-slim-bookworm", "3.11")
    base.check_python_name("other:3.12", "3.11")
    with pytest.raises(ValueError, match=r"python:3\.12-slim"):
        base.check_python_name("python:3.12-slim", "3.11")
    with pytest.raises(ValueError, match=r"Python 3\.11"):
        base.check_python_name("python:3.110-slim", "3.11")
    with pytest.raises(ValueError, match="Debian bookworm"):
        base.check_python_name("python:3.11.16-slim-trixie", "3.11")
