"""The `operator` image: the project's Dockerfile, built with buildah on the local base image.

Why buildah: the Dockerfile stays the one users build with Docker, and buildah builds it without a
daemon, as root, in a chroot (`--isolation chroot`, the host's network for pip). Its base image comes
from the `base` archive, tagged under the names it stands in for, and nothing is ever pulled
(`--pull=never`, an empty registries.conf). The Dockerfile's FROM names its base by digest, which
only the upstream image has, so buildah gets a copy of it with the digests dropped
(testbed/images/dockerfile.py `without_digests`), in the build's work directory: the FROM then names the
stand-in by the tag the digest was taken from, and everything else is the file users build.
Everything buildah keeps lives in the build's temporary directory: its storage (`--root`, vfs, so no
overlay mounts), its run directory, its policy and configuration files. buildah 1.28 also writes a
blob-info cache under /var/lib/containers whatever `--root` says, so it runs in a private mount
namespace with a throwaway tmpfs on /var/lib: the machine's /var/lib is never written, and no mount
outlives the command. The result is pushed to an OCI layout and its gzip layers are copied into the
docker archive as they are.

The key covers the Dockerfile (its digests included), .dockerignore, every file the COPY lines copy
(read from the Dockerfile, less what .dockerignore leaves out), and the base image's key. References:
setup.cfg's `<name>:<version>` (what the kustomization and the Helm chart deploy) and `<name>:latest`
(what deploy/base/deployment.yaml names before kustomize sets the tag).
"""

from __future__ import annotations

import configparser
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from testbed.common import in_private_mounts
from testbed.images import dockerfile
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe
from testbed.images.steps import Steps, mounts_under

POLICY: Final = {"default": [{"type": "insecureAcceptAnything"}]}
# What buildah runs after, in a mount namespace of its own (testbed.common.in_private_mounts): see the
# docstring.
PRIVATE_VAR_LIB: Final = 'mount -t tmpfs -o size=16m,mode=0755 buildah-var-lib /var/lib && exec "$@"'
GZIP_LAYER: Final = "application/vnd.oci.image.layer.v1.tar+gzip"


def references(context: Context) -> tuple[str, ...]:
    """`<name>:<version>` from setup.cfg, and `<name>:latest`."""
    parser = configparser.ConfigParser()
    parser.read(context.repo / "setup.cfg", encoding="utf-8")
    name, version = parser["metadata"]["name"], parser["metadata"]["version"]
    return (f"{name}:{version}", f"{name}:latest")


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    dockerfile_path = context.repo / "Dockerfile"
    ignore_path = context.repo / ".dockerignore"
    ignore_text = ignore_path.read_text(encoding="utf-8") if ignore_path.exists() else ""
    into.file("Dockerfile", dockerfile_path)
    into.text(".dockerignore", ignore_text)
    text = dockerfile_path.read_text(encoding="utf-8")
    into.files(context.repo, dockerfile.context_files(context.repo, text, ignore_text))


class Buildah:
    """buildah with private storage and configuration under `root`, in a private mount namespace."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for directory in ("storage", "run", "tmp"):
            (root / directory).mkdir(parents=True)
        (root / "policy.json").write_text(json.dumps(POLICY))
        (root / "registries.conf").write_text("# nothing is pulled: every image comes from a local archive\n")
        (root / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "storage"}"\nrunroot = "{root / "run"}"\n'
        )
        self.env = dict(
            os.environ,
            CONTAINERS_REGISTRIES_CONF=str(root / "registries.conf"),
            CONTAINERS_STORAGE_CONF=str(root / "storage.conf"),
            TMPDIR=str(root / "tmp"),
        )

    def command(self, *arguments: str) -> list[str]:
        storage = [
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "vfs",
        ]
        return in_private_mounts(PRIVATE_VAR_LIB, "buildah", *storage, *arguments)

    def run(self, steps: Steps, what: str, command: str, *arguments: str) -> None:
        """`buildah COMMAND ARGUMENTS...` as a step of the build; the commands that copy images get
        the private signature policy."""
        policy = (
            [f"--signature-policy={self.root / 'policy.json'}"] if command in ("pull", "bud", "push") else []
        )
        steps.run(what, self.command(command, *policy, *arguments), env=self.env)


def read_oci_layout(layout: Path) -> tuple[dict[str, Any], list[Path]]:
    """The config and the layer blobs (in order) of the one image in an OCI layout."""
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]

    def blob(digest: str) -> Path:
        algorithm, encoded = digest.split(":", 1)
        return layout / "blobs" / algorithm / encoded

    manifest = json.loads(blob(entry["digest"]).read_text())
    for layer in manifest["layers"]:
        if layer["mediaType"] != GZIP_LAYER:
            raise ValueError(f"layer {layer['digest']} is {layer['mediaType']}, not gzip")
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    return config, [blob(layer["digest"]) for layer in manifest["layers"]]


def build(build: Build) -> dict[str, object]:
    base = build.dependencies["base"]
    buildah = Buildah(build.work / "buildah")
    buildah.run(build.steps, "load the base image", "pull", f"docker-archive:{base.archive}")
    image_id = base.config_digest.removeprefix("sha256:")
    for reference in base.references:
        buildah.run(build.steps, f"name it {reference}", "tag", image_id, reference)
    iidfile = build.work / "image-id"
    repo = build.context.repo
    local_dockerfile = build.work / "Dockerfile"
    local_dockerfile.write_text(
        dockerfile.without_digests((repo / "Dockerfile").read_text(encoding="utf-8")), encoding="utf-8"
    )
    buildah.run(
        build.steps,
        "buildah bud the Dockerfile, its FROM without the digest (pip installs the locked dependencies)",
        "bud",
        "--isolation=chroot",
        "--network=host",
        "--pull=never",
        f"--iidfile={iidfile}",
        "-f",
        str(local_dockerfile),
        str(repo),
    )
    layout = build.work / "oci"
    gzip_level_1 = ("--compression-format=gzip", "--compression-level=1")
    buildah.run(build.steps, "export it", "push", *gzip_level_1, iidfile.read_text().strip(), f"oci:{layout}")
    left = mounts_under(build.work)
    if left:
        build.steps.fail(f"buildah left mounts behind: {', '.join(map(str, left))}")
    config, blobs = read_oci_layout(layout)
    for blob, diff_id in zip(blobs, config["rootfs"]["diff_ids"], strict=True):
        with blob.open("rb") as source:
            build.archive.copy_layer(source, diff_id)
    return dict(config)


RECIPE: Final = Recipe(
    name="operator",
    summary="the project's Dockerfile built with buildah on the base image",
    revision=2,
    references=references,
    inputs=inputs,
    build=build,
    depends=("base",),
    tools=(("buildah", "buildah"), ("unshare", "util-linux")),
    needs_root=True,
)
