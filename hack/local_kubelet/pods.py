"""What the local kubelet reads from a Pod: is it Running, which job and attempt, is its gang ready,
how long its grace period, its containers in start order, whether a command is a python script or
torchrun, the downward API's values, $(VAR) expansion.

Why apart: these are pure decisions over the Pod JSON, tested without a cluster
(tests/hack/test_local_kubelet.py), and every other module of the local kubelet relies on them. A Pod
missing a field it reads is never an error here: each answer has a safe default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from enum import StrEnum
from typing import Final

from crd import contract
from hack.common import JsonDict

DEFAULT_GRACE_SECONDS: Final = 30
PYTHON_NAME: Final = re.compile(r"^python(\d+(\.\d+)?)?$")
PYTHON_FLAG: Final = re.compile(r"^-[uBOsSEIq]+$")
_SUBSCRIPT: Final = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class SkipPod(Exception):
    """This pod cannot run here (the reason is the message); it is left as it is."""


def expand(value: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: $(NAME) becomes a defined variable's value (else stays as is), $$
    becomes $, anything else is kept."""
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char == "$" and index + 1 < len(value):
            following = value[index + 1]
            if following == "$":
                out.append("$")
                index += 2
                continue
            if following == "(":
                close = value.find(")", index + 2)
                if close != -1:
                    name = value[index + 2 : close]
                    out.append(defined[name] if name in defined else value[index : close + 1])
                    index = close + 1
                    continue
        out.append(char)
        index += 1
    return "".join(out)


def python_script_args(tokens: list[str]) -> tuple[list[str], str, list[str]] | None:
    """For `python [-u ...] SCRIPT [args...]`: the interpreter's flags, the script's path and its
    arguments. None for any other command (`python -m ...`, `torchrun ...`, a shell, a binary)."""
    if not tokens or not PYTHON_NAME.match(os.path.basename(tokens[0])):
        return None
    for index, token in enumerate(tokens[1:], start=1):
        if not PYTHON_FLAG.match(token):
            return (tokens[1:index], token, tokens[index + 1 :]) if not token.startswith("-") else None
    return None


TORCHRUN_MODULE: Final = "torch.distributed.run"


def torchrun_args(tokens: list[str]) -> list[str] | None:
    """For `torchrun ARGS` or `python [-u ...] -m torch.distributed.run ARGS`: torchrun's arguments (its
    options, the training script and the script's arguments). None for any other command."""
    if tokens and os.path.basename(tokens[0]) == "torchrun":
        return tokens[1:]
    if not tokens or not PYTHON_NAME.match(os.path.basename(tokens[0])):
        return None
    for index, argument in enumerate(tokens[1:], start=1):
        if PYTHON_FLAG.match(argument):
            continue
        if argument == "-m" and tokens[index + 1 : index + 2] == [TORCHRUN_MODULE]:
            return tokens[index + 2 :]
        return None
    return None


class Role(StrEnum):
    """A container's part in its pod, which decides when it starts and what its end means."""

    INIT = "init"  # an init container: runs to completion, in order, before the next one
    SIDECAR = "sidecar"  # a native sidecar (init container with restartPolicy Always): started, kept running
    MAIN = "main"  # spec.containers: the trainer and classic sidecars, started together after the init ones


def containers_in_order(pod: JsonDict) -> list[tuple[Role, JsonDict]]:
    """The pod's containers in the order a kubelet starts them: init containers (native sidecars among
    them), then the regular ones."""
    spec = pod.get("spec") or {}
    ordered: list[tuple[Role, JsonDict]] = []
    for container in spec.get("initContainers") or []:
        if isinstance(container, dict):
            role = Role.SIDECAR if container.get("restartPolicy") == "Always" else Role.INIT
            ordered.append((role, container))
    ordered.extend((Role.MAIN, c) for c in spec.get("containers") or [] if isinstance(c, dict))
    return ordered


def is_running(pod: JsonDict) -> bool:
    """kwok marked the pod Running (its containers too) and nobody is deleting it."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    statuses = status.get("containerStatuses")
    return (
        isinstance(statuses, list)
        and bool(statuses)
        and all(isinstance(s, dict) and "running" in (s.get("state") or {}) for s in statuses)
    )


def well_formed(pod: JsonDict) -> bool:
    """The fields every decision here reads: metadata with uid, name and namespace, and a spec."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(pod.get("spec"), dict):
        return False
    return all(isinstance(metadata.get(key), str) and metadata[key] for key in ("uid", "name", "namespace"))


def job_of(pod: JsonDict) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(contract.JOB_NAME_LABEL)
    return str(value) if value else None


def attempt_of(pod: JsonDict) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(contract.ATTEMPT_LABEL, "0"))


def gang_size(pod: JsonDict) -> int:
    """How many pods of its attempt must run before this one starts: the job's numWorkers, or 1 for an
    elastic job's pod (torchrun's rendezvous waits for its peers itself, and a replacement joins a
    running world alone)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if contract.ELASTIC_ANNOTATION in annotations:
        return 1
    try:
        return max(1, int(annotations.get(contract.NUM_WORKERS_ANNOTATION, "1")))
    except ValueError:
        return 1


def gang_ready(
    pod: JsonDict,
    pods: Mapping[str, JsonDict],
    started: AbstractSet[str],
    running_attempts: Iterable[tuple[str, str, str]],
) -> bool:
    """Every pod of `pod`'s attempt is Running (or already started: `started` holds their uids) and no
    process of another attempt of its job still runs (`running_attempts`: namespace, job, attempt)."""
    namespace, job, attempt = str(pod["metadata"]["namespace"]), job_of(pod), attempt_of(pod)
    if any(ns == namespace and j == job and a != attempt for ns, j, a in running_attempts):
        return False
    members = [
        (uid, p)
        for uid, p in pods.items()
        if p["metadata"].get("namespace") == namespace and job_of(p) == job and attempt_of(p) == attempt
    ]
    ready = sum(1 for uid, p in members if is_running(p) or uid in started)
    return ready >= gang_size(pod)


def grace_seconds(pod: JsonDict) -> float:
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    for value in (metadata.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")):
        if isinstance(value, int) and value >= 0:
            return float(value)
    return float(DEFAULT_GRACE_SECONDS)


def pod_label(pod: JsonDict) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def field_value(pod: JsonDict, path: str) -> str | None:
    """The downward API's value of `path` (fieldRef.fieldPath), or None when unsupported or absent."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip.get("ip", "") for ip in status.get("podIPs") or []) or None,
        "status.hostIPs": ",".join(ip.get("ip", "") for ip in status.get("hostIPs") or []) or None,
    }
    if path in simple:
        value = simple[path]
        return None if value is None else str(value)
    match = _SUBSCRIPT.match(path)
    if match:
        found = (metadata.get(match.group(1)) or {}).get(match.group(2))
        return None if found is None else str(found)
    return None
