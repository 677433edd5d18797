"""TrainingJob manifests from keyword arguments, YAML text or files: pure functions, no API calls.

Why: a notebook user should not need to remember that the API says `numWorkers` and nests the epochs
under `hyperparameters`, nor write YAML for a two-worker test run. The keyword arguments cover the
required fields and the common ones, typed; `spec=` passes anything else through unchanged, so
nothing the API offers is out of reach. Nothing is validated here beyond the manifest's shape: the
API server's schema and CEL rules judge the values and name the field they refuse.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, Required, TypedDict, Unpack

import yaml

from crd import contract
from trainingjob_client.errors import InvalidManifest

JsonDict = dict[str, Any]
Framework = Literal["pytorch", "tensorflow", "jax", "xgboost", "paddlepaddle", "mpi"]


class JobFields(TypedDict, total=False):
    """The spec of a TrainingJob as keyword arguments: the required fields and the common ones.

    `spec` holds any further spec field as the API spells it (`{"successPolicy": {...}}`); the
    keyword arguments win over it.
    """

    model: Required[str]
    dataset: Required[str]
    num_workers: Required[int]
    gpus_per_worker: int
    framework: Framework
    image: str
    command: Sequence[str]
    args: Sequence[str]
    env: Mapping[str, str]
    epochs: int
    learning_rate: float
    batch_size: int
    checkpoint: bool
    suspend: bool
    ttl_seconds_after_finished: int
    labels: Mapping[str, str]
    spec: Mapping[str, Any]


# Keyword argument -> spec field, for the ones that are copied as they are.
_SPEC_FIELDS: Final = {
    "model": "model",
    "dataset": "dataset",
    "num_workers": "numWorkers",
    "gpus_per_worker": "gpusPerWorker",
    "framework": "framework",
    "image": "image",
    "suspend": "suspend",
    "ttl_seconds_after_finished": "ttlSecondsAfterFinished",
}
_HYPERPARAMETERS: Final = {"epochs": "epochs", "learning_rate": "learningRate", "batch_size": "batchSize"}


def build_manifest(name: str, *, namespace: str | None = None, **fields: Unpack[JobFields]) -> JsonDict:
    """A TrainingJob manifest from keyword arguments (`JobFields`), as `submit` creates it."""
    given: dict[str, Any] = dict(fields)
    body: JsonDict = copy.deepcopy(dict(given.get("spec") or {}))
    body.update({field: given[key] for key, field in _SPEC_FIELDS.items() if given.get(key) is not None})
    for key in ("command", "args"):
        if given.get(key) is not None:
            body[key] = list(given[key])
    env = given.get("env")
    if env:
        kept = [entry for entry in body.get("env") or [] if entry.get("name") not in env]
        body["env"] = [*kept, *({"name": key, "value": str(value)} for key, value in env.items())]
    hyperparameters = {
        field: given[key] for key, field in _HYPERPARAMETERS.items() if given.get(key) is not None
    }
    if hyperparameters:
        body["hyperparameters"] = {**dict(body.get("hyperparameters") or {}), **hyperparameters}
    if given.get("checkpoint") is not None:
        body["checkpoint"] = {**dict(body.get("checkpoint") or {}), "enabled": given["checkpoint"]}
    metadata: JsonDict = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if given.get("labels"):
        metadata["labels"] = dict(given["labels"])
    return {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": metadata, "spec": body}


def check_manifest(manifest: Any) -> JsonDict:
    """A deep copy of `manifest` if it is a TrainingJob (apiVersion, kind, metadata.name, spec)."""
    if not isinstance(manifest, Mapping):
        raise InvalidManifest(f"a TrainingJob manifest is a mapping, not {type(manifest).__name__}")
    job: JsonDict = copy.deepcopy(dict(manifest))
    job.setdefault("apiVersion", contract.API_VERSION)
    job.setdefault("kind", contract.KIND)
    if job["kind"] != contract.KIND or job["apiVersion"] != contract.API_VERSION:
        raise InvalidManifest(
            f"not a TrainingJob: apiVersion {job['apiVersion']!r}, kind {job['kind']!r} "
            f"(want {contract.API_VERSION!r}, {contract.KIND!r})"
        )
    metadata = job.get("metadata")
    if not isinstance(metadata, Mapping) or not (metadata.get("name") or metadata.get("generateName")):
        raise InvalidManifest("the manifest has no metadata.name")
    if not isinstance(job.get("spec"), Mapping):
        raise InvalidManifest("the manifest has no spec")
    return job


def from_yaml(text: str) -> JsonDict:
    """The one TrainingJob in a YAML (or JSON) document; InvalidManifest naming what is wrong."""
    try:
        documents = [document for document in yaml.safe_load_all(text) if document is not None]
    except yaml.YAMLError as error:
        raise InvalidManifest(f"not valid YAML: {' '.join(str(error).split())}") from None
    if len(documents) != 1:
        raise InvalidManifest(f"expected one TrainingJob document, found {len(documents)}")
    if isinstance(documents[0], str):
        raise InvalidManifest(
            f"the YAML is the text {documents[0][:60]!r}, not a manifest "
            "(to read a file, use create_from_file)"
        )
    return check_manifest(documents[0])


def from_file(path: str | os.PathLike[str]) -> JsonDict:
    """The one TrainingJob in a YAML or JSON file."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise InvalidManifest(f"cannot read {os.fspath(path)}: {error.strerror or error}") from None
    try:
        return from_yaml(text)
    except InvalidManifest as error:
        raise InvalidManifest(f"{os.fspath(path)}: {error}") from None


def place(job: JsonDict, namespace: str | None, default: str) -> tuple[JsonDict, str]:
    """The job with metadata.namespace settled and that namespace: the argument, else the manifest's,
    else `default`. An argument that disagrees with the manifest is refused, as kubectl does."""
    metadata = job.setdefault("metadata", {})
    written = metadata.get("namespace")
    if namespace and written and namespace != written:
        raise InvalidManifest(
            f"the manifest's namespace {written!r} does not match the requested namespace {namespace!r}"
        )
    chosen = str(namespace or written or default)
    metadata["namespace"] = chosen
    return job, chosen
