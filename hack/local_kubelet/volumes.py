"""A pod's volumes as local directories, and the mount paths that lead to them.

Why: the trainer reads its configuration, writes checkpoints and finds its service-account token at
in-pod paths (/etc/trainingjob, the checkpoint mount, /var/run/secrets/...). Here each volume becomes
a directory under <state-dir>/<ns>/<job>/ and every such path is remapped:
- the job's ConfigMap is `config/`, the checkpoint volume `checkpoints/` (kept across attempts, so a
  restarted gang finds its checkpoints), other configMap, secret and storage volumes `volumes/<name>/`;
- the pod's own volumes (emptyDir, projected) are `pods/<pod>/<name>/`;
- configMap, secret and projected contents are written from the API; the projected service-account
  token is minted with a TokenRequest bound to the pod, as a kubelet does, and renewed by the caller.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from builders.pods import CHECKPOINT_VOLUME, CONFIG_VOLUME
from controller.errors import KubeError, NotFound
from controller.kube import CONFIGMAPS, SECRETS, SERVICEACCOUNTS, KubeClient
from crd import contract
from hack.common import JsonDict
from hack.local_kubelet.pods import SkipPod, field_value

# Where a kubelet mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS: Final = 3600


@dataclass(frozen=True)
class Mount:
    """A container mount path and the local directory that stands in for it."""

    path: str
    local: Path


def remap(value: str, mounts: Iterable[Mount]) -> str:
    """`value` with a leading mount path (the whole value, or a path under it) made local."""
    for mount in sorted(mounts, key=lambda m: len(m.path), reverse=True):
        root = mount.path.rstrip("/") or "/"
        if value == root:
            return str(mount.local)
        if value.startswith(root + "/"):
            return str(mount.local / value[len(root) + 1 :])
    return value


@dataclass(frozen=True)
class TokenFile:
    """A projected service-account token: where it is written, for how long, for whom."""

    path: Path
    seconds: int
    audience: str | None


@dataclass
class Volumes:
    """A pod's mounts made local, what was left out, and the tokens to renew."""

    mounts: list[Mount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tokens: list[TokenFile] = field(default_factory=list)


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Writes `data` atomically (a reader never sees half a file) with `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def object_value(kind: str, obj: JsonDict | None, key: str) -> str | None:
    """One key of a ConfigMap's data, or of a Secret's data (decoded) or stringData."""
    if obj is None:
        return None
    if kind == "ConfigMap":
        value = (obj.get("data") or {}).get(key)
        return None if value is None else str(value)
    encoded = (obj.get("data") or {}).get(key)
    if encoded is None:
        plain = (obj.get("stringData") or {}).get(key)
        return None if plain is None else str(plain)
    return base64.b64decode(encoded).decode("utf-8", errors="replace")


class LocalVolumes:
    """Makes pods' volumes local under `state_dir`, reading what they hold from the API."""

    def __init__(self, client: KubeClient, state_dir: Path) -> None:
        self.client = client
        self.state_dir = state_dir

    def lookup(self, kind: str, namespace: str, name: str) -> JsonDict | None:
        """A ConfigMap or Secret, None when it does not exist."""
        resource = SECRETS if kind == "Secret" else CONFIGMAPS
        try:
            return self.client.get(resource, namespace, name)
        except NotFound:
            return None

    def job_dir(self, namespace: str, job: str) -> Path:
        return self.state_dir / namespace / job

    def mounts(self, pod: JsonDict, container: JsonDict, job: str) -> Volumes:
        """Local directories for the container's mounts; configMap, secret and projected volumes (the
        service-account token among them) are written now."""
        volumes = {str(v.get("name")): v for v in pod["spec"].get("volumes") or []}
        result = Volumes()
        prepared: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            name, path = str(mount.get("name")), str(mount.get("mountPath"))
            if path == contract.SHM_MOUNT_PATH:
                continue  # the host's /dev/shm serves
            if name not in prepared:
                prepared[name] = self.volume_dir(pod, volumes.get(name) or {"name": name}, job, result)
            local = prepared[name]
            sub_path = str(mount.get("subPath") or "")
            if sub_path and ".." not in Path(sub_path).parts:
                local = local / sub_path
            if not local.exists():
                local.mkdir(parents=True)
            result.mounts.append(Mount(path, local))
        return result

    def volume_dir(self, pod: JsonDict, volume: JsonDict, job: str, result: Volumes) -> Path:
        namespace, pod_name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
        job_dir = self.job_dir(namespace, job)
        name = str(volume.get("name"))
        if "configMap" in volume or "secret" in volume:
            kind = "ConfigMap" if "configMap" in volume else "Secret"
            source = volume.get("configMap") or volume.get("secret") or {}
            local = job_dir / ("config" if name == CONFIG_VOLUME else f"volumes/{name}")
            self.write_object(kind, namespace, source, local, f"volume {name}")
        elif "projected" in volume:
            local = job_dir / "pods" / pod_name / name
            for source in (volume["projected"] or {}).get("sources") or []:
                self.write_projection(pod, source, local, result)
        elif name == CHECKPOINT_VOLUME:
            local = job_dir / "checkpoints"
        elif "emptyDir" in volume:
            local = job_dir / "pods" / pod_name / name
        else:
            local = job_dir / "volumes" / name
            if not any(kind in volume for kind in ("persistentVolumeClaim", "nfs", "hostPath")):
                kinds = ", ".join(kind for kind in volume if kind != "name") or "no source"
                result.notes.append(f"volume {name} ({kinds}) is an empty directory here")
        local.mkdir(parents=True, exist_ok=True)
        return local

    def write_object(self, kind: str, namespace: str, source: JsonDict, directory: Path, what: str) -> None:
        """A ConfigMap's or Secret's keys (or the chosen `items`) as files in `directory`."""
        object_name = str(source.get("name") or source.get("secretName"))
        obj = self.lookup(kind, namespace, object_name)
        if obj is None:
            if source.get("optional"):
                return
            raise SkipPod(f"{kind} {object_name} of {what} does not exist")
        keys = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
        items = source.get("items")
        selected = (
            [(str(i.get("key")), str(i.get("path"))) for i in items] if items else [(k, k) for k in keys]
        )
        mode = 0o644 if kind == "ConfigMap" else 0o600
        for key, relative in selected:
            value = object_value(kind, obj, key)
            if value is not None and ".." not in Path(relative).parts:
                write_private(directory / relative, value.encode(), mode)

    def write_projection(self, pod: JsonDict, source: JsonDict, directory: Path, result: Volumes) -> None:
        namespace = str(pod["metadata"]["namespace"])
        if "serviceAccountToken" in source:
            projection = source["serviceAccountToken"] or {}
            token = TokenFile(
                directory / str(projection.get("path", "token")),
                int(projection.get("expirationSeconds") or TOKEN_SECONDS),
                str(projection["audience"]) if projection.get("audience") else None,
            )
            self.mint_token(pod, token)
            result.tokens.append(token)
        elif "configMap" in source or "secret" in source:
            kind = "ConfigMap" if "configMap" in source else "Secret"
            self.write_object(
                kind,
                namespace,
                source.get("configMap") or source.get("secret") or {},
                directory,
                "a projection",
            )
        elif "downwardAPI" in source:
            for item in (source["downwardAPI"] or {}).get("items") or []:
                path = str((item.get("fieldRef") or {}).get("fieldPath", ""))
                value = field_value(pod, path)
                relative = str(item.get("path", ""))
                if value is None or not relative or ".." in Path(relative).parts:
                    result.notes.append(
                        f"projected downwardAPI {relative} ({path or 'resourceFieldRef'}): skipped"
                    )
                    continue
                write_private(directory / relative, value.encode(), 0o644)
        else:
            result.notes.append(f"projected source {', '.join(source)}: not supported locally, skipped")

    def mint_token(self, pod: JsonDict, token: TokenFile) -> None:
        """A token of the pod's ServiceAccount bound to the pod (TokenRequest), as a kubelet projects it."""
        account = str(pod["spec"].get("serviceAccountName") or "default")
        metadata = pod["metadata"]
        spec: JsonDict = {
            "expirationSeconds": token.seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
        }
        if token.audience:
            spec["audiences"] = [token.audience]
        answer = self.client.request(
            "POST",
            SERVICEACCOUNTS.path(str(metadata["namespace"]), account, "token"),
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        value = str((answer.get("status") or {}).get("token", ""))
        if not value:
            raise KubeError(f"TokenRequest for ServiceAccount {account} returned no token")
        write_private(token.path, value.encode())
