"""The trainer images: the base image plus one layer with a framework as the test virtualenv has it.

Why: a TrainingJob without spec.image runs its framework's public default image (and the examples
name public PyTorch images), which this machine cannot pull. A trainer image stands in for them on the
real node: Debian's Python 3.11 (the base image) and, in /usr/local/lib/python3.11/dist-packages, the
framework's installed dependency closure copied from the test virtualenv (the same versions the tests
use; testbed/images/closure.py resolves it there). Console scripts go to /usr/local/bin with their
`#!` line pointing at /usr/bin/python3. The virtualenv is TJ_TRAINER_VENV, else the repository's
.venv, else the one this interpreter runs in.

torch from PyPI is the CUDA build: `import torch` loads its CUDA libraries (the nvidia-* distributions)
even on the CPU, and fails without them, so they are part of the closure and of the image.

Each trainer is one `TrainerSpec` (image name, the spec.framework it serves, the distributions it
starts from); a TensorFlow or JAX image is one more entry. References: `trainingjob-trainer:<tag
prefix>-<version>`, the framework's default image (crd.contract.DEFAULT_IMAGES) and every public
image an example TrainingJob of that framework names (examples whose pods pull with
imagePullSecrets name a private image of the user's and are left out). These are stand-ins built
here under the public names, not the upstream images.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Final

from crd.contract import DEFAULT_IMAGES
from crd.defaults import subschema
from testbed.common import ToolError
from testbed.images import base, debs
from testbed.images.base import PYTHON_VERSION
from testbed.images.keys import KeyInputs
from testbed.images.layers import LayerWriter
from testbed.images.recipe import Build, Context, Recipe

CLOSURE_SCRIPT: Final = Path(__file__).with_name("closure.py")
DIST_PACKAGES: Final = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"
IMAGE_PYTHON: Final = "/usr/bin/python3"


@dataclass(frozen=True)
class TrainerSpec:
    """A trainer image: its name, the spec.framework whose images it stands in for, the distributions
    it starts from (the first one's version names the image) and its tag's prefix."""

    name: str
    framework: str
    distributions: tuple[str, ...]
    tag_prefix: str
    # Taken along when the virtualenv has them (the `tracking` extra): the experiment trackers' clients
    # the reference trainer logs through (trainer/reference_trainer/tracking.py).
    optional: tuple[str, ...] = ()
    # Debian packages whose shared libraries the wheels link without shipping them (testbed/images/
    # debs.py), in a layer of their own.
    debian: tuple[str, ...] = ()


TRAINERS: Final = (
    TrainerSpec(
        "trainer-torch", "pytorch", ("torch",), "torch", optional=("mlflow-skinny", "tensorboard", "wandb")
    ),
    TrainerSpec("trainer-tensorflow", "tensorflow", ("tensorflow-cpu",), "tensorflow"),
    TrainerSpec("trainer-jax", "jax", ("jax",), "jax"),
    TrainerSpec("trainer-xgboost", "xgboost", ("xgboost-cpu",), "xgboost"),
    # libpaddle.so needs libgomp.so.1, which paddlepaddle/paddle has and the base's minimal Debian lacks.
    TrainerSpec("trainer-paddle", "paddlepaddle", ("paddlepaddle",), "paddle", debian=("libgomp1",)),
)


@dataclass(frozen=True)
class Distribution:
    """An installed distribution: its files are relative to `site_packages` (RECORD's paths)."""

    name: str
    version: str
    site_packages: Path
    record_sha256: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class Closure:
    python: str
    distributions: tuple[Distribution, ...]


_CLOSURES: dict[tuple[Path, tuple[str, ...], int], Closure] = {}


def installed_closure(venv: Path, roots: tuple[str, ...]) -> Closure:
    """The closure of `roots` installed in `venv` (remembered while its site-packages is unchanged)."""
    site = sorted(venv.glob("lib/python*/site-packages"))
    memo_key = (venv, roots, site[0].stat().st_mtime_ns if site else 0)
    if memo_key not in _CLOSURES:
        # -I: the script's folder (testbed/images) is not put on sys.path, where its operator.py would
        # shadow the standard library's operator in a virtualenv whose start-up has not imported it.
        command = [str(venv / "bin" / "python"), "-I", str(CLOSURE_SCRIPT), *roots]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ToolError(f"the packages of {' '.join(roots)} in {venv}: {result.stderr.strip()}")
        data = json.loads(result.stdout)
        distributions = tuple(
            Distribution(
                item["name"],
                item["version"],
                Path(item["site_packages"]),
                item["record_sha256"],
                tuple(item["files"]),
            )
            for item in data["distributions"]
        )
        _CLOSURES[memo_key] = Closure(data["python"], distributions)
    return _CLOSURES[memo_key]


def is_installed(venv: Path, distribution: str) -> bool:
    """Whether `distribution` is installed in `venv`: reads the .dist-info directories' names only."""
    wanted = re.sub(r"[-_.]+", "-", distribution).lower()
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        if re.sub(r"[-_.]+", "-", info.name.removesuffix(".dist-info").rsplit("-", 1)[0]).lower() == wanted:
            return True
    return False


def not_installed(spec: TrainerSpec, context: Context) -> str | None:
    """Why the trainer cannot be built here (its framework is missing from the virtualenv, as in
    `make demo`'s, which has torch alone), or None."""
    try:
        venv = context.trainer_venv()
    except ToolError as error:
        return str(error)
    if is_installed(venv, spec.distributions[0]):
        return None
    return f"{spec.distributions[0]} is not installed in {venv}"


def roots(spec: TrainerSpec, venv: Path) -> tuple[str, ...]:
    """The distributions the image starts from: its own, and those of `optional` installed here."""
    return (*spec.distributions, *(name for name in spec.optional if is_installed(venv, name)))


# ------------------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ExampleJob:
    """What a TrainingJob in an example file says about its image."""

    framework: str | None
    image: str | None
    private: bool


def _value(text: str) -> str:
    return text.split(" #", 1)[0].strip().strip("'\"")


def example_jobs(text: str) -> list[ExampleJob]:
    """The TrainingJobs of a (multi-document) example file: spec.framework, spec.image, and whether
    its pods pull with imagePullSecrets (a private image). Reads the plain block style the examples
    use; tests check it against a YAML parser on every example."""
    jobs: list[ExampleJob] = []
    for document in re.split(r"^---[ \t]*$", text, flags=re.MULTILINE):
        lines = [line for line in document.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not any(re.fullmatch(r"kind:\s*TrainingJob\s*(#.*)?", line) for line in lines):
            continue
        in_spec, fields = False, {}
        for line in lines:
            if not line[0].isspace():
                in_spec = line.startswith("spec:")
            elif in_spec and (match := re.match(r"  (image|framework):\s*(.*)$", line)):
                fields[match.group(1)] = _value(match.group(2))
        private = re.search(r"^\s+imagePullSecrets:", document, flags=re.MULTILINE) is not None
        jobs.append(ExampleJob(fields.get("framework"), fields.get("image"), private))
    return jobs


def tag_safe(version: str) -> str:
    """A version as a tag may spell it (`2.15.0+cu132` -> `2.15.0-cu132`)."""
    return re.sub(r"[^\w.-]", "-", version)


def trainer_image(framework: str) -> str:
    """The reference of the trainer image for `framework` (pytorch, tensorflow, jax), named by the
    version of its framework installed here (the test virtualenv it is built from)."""
    (spec,) = [spec for spec in TRAINERS if spec.framework == framework]
    return f"trainingjob-trainer:{spec.tag_prefix}-{tag_safe(metadata.version(spec.distributions[0]))}"


def public_images(framework: str, default_framework: str, example_texts: list[str]) -> list[str]:
    """The framework's default image, then the public images example jobs of that framework name."""
    images = [DEFAULT_IMAGES[framework]]
    for text in example_texts:
        for job in example_jobs(text):
            if (job.framework or default_framework) == framework and job.image and not job.private:
                images.append(job.image)
    return list(dict.fromkeys(images))


def references(spec: TrainerSpec, context: Context) -> tuple[str, ...]:
    venv = context.trainer_venv()
    closure = installed_closure(venv, roots(spec, venv))
    version = closure.distributions[0].version
    examples = [
        path.read_text(encoding="utf-8") for path in sorted((context.repo / "examples").glob("*.yaml"))
    ]
    default_framework = str(subschema("spec", "framework")["default"])
    # JAX's default image is the base image's name (python:3.11-slim): that one stays the base.
    taken = set(base.references(context))
    public = [
        image for image in public_images(spec.framework, default_framework, examples) if image not in taken
    ]
    return (f"trainingjob-trainer:{spec.tag_prefix}-{tag_safe(version)}", *public)


# ------------------------------------------------------------------------------------------ inputs


def closure_inputs(closure: Closure, into: KeyInputs) -> None:
    """Every distribution's name, version and RECORD (the list of its files with their digests)."""
    into.text("python", closure.python)
    for distribution in closure.distributions:
        into.text(f"dist:{distribution.name}", f"{distribution.version} {distribution.record_sha256}")


def inputs(spec: TrainerSpec, context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    venv = context.trainer_venv()
    into.text("distributions", " ".join(roots(spec, venv)))
    closure_inputs(installed_closure(venv, roots(spec, venv)), into)
    debs.inputs(spec.debian, into)


# ------------------------------------------------------------------------------------------- build


def environment_root(distribution: Distribution) -> Path:
    """The virtualenv (or prefix) a distribution is installed in: site-packages is
    <root>/lib/pythonX.Y/site-packages."""
    return distribution.site_packages.parent.parent.parent


def image_path(distribution: Distribution, relative: str) -> str | None:
    """Where a RECORD path goes in the image: site-packages into dist-packages, the rest of the
    virtualenv (bin/, share/) under /usr/local; None for a path outside the virtualenv."""
    source = Path(os.path.normpath(distribution.site_packages / relative))
    root = environment_root(distribution)
    if source.is_relative_to(distribution.site_packages):
        return f"{DIST_PACKAGES}/{source.relative_to(distribution.site_packages).as_posix()}"
    if source.is_relative_to(root):
        return f"usr/local/{source.relative_to(root).as_posix()}"
    return None


def script_for_image(data: bytes, root: Path) -> bytes | None:
    """A console script's text with its `#!` line on the image's python; None if it is not a script
    of the virtualenv at `root`."""
    first, newline, rest = data.partition(b"\n")
    if not first.startswith(b"#!") or f"{root}/bin/".encode() not in first:
        return None
    return b"#!" + IMAGE_PYTHON.encode() + newline + rest


def _fill(layer: LayerWriter, closure: Closure) -> None:
    written: set[str] = set()
    for distribution in closure.distributions:
        root = environment_root(distribution)
        for relative in distribution.files:
            source = Path(os.path.normpath(distribution.site_packages / relative))
            target = image_path(distribution, relative)
            if target is None or target in written or not (source.is_file() or source.is_symlink()):
                continue
            written.add(target)
            is_script = target.startswith("usr/local/bin/")
            script = script_for_image(source.read_bytes(), root) if is_script else None
            if script is not None:
                layer.add_bytes(target, script, 0o755)
            else:
                layer.add_file(source, target)


def build(spec: TrainerSpec, build: Build) -> dict[str, object]:
    venv = build.context.trainer_venv()
    closure = installed_closure(venv, roots(spec, venv))
    if closure.python != PYTHON_VERSION:
        build.steps.fail(f"{venv} has Python {closure.python}; the base image has {PYTHON_VERSION}")
    base = build.copy_layers_of("base")
    listed = ", ".join(f"{d.name} {d.version}" for d in closure.distributions)
    build.say(f"{spec.name}: a layer of {len(closure.distributions)} distributions from {venv}: {listed}")
    added = [build.archive.add_layer(partial(_fill, closure=closure)).diff_id]
    if spec.debian:
        build.say(f"{spec.name}: a layer of Debian's {', '.join(spec.debian)}")
        root = debs.unpack(spec.debian, build.work, build.steps)
        added.append(build.archive.add_layer(partial(debs.fill, root=root)).diff_id)
    created_by = f"{' '.join(roots(spec, venv))} and their dependencies from the test virtualenv"
    return build.config_on_top(base, added, created_by)


def recipe(spec: TrainerSpec) -> Recipe:
    return Recipe(
        name=spec.name,
        summary=f"the base image plus {' '.join(spec.distributions)} from the test virtualenv",
        revision=1,
        references=partial(references, spec),
        inputs=partial(inputs, spec),
        build=partial(build, spec),
        depends=("base",),
    )
