"""TrainingJobs, pods and API paths for the client's tests against the scripted API server (fakeapi.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from controller.runtime.clock import FakeClock
from crd import contract
from tests.unit.fakeapi import FakeApi, status

JsonDict = dict[str, Any]
NAMESPACE = "ns"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/trainingjobs"
ALL_JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/trainingjobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"
UID = "uid-1"


def job(name: str = "mnist", rv: str = "10", *, num_workers: int = 2, **status: Any) -> JsonDict:
    """A TrainingJob as the API server returns it; keyword arguments are status fields."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": UID, "resourceVersion": rv},
        "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": num_workers},
        "status": status,
    }


def changed(base: JsonDict, rv: str, **status: Any) -> JsonDict:
    """`base` at resourceVersion `rv` with `status` merged into its status."""
    updated = copy.deepcopy(base)
    updated["metadata"]["resourceVersion"] = rv
    updated["status"] = {**updated.get("status", {}), **status}
    return updated


def condition(type_: str, value: str = "True", reason: str = "", message: str = "") -> JsonDict:
    return {"type": type_, "status": value, "reason": reason, "message": message}


def pod(
    name: str,
    rank: int,
    *,
    node: str | None = "gpu-node-0",
    phase: str = "Running",
    attempt: int = 0,
    trainer: JsonDict | None = None,
) -> JsonDict:
    """A worker pod of job mnist; `trainer` is the trainer container's `state` (terminated, waiting)."""
    labels = {
        contract.JOB_NAME_LABEL: "mnist",
        contract.REPLICA_INDEX_LABEL: str(rank),
        contract.ATTEMPT_LABEL: str(attempt),
    }
    owner = {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": "mnist", "uid": UID}
    body: JsonDict = {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels, "ownerReferences": [owner]},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }
    if trainer is not None:
        body["status"]["containerStatuses"] = [{"name": contract.CONTAINER_NAME, "state": trainer}]
    return body


def not_found(kind: str, name: str) -> JsonDict:
    body = status(404, "NotFound", f'{kind} "{name}" not found')
    body["details"] = {"name": name, "kind": kind}
    return body


class SteppingClock(FakeClock):
    """Every reading of the monotonic clock moves it on by `step` seconds (time passing between calls)."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step

    def monotonic(self) -> float:
        now = super().monotonic()
        self.advance(self.step)
        return now


def kubeconfig_for(api: FakeApi | None, path: Path, namespace: str = NAMESPACE, server: str = "") -> Path:
    """A kubeconfig whose context points at the scripted API server (or `server`), with a namespace."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server or (api.url if api else "")}}],
        "users": [{"name": "fake", "user": {"token": "test-token"}}],
        "contexts": [
            {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
        ],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))
    return path
