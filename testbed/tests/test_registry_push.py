"""The local registry's settings and the pusher behind `make docker-push`, against the real registry
binary on 127.0.0.1 (no cluster, no real node).

The promises: the registry listens at the node's address with TLS and htpasswd, and the node's
containerd finds its CA; `IMG` must name a host and a tag; a push sends the archive's blobs as they
are (the registry serves them back byte for byte, under the manifest digest the push returned), sends
nothing the registry holds already, and a wrong password, no password and a stopped registry are one
line each; docker-build's tag names the build docker-push pushes.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed import component_binary, free_port, http_get, serving_certificate, wait_for
from testbed.addons.optional import parse_with
from testbed.common import ToolError
from testbed.images import cache
from testbed.images import push as pusher
from testbed.images.archive import ArchiveWriter, RuntimeConfig, image_config, read_archive
from testbed.images.layers import LayerWriter
from testbed.node import nodeconfig, registry
from testbed.node.nodeconfig import NodePaths


def test_the_registry_serves_tls_with_htpasswd_at_the_nodes_address(tmp_path: Path) -> None:
    where = registry.files(tmp_path)
    settings = registry.configuration(where, tmp_path / "pki", "s3cret")
    assert settings["http"]["addr"] == f"{nodeconfig.NODE_IP}:5000" == registry.HOST
    assert settings["http"]["tls"] == {
        "certificate": str(tmp_path / "pki" / "registry.crt"),
        "key": str(tmp_path / "pki" / "registry.key"),
    }
    assert settings["auth"] == {"htpasswd": {"realm": registry.REALM, "path": str(where.htpasswd)}}
    assert settings["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "registry" / "storage")}
    assert where.hosts_toml == tmp_path / "node" / "certs.d" / registry.HOST / "hosts.toml"
    hosts = registry.hosts_toml(tmp_path / "pki" / "ca.crt")
    assert f'server = "https://{registry.HOST}"' in hosts
    assert f'ca = "{tmp_path / "pki" / "ca.crt"}"' in hosts
    config = registry.docker_config("me", "pw")
    assert config == {"auths": {registry.HOST: {"username": "me", "password": "pw", "auth": "bWU6cHc="}}}


def test_the_nodes_containerd_reads_registry_hosts_from_its_run_directory(tmp_path: Path) -> None:
    paths = NodePaths(run=tmp_path / "node", sockets=tmp_path, kubelet_root=tmp_path, images=tmp_path)
    text = nodeconfig.containerd_config(paths, "trainingjob-dev/pause:1")
    assert f"config_path = '{registry.files(tmp_path).hosts_dir}'" in text


def test_with_registry_brings_the_real_node_first() -> None:
    assert parse_with("registry") == ["real-node", "registry"]
    assert parse_with("real-node,registry,network-policies") == ["real-node", "registry", "network-policies"]


def test_img_names_a_registry_host_and_a_tag() -> None:
    assert pusher.parse_target("172.31.250.2:5000/team/trainer:1.0") == pusher.Target(
        "172.31.250.2:5000", "team/trainer", "1.0"
    )
    assert pusher.parse_target("registry.example.com/op").tag == "latest"
    for wrong, why in (
        ("trainingjob-operator:dev", "names no registry host"),
        ("localhost:5000/op@sha256:00", "has a digest"),
        ("localhost:5000/Op:1", "'Op' is not a valid name component"),
        ("localhost:5000/op:-x", "'-x' is not a valid tag"),
    ):
        with pytest.raises(ToolError, match=why):
            pusher.parse_target(wrong)


def test_credentials_come_from_a_docker_config_file(tmp_path: Path) -> None:
    auth_file = tmp_path / "config.json"
    auth_file.write_text(json.dumps(registry.docker_config("me", "pa:ss", "host:5000")))
    assert pusher.credentials_from(auth_file, "host:5000") == ("me", "pa:ss")
    assert pusher.credentials_from(auth_file, "other:5000") is None
    assert pusher.credentials_from(tmp_path / "missing.json", "host:5000") is None


# ------------------------------------------------------------------------- against the real registry


@dataclass(frozen=True)
class Running:
    host: str
    password: str
    context: ssl.SSLContext
    log: Path

    def client(self, password: str | None = "") -> pusher.Registry:
        login = None if password is None else (registry.USER, password or self.password)
        return pusher.Registry(self.host, login, self.context)

    def requests(self, method: str) -> list[str]:
        """The access log's request lines with this method."""
        return [line for line in self.log.read_text().splitlines() if f'"{method} /v2/' in line]


@pytest.fixture
def local_registry(tmp_path: Path) -> Iterator[Running]:
    """The registry binary on 127.0.0.1 with the settings of the cluster's (its own CA and password)."""
    pki = serving_certificate(tmp_path / "pki", "registry")
    host = f"127.0.0.1:{free_port()}"
    where = registry.files(tmp_path)
    where.directory.mkdir(parents=True)
    password = "a-password-of-this-test"
    where.htpasswd.write_text(registry.bcrypt_entry(registry.USER, password))
    where.config.write_text(json.dumps(registry.configuration(where, pki, "secret", address=host)))
    log = tmp_path / "registry.log"
    binary = component_binary(registry.BUILD)
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(binary), "serve", str(where.config)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
        )
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    try:
        wait_for(
            "the registry asking for credentials",
            lambda: http_get(f"https://{host}/v2/", context=context)[0] == 401,
            timeout=60,
        )
        yield Running(host, password, context, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


def small_image(directory: Path) -> cache.Image:
    """An image of two small layers, in the archive format the images' builder writes."""
    archive_path = directory / "image.tar"
    archive = ArchiveWriter(archive_path, ("small:1",))

    def one_file(number: int) -> Callable[[LayerWriter], None]:
        return lambda layer: layer.add_bytes(f"file-{number}", f"layer {number}\n".encode())

    layers = [archive.add_layer(one_file(number)) for number in (1, 2)]
    config = image_config(
        RuntimeConfig(env=()), [layer.diff_id for layer in layers], [], "1970-01-01T00:00:00Z"
    )
    digest = archive.finish(config)
    return cache.Image("small", "k", ("small:1",), archive_path, True, digest, archive_path.stat().st_size)


@pytest.mark.components
@pytest.mark.builds(registry.BUILD)
def test_a_push_sends_the_archives_blobs_as_they_are_and_nothing_twice(
    local_registry: Running, tmp_path: Path
) -> None:
    image = small_image(tmp_path)
    target = pusher.parse_target(f"{local_registry.host}/team/small:1")
    digest = pusher.push(image, target, local_registry.client())

    client = local_registry.client()
    manifest = client.request("GET", "/v2/team/small/manifests/1", headers={"Accept": pusher.OCI_MANIFEST})
    assert manifest.status == 200
    assert f"sha256:{hashlib.sha256(manifest.body).hexdigest()}" == digest
    assert client.manifest_digest("team/small", "1") == digest
    contents = read_archive(image.archive)
    described = json.loads(manifest.body)
    assert described["config"]["digest"] == contents.config_digest == image.config_digest
    with tarfile.open(image.archive) as archive:
        for layer, member in zip(described["layers"], contents.layer_members, strict=True):
            blob = client.request("GET", f"/v2/team/small/blobs/{layer['digest']}")
            stream = archive.extractfile(member)
            assert stream is not None
            assert blob.body == stream.read()
            assert layer["mediaType"] == pusher.OCI_LAYER_GZIP
    assert len(local_registry.requests("POST")) == 3  # two layers and the config

    again = pusher.push(image, pusher.parse_target(f"{local_registry.host}/team/small:2"), client)
    assert again == digest
    assert len(local_registry.requests("POST")) == 3  # every blob was there: only a manifest more


@pytest.mark.components
@pytest.mark.builds(registry.BUILD)
def test_a_refused_or_absent_registry_is_one_line(local_registry: Running, tmp_path: Path) -> None:
    image = small_image(tmp_path)
    target = pusher.parse_target(f"{local_registry.host}/team/small:1")
    with pytest.raises(ToolError, match=r"refused the push: 401 Unauthorized \(wrong credentials\)"):
        pusher.push(image, target, local_registry.client("not-the-password"))
    with pytest.raises(
        ToolError, match=r"401 Unauthorized \(it wants credentials and none are known for it\)"
    ):
        pusher.push(image, target, local_registry.client(None))
    nowhere = pusher.Registry(f"127.0.0.1:{free_port()}", None, local_registry.context)
    with pytest.raises(ToolError, match=r"cannot reach the registry 127\.0\.0\.1:"):
        pusher.push(image, target, nowhere)
    assert local_registry.requests("PUT") == []


def test_a_tag_names_the_build_docker_push_pushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TJ_CACHE_DIR", str(tmp_path / "cache"))
    built = cache.build_dir("small", "k1")
    built.mkdir(parents=True)
    (built / cache.METADATA).write_text(
        json.dumps({"references": ["small:1"], "config_digest": "sha256:00", "size": 1, "build_seconds": 0})
    )
    with pytest.raises(ToolError, match="no image is tagged host:5000/small:1: `make docker-build IMG="):
        pusher.tagged("host:5000/small:1")
    pusher.tag(cache.cached("small", "k1", ("small:1",)), "host:5000/small:1")
    assert pusher.tagged("host:5000/small:1").key == "k1"
    pusher.tag(cache.Image("small", "k2", (), built, True), "host:5000/small:2")
    with pytest.raises(ToolError, match=r"\(small k2\) is no longer in the cache"):
        pusher.tagged("host:5000/small:2")
    with pytest.raises(ToolError, match="names no registry host"):
        pusher.tag(cache.cached("small", "k1", ()), "small:3")
    # The tag of the build the cache no longer holds goes with the next tag; the latest KEEP_TAGS stay.
    for number in range(pusher.KEEP_TAGS + 5):
        pusher.tag(cache.cached("small", "k1", ()), f"host:5000/small:n{number}")
    kept = list(pusher.read_tags())
    assert len(kept) == pusher.KEEP_TAGS
    assert kept[-1] == f"host:5000/small:n{pusher.KEEP_TAGS + 4}"
    assert "host:5000/small:2" not in kept
