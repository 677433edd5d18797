"""Tagging a built image with a registry reference and pushing it there: `make docker-build` and
`make docker-push` on a machine without a Docker engine.

Why a pusher of its own, and not `buildah push`: buildah pushes from its own image storage, so an
archive built here would first be copied into one (every layer unpacked with the vfs driver: 225 MB
for the operator, 5.4 GB for the torch trainer), under a private mount namespace (buildah 1.28 writes
under /var/lib/containers whatever its root says), and recompressed on the way out. This sends the
archive's blobs as they are, through the OCI distribution API (a blob upload per layer and the config,
a blob the registry holds already skipped, then the manifest): the registry holds the layers `ctr
import` would, byte for byte, the push needs no root, and it takes seconds. It speaks HTTPS with
Basic authentication, which the local registry (testbed/node/registry.py) and any htpasswd-protected
registry use; a registry that hands out bearer tokens (most public ones) is pushed to with a Docker
engine (`make docker-push CONTAINER_TOOL=docker`).

A tag is a record, `IMG` -> (image name, key), in the images' cache (`tags.json`): `docker-build`
writes it, `docker-push` pushes the build it names, as a Docker engine's tag names an image ID.
Standard library only, like the rest of testbed/images.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import os
import ssl
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit

from testbed.common import ToolError
from testbed.images import cache
from testbed.images.archive import read_archive
from testbed.images.refs import COMPONENT, TAG, has_registry_host

OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
TIMEOUT: Final = 300.0
BLOCK: Final = 1 << 20
KEEP_TAGS: Final = 100


@dataclass(frozen=True)
class Target:
    """Where `IMG` says to push: `host[:port]/path:tag`."""

    host: str
    path: str
    tag: str

    @property
    def reference(self) -> str:
        return f"{self.host}/{self.path}:{self.tag}"


def parse_target(text: str) -> Target:
    """`IMG` as a registry reference with a host and a tag (`latest` when none is given)."""
    if not has_registry_host(text):
        raise ToolError(f"IMG={text!r} names no registry host: write it as <host[:port]>/<name>:<tag>")
    if "@" in text:
        raise ToolError(f"IMG={text!r} has a digest: push to a tag")
    host, _, rest = text.partition("/")
    path, _, tag = rest.partition(":")  # past the host, a colon starts the tag
    tag = tag or "latest"
    if not TAG.match(tag):
        raise ToolError(f"IMG={text!r}: {tag!r} is not a valid tag")
    for component in path.split("/"):
        if not COMPONENT.match(component):
            raise ToolError(f"IMG={text!r}: {component!r} is not a valid name component")
    return Target(host, path, tag)


# ------------------------------------------------------------------------------------------- tags


def tags_file() -> Path:
    return cache.cache_root() / "tags.json"


def read_tags() -> dict[str, dict[str, str]]:
    try:
        found = json.loads(tags_file().read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def tag(image: cache.Image, reference: str) -> None:
    """Records that `reference` names this build of `image` (what `docker tag` does). Tags of builds
    the cache no longer holds are dropped, and all but the latest KEEP_TAGS (each deploy test tags a
    reference of its own)."""
    parse_target(reference)
    tags = {
        name: entry
        for name, entry in read_tags().items()
        if name != reference and cache.build_dir(entry["image"], entry["key"]).is_dir()
    }
    tags[reference] = {"image": image.name, "key": image.key}
    tags = dict(list(tags.items())[-KEEP_TAGS:])
    path = tags_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".tags.{os.getpid()}.json")
    partial.write_text(json.dumps(tags, indent=2) + "\n")
    partial.replace(path)


def tagged(reference: str) -> cache.Image:
    """The build `reference` was tagged with (`make docker-build IMG=...`), still in the cache."""
    entry = read_tags().get(reference)
    if entry is None:
        raise ToolError(f"no image is tagged {reference}: `make docker-build IMG={reference}` first")
    image = cache.cached(entry["image"], entry["key"], ())
    if not image.built:
        raise ToolError(
            f"the build tagged {reference} ({entry['image']} {entry['key']}) is no longer in the cache: "
            f"`make docker-build IMG={reference}` again"
        )
    return image


# ------------------------------------------------------------------------------------------- push


def credentials_from(auth_file: Path, host: str) -> tuple[str, str] | None:
    """The user and password a docker config file holds for `host` (its `auth`: base64 of
    user:password), or None; a missing file holds none."""
    if not auth_file.exists():
        return None
    try:
        entry = json.loads(auth_file.read_text()).get("auths", {}).get(host)
    except (OSError, ValueError) as error:
        raise ToolError(f"cannot read the credentials in {auth_file}: {error}") from None
    if not entry or "auth" not in entry:
        return None
    user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
    return user, password


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Registry:
    """One registry's HTTP API over TLS, with Basic credentials when given."""

    def __init__(self, host: str, login: tuple[str, str] | None, context: ssl.SSLContext) -> None:
        self.host = host
        self.context = context
        self.headers: dict[str, str] = {}
        if login is not None:
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"

    def request(
        self,
        method: str,
        url: str,
        body: bytes | Readable | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """One request to a path of the registry, or to a URL it gave (an upload's Location)."""
        parts = urlsplit(url if "://" in url else f"https://{self.host}{url}")
        if parts.netloc != self.host:
            raise ToolError(f"the registry {self.host} sent the push to another host: {url}")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection = http.client.HTTPSConnection(
            self.host, timeout=TIMEOUT, context=self.context, blocksize=BLOCK
        )
        try:
            connection.request(method, target, body=body, headers={**self.headers, **(headers or {})})
            response = connection.getresponse()
            answer = Answer(
                response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
            )
        except (OSError, http.client.HTTPException) as error:
            raise ToolError(f"cannot reach the registry {self.host}: {error}") from None
        finally:
            connection.close()
        if answer.status == 401:
            why = "wrong credentials" if self.headers else "it wants credentials and none are known for it"
            raise ToolError(f"the registry {self.host} refused the push: 401 Unauthorized ({why})")
        return answer

    def expect(self, answer: Answer, status: int, what: str) -> None:
        if answer.status != status:
            text = answer.body.decode(errors="replace")[:300]
            raise ToolError(f"{what}: the registry {self.host} answered {answer.status}: {text}")

    def upload(self, path: str, digest: str, size: int, source: Readable) -> bool:
        """Uploads one blob unless the registry has it; whether it was sent."""
        if self.request("HEAD", f"/v2/{path}/blobs/{digest}").status == 200:
            return False
        started = self.request("POST", f"/v2/{path}/blobs/uploads/")
        self.expect(started, 202, f"starting the upload of {digest}")
        location = started.headers.get("location", "")
        separator = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        done = self.request("PUT", f"{location}{separator}digest={digest}", source, headers)
        self.expect(done, 201, f"uploading {digest}")
        return True

    def manifest_digest(self, path: str, tag: str) -> str | None:
        """The digest of the manifest `path:tag` names, or None when there is none."""
        answer = self.request("HEAD", f"/v2/{path}/manifests/{tag}", headers={"Accept": OCI_MANIFEST})
        return answer.headers.get("docker-content-digest") if answer.status == 200 else None


class _Hashing:
    """A readable stream that hashes what is read through it (a blob's digest, checked after)."""

    def __init__(self, source: Readable) -> None:
        self.source = source
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1, /) -> bytes:
        data = self.source.read(size)
        self.sha256.update(data)
        return data


def push(image: cache.Image, target: Target, registry: Registry) -> str:
    """Pushes the archive's blobs and an OCI manifest of them tagged `target.tag`; returns the
    manifest's digest (what a node that pulls it reports in the pod's imageID)."""
    contents = read_archive(image.archive)
    layers: list[dict[str, object]] = []
    with tarfile.open(image.archive, "r:") as archive:
        for name in contents.layer_members:
            member = archive.getmember(name)
            digest = "sha256:" + name.removesuffix(".tar.gz")
            stream = archive.extractfile(member)
            if stream is None:
                raise ToolError(f"{image.archive}: layer {name} is not a file")
            hashing = _Hashing(stream)
            uploaded = registry.upload(target.path, digest, member.size, hashing)
            if uploaded and f"sha256:{hashing.sha256.hexdigest()}" != digest:
                raise ToolError(f"{image.archive}: layer {name} does not match its digest")
            layers.append({"mediaType": OCI_LAYER_GZIP, "digest": digest, "size": member.size})
        config = json.dumps(contents.config, sort_keys=True, separators=(",", ":")).encode()
        if f"sha256:{hashlib.sha256(config).hexdigest()}" != contents.config_digest:
            raise ToolError(f"{image.archive}: its config does not match its digest")
        registry.upload(target.path, contents.config_digest, len(config), _Hashing(io.BytesIO(config)))
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": contents.config_digest, "size": len(config)},
        "layers": layers,
    }
    body = json.dumps(manifest, separators=(",", ":")).encode()
    sent = registry.request(
        "PUT", f"/v2/{target.path}/manifests/{target.tag}", body, {"Content-Type": OCI_MANIFEST}
    )
    registry.expect(sent, 201, f"putting the manifest of {target.reference}")
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    filed = sent.headers.get("docker-content-digest")
    if filed and filed != digest:
        raise ToolError(f"the registry filed the manifest of {target.reference} as {filed}, not {digest}")
    return digest
