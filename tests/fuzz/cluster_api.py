"""The raw Kubernetes API for the fuzzer: create a manifest exactly as generated, read jobs and Events.

Why raw HTTP rather than kubectl: a fuzz run creates well over a thousand manifests, one kubectl
process each would cost more than the API calls, and kubectl's answer for a refused manifest is text
that has to be parsed back. The API server's own answer (HTTP status and Status body) tells exactly
which layer refused it. The request is what kubectl sends for `kubectl create` (a POST of the JSON
with `fieldValidation=Strict`), through the kubernetes package's connection pool and the dev
cluster's admin credentials.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes

from crd import contract

JsonDict = dict[str, Any]
JOBS = f"/apis/{contract.API_VERSION}/namespaces/{{namespace}}/{contract.PLURAL}"


class ApiServer:
    """Admin access to the dev cluster's API server."""

    def __init__(self, kubeconfig: Path) -> None:
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._host = str(client.configuration.host).rstrip("/")
        self._pool = client.rest_client.pool_manager
        self._client = client

    def close(self) -> None:
        self._client.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, timeout: float = 60
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        answer = self._pool.request(method, self._host + path, body=body, headers=headers, timeout=timeout)
        data = answer.data or b"{}"
        try:
            decoded = json.loads(data)
        except (ValueError, RecursionError):
            decoded = {"message": data[:2000].decode(errors="replace")}
        return int(answer.status), decoded

    def create_job(self, namespace: str, body: bytes) -> tuple[int, JsonDict]:
        status, answer = self.request(
            "POST", JOBS.format(namespace=namespace) + "?fieldValidation=Strict", body
        )
        return status, answer if isinstance(answer, dict) else {}

    def jobs(self, namespace: str) -> list[JsonDict]:
        return self._items(JOBS.format(namespace=namespace))

    def job(self, namespace: str, name: str) -> JsonDict | None:
        status, answer = self.request("GET", JOBS.format(namespace=namespace) + f"/{name}")
        return answer if status == 200 and isinstance(answer, dict) else None

    def events(self, namespace: str) -> list[JsonDict]:
        return self._items(f"/api/v1/namespaces/{namespace}/events")

    def _items(self, path: str) -> list[JsonDict]:
        status, answer = self.request("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {str(answer)[:300]}")
        items = answer.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def create_namespace(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"fuzz": "1"}}}
        status, answer = self.request("POST", "/api/v1/namespaces", json.dumps(body).encode())
        if status not in (201, 409):
            raise RuntimeError(f"cannot create namespace {name}: HTTP {status}: {answer}")

    def delete_jobs(self, namespace: str) -> None:
        """Deletes every TrainingJob of the namespace (their objects go with them, by garbage collection)."""
        self.request("DELETE", JOBS.format(namespace=namespace))

    def delete_namespace(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{name}")
