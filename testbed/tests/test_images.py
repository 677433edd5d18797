"""testbed/images, without building: keys, references, the apt mirror, the Dockerfile, archives, the cache.

The promises checked here: an image's key changes when one of its inputs changes (a Dockerfile line,
a file the Dockerfile copies, the project's version, the machine's CA certificates or mirror, a
package of the trainer) and only then (not for a file .dockerignore leaves out, nor for a touched
file); references carry no registry host and are normalized as containerd does; the mirror is read
from apt sources in both formats; the examples' images are read as a YAML parser reads them; an
archive holds what containerd's importer needs; a failed build leaves nothing in the cache.
The images themselves are built and checked in testbed/tests/test_images_build.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from crd.contract import DEFAULT_IMAGES
from testbed.common import REPO, Say, ToolError
from testbed.images import apt_sources, base, cache, dockerfile, operator, previous, refs, trainer
from testbed.images.archive import ArchiveWriter, RuntimeConfig, image_config, read_archive
from testbed.images.builder import IMAGES, describe, key_inputs
from testbed.images.closure import closure, record_digest
from testbed.images.elf import is_static_executable
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Context
from testbed.images.steps import Steps, mounts_under

DEB822 = """\
Types: deb-src
URIs: http://source.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

# the one apt uses
Types: deb
URIs: http://mirror.example/debian/
Suites: bookworm
 bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb-src http://source.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://one.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
"""


def test_the_mirror_is_read_from_a_deb822_source() -> None:
    sources = apt_sources.parse_deb822(DEB822)
    assert apt_sources.mirror_for(sources, "bookworm") == "http://mirror.example/debian"
    assert apt_sources.mirror_for(sources, "bookworm-updates") == "http://mirror.example/debian"
    with pytest.raises(ToolError, match="trixie"):
        apt_sources.mirror_for(sources, "trixie")


def test_the_mirror_is_read_from_a_one_line_source() -> None:
    sources = apt_sources.parse_one_line(ONE_LINE)
    assert apt_sources.mirror_for(sources, "bookworm") == "http://one.example/debian"
    assert apt_sources.mirror_for(sources, "bookworm-security") == "http://security.example/debian-security"


def test_the_machine_mirror_comes_from_the_files_apt_reads(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://old.example/debian bullseye main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "first.list.disabled").write_text(
        "deb http://off.example/debian bookworm main\n"
    )
    assert apt_sources.machine_mirror("bookworm", tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    with pytest.raises(ToolError, match="no apt source for Debian bookworm"):
        apt_sources.machine_mirror("bookworm", tmp_path)


# ------------------------------------------------------------------------------------- Dockerfile


def test_the_dockerfile_is_read_for_its_base_and_its_copies() -> None:
    text = """\
# comment
FROM --platform=linux/amd64 python:3.11-slim AS build
COPY --chown=1:1 a.txt b/ \\
     ./
COPY ["c d", "/e"]
COPY --from=build /opt/venv /opt/venv
ADD f.tar /
FROM build AS again
FROM scratch
FROM busybox:1
"""
    assert dockerfile.base_images(text) == ("python:3.11-slim", "busybox:1")
    assert dockerfile.copied_sources(text) == ("a.txt", "b/", "c d", "f.tar")
    project = (REPO / "Dockerfile").read_text()
    (pinned,) = dockerfile.base_images(project)
    assert base.references(Context())[0] == dockerfile.without_digest(pinned)


@pytest.mark.parametrize(
    ("patterns", "path", "ignored"),
    [
        ("**/__pycache__", "controller/__pycache__/x.cpython-311.pyc", True),
        ("**/__pycache__", "__pycache__/x.pyc", True),
        ("**/*.pyc", "controller/runtime/x.pyc", True),
        ("tests", "tests/unit/test_a.py", True),
        ("tests", "controller/tests.py", False),
        ("*.egg-info", "trainingjob_operator.egg-info/PKG-INFO", True),
        ("*.egg-info", "controller/x.egg-info", False),
        ("docs\n!docs/keep.md", "docs/keep.md", False),
        ("docs\n!docs/keep.md", "docs/other.md", True),
        ("# comment\n/build/", "build/lib/x.py", True),
        ("contr?ller", "controller/x.py", True),
    ],
)
def test_dockerignore_patterns_follow_dockers_rules(patterns: str, path: str, ignored: bool) -> None:
    assert dockerfile.is_ignored(dockerfile.ignore_patterns(patterns), path) is ignored


def test_the_context_files_are_what_the_copy_lines_copy() -> None:
    text = (REPO / "Dockerfile").read_text()
    files = dockerfile.context_files(REPO, text, (REPO / ".dockerignore").read_text())
    tracked = subprocess.run(
        ["git", "ls-files", "--", *dockerfile.copied_sources(text)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(tracked) <= set(files)
    assert "controller/cli.py" in files
    assert "setup.cfg" in files
    assert not [name for name in files if "__pycache__" in name or name.startswith(("tests/", "docs/"))]


# ------------------------------------------------------------------------------------------ keys


def key(name: str, context: Context) -> str:
    return key_inputs(name, context).key()


def test_the_operator_key_changes_with_each_input_and_only_then(context: Context) -> None:
    repo = context.repo
    first = key("operator", context)
    assert key("operator", context) == first
    # What the build never sees: a touched file, bytecode, a file .dockerignore leaves out.
    os.utime(repo / "controller" / "cli.py", (1, 1))
    (repo / "controller" / "__pycache__").mkdir(exist_ok=True)
    (repo / "controller" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"bytecode")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("x = 1\n")
    assert key("operator", context) == first

    for path, change in (
        (repo / "Dockerfile", "EXPOSE 9090\n"),
        (repo / "controller" / "cli.py", "# a changed line\n"),
        (repo / "trainer" / "train.py", "# a changed line\n"),
        (repo / "requirements" / "runtime.txt", "# a changed line\n"),
        (repo / "image" / "runtime_root.py", "# a changed line\n"),
    ):
        original = path.read_bytes()
        path.write_bytes(original + change.encode())
        assert key("operator", context) != first, f"a change to {path.name} keeps the key"
        path.write_bytes(original)
        assert key("operator", context) == first

    (repo / "controller" / "new_module.py").write_text('"""New."""\n')
    assert key("operator", context) != first
    (repo / "controller" / "new_module.py").unlink()

    setup = (repo / "setup.cfg").read_text()
    (repo / "setup.cfg").write_text(setup.replace("version = 0.1.0", "version = 0.2.0"))
    assert "trainingjob-operator:0.2.0" in operator.references(context)
    assert key("operator", context) != first
    (repo / "setup.cfg").write_text(setup)
    assert key("operator", context) == first


def test_the_previous_operator_is_its_pinned_commit_on_the_base(context: Context) -> None:
    """Its key is the commit's and the base's: this tree's files are not its inputs. The commit is in
    the repository's history (a full clone's), under the reference the upgrade test pushes."""
    first = key(previous.NAME, context)
    cli = context.repo / "controller" / "cli.py"
    cli.write_text(cli.read_text() + "# a changed line\n")
    assert key(previous.NAME, context) == first
    (context.ca_dir / "extra.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    assert key(previous.NAME, context) != first, "it is built on the base"
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-t", previous.PREVIOUS_COMMIT],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.stdout.strip() == "commit", found.stderr
    assert previous.references(context) == (f"trainingjob-operator:previous-{previous.PREVIOUS_COMMIT[:7]}",)


def test_the_base_key_covers_the_ca_certificates_and_the_mirror(context: Context) -> None:
    first_base, first_operator = key("base", context), key("operator", context)
    (context.ca_dir / "extra.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    assert key("base", context) != first_base
    assert key("operator", context) != first_operator, "the operator image is built on the base"
    (context.ca_dir / "extra.crt").unlink()
    assert key("base", context) == first_base
    (context.apt_dir / "sources.list").write_text("deb http://other.example/debian bookworm main\n")
    assert key("base", context) != first_base


def test_the_trainer_key_changes_with_a_package_version() -> None:
    def closure_key(*distributions: trainer.Distribution) -> str:
        into = KeyInputs()
        trainer.closure_inputs(trainer.Closure("3.11", distributions), into)
        return into.key()

    site = Path("/venv/lib/python3.11/site-packages")
    torch = trainer.Distribution("torch", "2.15.0", site, "a" * 64, ("torch/__init__.py",))
    sympy = trainer.Distribution("sympy", "1.14.0", site, "b" * 64, ("sympy/__init__.py",))
    first = closure_key(torch, sympy)
    assert closure_key(torch, sympy) == first
    newer = trainer.Distribution("sympy", "1.14.1", site, "b" * 64, ("sympy/__init__.py",))
    assert closure_key(torch, newer) != first
    rebuilt = trainer.Distribution("sympy", "1.14.0", site, "c" * 64, ("sympy/__init__.py",))
    assert closure_key(torch, rebuilt) != first
    assert closure_key(torch) != first


# ------------------------------------------------------------------------------------ references


@pytest.mark.parametrize(
    ("reference", "path"),
    [
        ("python:3.11-slim", "library/python:3.11-slim"),
        ("trainingjob-operator", "library/trainingjob-operator:latest"),
        ("trainingjob-operator:0.1.0", "library/trainingjob-operator:0.1.0"),
        ("trainingjob-dev/pause:1", "trainingjob-dev/pause:1"),
        ("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime", "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"),
    ],
)
def test_references_are_normalized_as_containerd_does(reference: str, path: str) -> None:
    assert refs.repository_path(reference) == path


@pytest.mark.parametrize(
    ("reference", "complaint"),
    [
        ("registry.example:5000/team/x:1", "registry host"),
        ("localhost/x:1", "registry host"),
        ("x@sha256:" + "0" * 64, "digest"),
        ("Team/x:1", "name component"),
        ("x:bad+tag", "not a valid tag"),
    ],
)
def test_a_reference_with_a_host_or_a_bad_part_is_refused(reference: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        refs.check_reference(reference)


def test_every_image_is_filed_under_short_references_only() -> None:
    for name in IMAGES:
        image = describe(name)
        assert image.references, name
        for reference in image.references:
            refs.check_reference(reference)
    assert describe("operator").references == ("trainingjob-operator:0.1.0", "trainingjob-operator:latest")


def test_the_example_jobs_are_read_as_yaml_reads_them() -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        expected = [
            trainer.ExampleJob(
                doc["spec"].get("framework"),
                doc["spec"].get("image"),
                "imagePullSecrets" in doc["spec"].get("podTemplate", {}).get("spec", {}),
            )
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "TrainingJob"
        ]
        assert trainer.example_jobs(path.read_text()) == expected, path.name


def test_the_torch_image_stands_in_for_the_public_pytorch_images() -> None:
    texts = [path.read_text() for path in sorted((REPO / "examples").glob("*.yaml"))]
    images = trainer.public_images("pytorch", "pytorch", texts)
    assert images[0] == DEFAULT_IMAGES["pytorch"]
    assert "pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime" in images  # examples/trainingjob-distributed.yaml
    assert "myteam/trainer:1.0" not in images, "a private image (pulled with imagePullSecrets) is the user's"
    assert "python:3.12-slim" not in images, "an init container's image is not the trainer's"
    assert trainer.tag_safe("2.15.0+cu132") == "2.15.0-cu132"
    version = describe("trainer-torch").references[0]
    assert version.startswith("trainingjob-trainer:torch-")


def test_the_trainer_layer_maps_the_virtualenv_onto_debians_python() -> None:
    venv = Path("/venv")
    torch = trainer.Distribution("torch", "2.15.0", venv / "lib/python3.11/site-packages", "a" * 64, ())
    assert trainer.environment_root(torch) == venv
    assert trainer.image_path(torch, "torch/__init__.py") == (
        "usr/local/lib/python3.11/dist-packages/torch/__init__.py"
    )
    assert trainer.image_path(torch, "../../../bin/torchrun") == "usr/local/bin/torchrun"
    assert trainer.image_path(torch, "../../../../elsewhere/x") is None
    script = b"#!/venv/bin/python\nimport sys\n"
    assert trainer.script_for_image(script, venv) == b"#!/usr/bin/python3\nimport sys\n"
    assert trainer.script_for_image(b"#!/bin/sh\necho\n", venv) is None
    assert trainer.script_for_image(b"#!/venvs/other/bin/python\n", venv) is None
    assert trainer.script_for_image(b"\x7fELF...", venv) is None


def test_a_records_digest_does_not_depend_on_the_virtualenvs_path() -> None:
    """Two checkouts with the same packages key the same image: a console script's hash carries its
    `#!` line, which names the virtualenv, and pip marks a distribution asked for by name; a file
    inside site-packages changing changes the key."""
    inside = "torch/__init__.py,sha256=AAA,10\ntorch-2.9.dist-info/entry_points.txt,sha256=BBB,20\n"
    here = inside + "../../../bin/torchrun,sha256=CCC,200\n"
    there = inside + "../../../bin/torchrun,sha256=DDD,207\n"
    assert record_digest(here) == record_digest(there)
    assert record_digest(here.replace("AAA", "EEE")) != record_digest(here)
    assert record_digest(here.replace("entry_points.txt", "entry_points.txt.old")) != record_digest(here)
    asked_for = here + "torch-2.9.dist-info/REQUESTED,,0\ntorch-2.9.dist-info/INSTALLER,,4\n"
    assert record_digest(asked_for) == record_digest(here)
    assert record_digest(here + "torch/REQUESTED,sha256=47D,0\n") != record_digest(here)


def test_the_closure_follows_requirements_markers_and_extras() -> None:
    requires = {
        "torch": ['toolkit[blas]==1; platform_system == "Linux"', "sympy", 'optree; extra == "optree"'],
        "toolkit": ['nvidia-blas; extra == "blas"', 'nvidia-fft; extra == "fft"'],
        "sympy": ["mpmath", 'old-thing; python_version < "3"'],
        "nvidia-blas": [],
        "mpmath": [],
    }
    names = closure(["torch"], lambda name: requires[name], lambda name: name in requires)
    assert names == ["torch", "toolkit", "sympy", "nvidia-blas", "mpmath"]
    with pytest.raises(ValueError, match="mpmath is required but not installed"):
        closure(["torch"], lambda name: requires[name], lambda name: name != "mpmath")


# --------------------------------------------------------------------------------------- archives


def test_an_archive_holds_what_containerds_importer_reads(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "hostname").write_text("image\n")
    os.link(rootfs / "etc" / "hostname", rootfs / "etc" / "hostname.copy")
    (rootfs / "etc" / "link").symlink_to("hostname")
    (rootfs / "dev").mkdir()
    (rootfs / "dev" / "not-in-an-image").write_text("x")
    archive_path = tmp_path / "image.tar"
    archive = ArchiveWriter(archive_path, ("trainingjob-dev/test:1", "test:latest"))
    first = archive.add_layer(lambda layer: layer.add_tree(rootfs))
    second = archive.add_layer(lambda layer: layer.add_bytes("usr/local/bin/tool", b"#!/bin/sh\n", 0o755))
    config = image_config(
        RuntimeConfig(env=("PATH=/bin",), entrypoint=("/tool",), user="1:1"),
        [first.diff_id, second.diff_id],
        [],
        "2026-01-01T00:00:00Z",
    )
    digest = archive.finish(config)

    contents = read_archive(archive_path)
    assert contents.references == ("trainingjob-dev/test:1", "test:latest")
    assert contents.config_digest == digest
    assert contents.config["config"]["Entrypoint"] == ["/tool"]
    with tarfile.open(archive_path) as outer:
        names = outer.getnames()
        assert names[-1] == "manifest.json"
        assert f"{digest.removeprefix('sha256:')}.json" in names
        config_data = outer.extractfile(f"{digest.removeprefix('sha256:')}.json").read()  # type: ignore[union-attr]
        assert f"sha256:{hashlib.sha256(config_data).hexdigest()}" == digest
        layers = [outer.extractfile(member).read() for member in contents.layer_members]  # type: ignore[union-attr]
    for blob, digests in zip(layers, (first, second), strict=True):
        assert f"sha256:{hashlib.sha256(blob).hexdigest()}" == digests.digest
        assert f"sha256:{hashlib.sha256(gzip.decompress(blob)).hexdigest()}" == digests.diff_id
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layers[0]))) as layer:
        members = {member.name: member for member in layer.getmembers()}
    assert "dev" in members
    assert "dev/not-in-an-image" not in members
    assert members["etc/hostname.copy"].islnk() or members["etc/hostname"].islnk()
    assert members["etc/link"].issym()
    assert members["etc/link"].linkname == "hostname"
    assert all(member.uname == "" and member.gname == "" for member in members.values())


def test_a_config_that_does_not_list_the_layers_is_refused(tmp_path: Path) -> None:
    archive = ArchiveWriter(tmp_path / "image.tar", ("x:1",))
    archive.add_layer(lambda layer: layer.add_bytes("a", b"a"))
    with pytest.raises(ValueError, match="diff_ids"):
        archive.finish(image_config(RuntimeConfig(env=()), [], [], "2026-01-01T00:00:00Z"))
    archive.abandon()


# ------------------------------------------------------------------------------------------ cache


def test_a_failed_build_leaves_nothing_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TJ_CACHE_DIR", str(tmp_path / "cache"))
    (cache.cache_root() / "demo").mkdir(parents=True)

    def failing(directory: Path) -> str:
        (directory / cache.ARCHIVE).write_bytes(b"half an archive")
        raise ToolError("building image demo failed: a step")

    with pytest.raises(ToolError, match="a step"):
        cache.build_into_cache("demo", "0123456789abcdef", ("demo:1",), ["image=demo"], failing)
    assert sorted(path.name for path in (cache.cache_root() / "demo").iterdir()) == []
    assert not cache.cached("demo", "0123456789abcdef", ("demo:1",)).built

    def working(directory: Path) -> str:
        (directory / cache.ARCHIVE).write_bytes(b"an archive")
        (directory / "work").mkdir()
        return "sha256:" + "1" * 64

    image = cache.build_into_cache("demo", "0123456789abcdef", ("demo:1",), ["image=demo"], working)
    assert image.built
    assert image.size == len(b"an archive")
    assert image.config_digest == "sha256:" + "1" * 64
    assert sorted(path.name for path in image.archive.parent.iterdir()) == sorted(
        [cache.ARCHIVE, cache.METADATA]
    )
    assert json.loads((image.archive.parent / cache.METADATA).read_text())["inputs"] == ["image=demo"]


def test_a_failed_step_names_itself_and_its_log(tmp_path: Path) -> None:
    steps = Steps("demo", tmp_path / "build.log", Say("test"))
    steps.run("a step that works", ["true"])
    with pytest.raises(ToolError, match=r"demo failed: a step that fails \(exit 3\) \(log: .*build.log\)"):
        steps.run("a step that fails", ["sh", "-c", "echo the reason; exit 3"])
    assert "the reason" in (tmp_path / "build.log").read_text()


def test_mounts_under_a_directory_are_found_deepest_first() -> None:
    mountinfo = (
        "22 1 0:21 / / rw - ext4 /dev/vda rw\n"
        "30 22 0:5 / /tmp/build\\040dir/rootfs/proc rw - proc proc rw\n"
        "31 30 0:6 / /tmp/build\\040dir/rootfs/proc/sys/fs/binfmt_misc rw - binfmt_misc x rw\n"
        "32 22 0:7 / /tmp/build\\040dirty rw - tmpfs tmpfs rw\n"
    )
    assert mounts_under(Path("/tmp/build dir"), mountinfo) == [
        Path("/tmp/build dir/rootfs/proc/sys/fs/binfmt_misc"),
        Path("/tmp/build dir/rootfs/proc"),
    ]


def test_a_dynamic_program_is_not_static(tmp_path: Path) -> None:
    assert not is_static_executable(Path(sys.executable).resolve())
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not is_static_executable(tmp_path / "text")


def test_the_command_line_lists_every_image_with_its_key() -> None:
    result = subprocess.run(
        ["python3", "-m", "testbed.images", "list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "TJ_TRAINER_VENV": sys.prefix},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(IMAGES)
    for line, name in zip(lines, IMAGES, strict=True):
        assert line.split()[1] == describe(name).key
