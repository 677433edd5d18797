"""Image references as the project writes them (no registry host) and as containerd files them.

Why: no registry host name is written in the repository, so every reference here is a short Docker
reference (`python:3.11-slim`, `trainingjob-dev/pause:1`). containerd normalizes a docker-archive's
RepoTags on import the way Docker does: a one-part name gets `library/`, a missing tag becomes
`latest`, and the whole is put under Docker's default domain. `repository_path` computes everything
but that domain, which containerd adds (and which the tests read back from containerd, instead of
naming it here).
"""

from __future__ import annotations

import re
from typing import Final

# Docker's grammar for a path component and a tag (distribution/reference).
COMPONENT: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
TAG: Final = re.compile(r"[\w][\w.-]{0,127}\Z")


def _split(reference: str) -> tuple[str, str]:
    """(name, tag) of `name[:tag]`; a colon inside the first component would be a host's port."""
    name, _, tail = reference.rpartition(":")
    if not name or "/" in tail:
        return reference, ""
    return name, tail


def has_registry_host(reference: str) -> bool:
    """Whether the reference names a registry: a first component with a dot or a port, or localhost."""
    first, slash, _ = reference.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def check_reference(reference: str) -> str:
    """The reference itself if it is a short Docker reference (no host, no digest); ValueError naming
    what is wrong otherwise."""
    if has_registry_host(reference):
        raise ValueError(f"image reference {reference!r} names a registry host: write it without one")
    if "@" in reference:
        raise ValueError(f"image reference {reference!r} has a digest: an archive needs tags")
    name, tag = _split(reference)
    if tag and not TAG.match(tag):
        raise ValueError(f"image reference {reference!r}: {tag!r} is not a valid tag")
    for component in name.split("/"):
        if not COMPONENT.match(component):
            raise ValueError(f"image reference {reference!r}: {component!r} is not a valid name component")
    return reference


def repository_path(reference: str) -> str:
    """What containerd files a short reference under, after its default domain and a slash:
    `python:3.11-slim` -> `library/python:3.11-slim`, `trainingjob-operator` ->
    `library/trainingjob-operator:latest`, `trainingjob-dev/pause:1` unchanged."""
    name, tag = _split(check_reference(reference))
    if "/" not in name:
        name = f"library/{name}"
    return f"{name}:{tag or 'latest'}"
