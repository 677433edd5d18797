"""What the whole cluster pays for a bring-up: the CPU seconds of every control-plane component and of
the operator, their sum per job, and how large a pod (and a job) is as stored.

Why: on a small cluster the control plane's CPU, not the operator's, sets how fast jobs start, and on a
shared cluster the API server's and etcd's capacity per job is what a platform team pays for an
operator's choices (the size of its pods, the objects it creates, the writes they bring). The CPU
comes from /proc (utime + stime of each component's process, testbed/harness/bench/procfs.py); the sizes are
read back from the cluster two ways:

- `etcd_bytes`: the value etcd holds under the object's key (the API server's protobuf encoding of a
  pod, managedFields included), read through etcd's JSON gateway (`/v3/kv/range`);
- `json_bytes` and `json_bytes_without_managed_fields`: the compact JSON of a GET, as every client
  that asks for JSON receives it, with and without `metadata.managedFields`.
"""

from __future__ import annotations

import base64
import json
import statistics
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError
from controller.runtime.resource import Resource
from testbed.common import JsonDict

# The processes of the bench cluster whose CPU counts as the cluster's (testbed/cluster's names).
CONTROL_PLANE: Final = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok")
OPERATOR: Final = "operator"
SAMPLED_OBJECTS: Final = 8


def cluster_cpu(components: Mapping[str, float], operator: float, jobs: int) -> JsonDict:
    """CPU seconds of each control-plane component and the operator over a bring-up, their sum, and
    the sum per job."""
    seconds = {name: round(components[name], 2) for name in CONTROL_PLANE if name in components}
    seconds[OPERATOR] = round(operator, 2)
    total = sum(seconds.values())
    return {
        "seconds": seconds,
        "control_plane_seconds": round(total - operator, 2),
        "total_seconds": round(total, 2),
        "seconds_per_job": round(total / max(1, jobs), 4),
    }


def etcd_url(dev_dir: Path) -> str | None:
    """etcd's client URL from the dev cluster's state (testbed/cluster records every command line)."""
    try:
        state = json.loads((dev_dir / "run" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    for argument in (state.get("processes", {}).get("etcd") or {}).get("args", []):
        if argument.startswith("--listen-client-urls="):
            return str(argument.split("=", 1)[1].split(",")[0])
    return None


def etcd_key(resource: Resource, namespace: str, name: str) -> str:
    """Where the API server keeps an object in etcd: /registry/<resource>/... for the core group,
    /registry/<group>/<resource>/... for others."""
    group = f"{resource.group}/" if resource.group else ""
    return f"/registry/{group}{resource.plural}/{namespace}/{name}"


def etcd_value_bytes(url: str, key: str, timeout: float = 10.0) -> int | None:
    """The size of the value etcd holds under `key`, None when there is none."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"etcd's URL {url!r} is not the bench cluster's (http://127.0.0.1:<port>)")
    request = urllib.request.Request(  # noqa: S310 - checked above: etcd on 127.0.0.1
        f"{url}/v3/kv/range", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        answer = json.loads(response.read())
    kvs = answer.get("kvs") or []
    return len(base64.b64decode(kvs[0]["value"])) if kvs else None


def compact_size(obj: object) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def object_sizes(obj: JsonDict, stored: int | None) -> JsonDict:
    """One object's sizes: as etcd stores it, as JSON, as JSON without managedFields."""
    metadata = obj.get("metadata") or {}
    without = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return {
        "etcd_bytes": stored,
        "json_bytes": compact_size(obj),
        "json_bytes_without_managed_fields": compact_size(without),
        "managed_fields_entries": len(metadata.get("managedFields") or []),
    }


def median_sizes(sizes: Sequence[JsonDict]) -> JsonDict:
    """The median of each size over the sampled objects."""
    result: JsonDict = {"objects": len(sizes)}
    for field in ("etcd_bytes", "json_bytes", "json_bytes_without_managed_fields", "managed_fields_entries"):
        values = [size[field] for size in sizes if size.get(field) is not None]
        result[field] = round(statistics.median(values)) if values else None
    return result


def stored_sizes(
    client: KubeClient, dev_dir: Path, resource: Resource, namespace: str, count: int = SAMPLED_OBJECTS
) -> JsonDict:
    """The median sizes of the first `count` objects of `resource` in `namespace`."""
    items = client.list(resource, namespace, limit=count).get("items") or []
    url = etcd_url(dev_dir)
    sizes = []
    for obj in items:
        name = obj["metadata"]["name"]
        stored = etcd_value_bytes(url, etcd_key(resource, namespace, name)) if url else None
        sizes.append(object_sizes(obj, stored))
    return median_sizes(sizes)


def stored_pod_and_job_sizes(client: KubeClient, dev_dir: Path, jobs: Resource, namespace: str) -> JsonDict:
    """A pod's and a job's sizes as stored (medians of a few of each): the part of the cluster's cost
    that every write and watch event of such an object carries."""
    try:
        return {
            "pod": stored_sizes(client, dev_dir, PODS, namespace),
            "job": stored_sizes(client, dev_dir, jobs, namespace),
            "how": "etcd_bytes: etcd's value (protobuf for pods, JSON for custom resources); json_bytes: "
            "the compact JSON of a GET, with and without metadata.managedFields; medians",
        }
    except (OSError, KubeError) as error:  # diagnostics only: a failed read leaves the sizes out
        return {"error": str(error)}
