"""A pod's volumes as local directories, and the mount paths that lead to them.

Why: a container reads its configuration and data, writes checkpoints and finds its service-account
token at in-pod paths (/etc/trainingjob, /data, the checkpoint mount, /var/run/secrets/...). Here each
volume becomes a directory under the state directory, shared the way the volume is shared in a
cluster, and every such path the container sees is remapped (`remap`):

- a PersistentVolumeClaim is `<ns>/claims/<claim>/`: one directory per claim, shared by every pod that
  mounts it and kept after the pods, so what one job writes the next one reads (a dataset, a retained
  checkpoint claim);
- an NFS export is `nfs/<server>/<path>/`, shared by every pod of every namespace;
- a hostPath is `hostpath/<node>/<path>`: per fake node, never the real host path;
- the pod's own volumes are `<ns>/pods/<pod>-<uid>/volumes/<name>/`, new for every pod (a gang restart
  gets fresh ones) and removed once the pod is deleted: emptyDir, generic ephemeral volumes, and
  configMap, secret, projected and downwardAPI volumes, whose files are written from the API when the
  pod starts (keys or `items`, modes), the projected service-account token minted with a TokenRequest
  bound to the pod and renewed by the caller;
- any other volume type is an empty per-pod directory, with a note in the pod's log.

Read-only mounts are not enforced, and configMap and secret volumes are not refreshed while the pod runs.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Final

from controller.resources import CONFIGMAPS, SECRETS, SERVICEACCOUNTS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, NotFound
from crd import contract
from hack.common import JsonDict
from hack.local_kubelet.pods import SkipPod, expand, field_value

# Where a kubelet mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS: Final = 3600
DEFAULT_MODE: Final = 0o644  # configMap, secret, projected and downwardAPI files, as in Kubernetes
# Volume types that are the pod's own: a fresh directory per pod.
POD_LOCAL: Final = ("emptyDir", "ephemeral")


@dataclass(frozen=True)
class Mount:
    """A container mount path and the local directory that stands in for it."""

    path: str
    local: Path


def _remap_path(value: str, mounts: Iterable[Mount]) -> str | None:
    for mount in sorted(mounts, key=lambda m: len(m.path), reverse=True):
        root = mount.path.rstrip("/") or "/"
        if value == root:
            return str(mount.local)
        if value.startswith(root + "/"):
            return str(mount.local / value[len(root) + 1 :])
    return None


def remap(value: str, mounts: Iterable[Mount]) -> str:
    """`value` with mount paths made local: the whole value, a path under a mount, each entry of a
    colon-separated list (PYTHONPATH), or the value of a `--flag=/path` argument."""
    mounts = list(mounts)
    whole = _remap_path(value, mounts)
    if whole is not None:
        return whole
    if value.startswith("-") and "=" in value:
        flag, _, rest = value.partition("=")
        local = _remap_path(rest, mounts)
        return value if local is None else f"{flag}={local}"
    if ":" in value and "://" not in value:
        parts = value.split(":")
        local_parts = [_remap_path(part, mounts) for part in parts]
        if any(part is not None for part in local_parts):
            return ":".join(p if lp is None else lp for p, lp in zip(parts, local_parts, strict=True))
    return value


def safe_relative(path: str) -> PurePosixPath | None:
    """`path` as a relative path that stays inside its directory, or None (absolute, `..`, empty)."""
    relative = PurePosixPath(path.lstrip("/"))
    if not path or ".." in relative.parts or str(relative) in ("", "."):
        return None
    return relative


@dataclass(frozen=True)
class TokenFile:
    """A projected service-account token: where it is written, for how long, for whom."""

    path: Path
    seconds: int
    audience: str | None


@dataclass
class PodVolumes:
    """A pod's volumes made local (by volume name), what was left out, and the tokens to renew."""

    pod_dir: Path
    dirs: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokens: list[TokenFile] = field(default_factory=list)

    def mounts(self, container: JsonDict, env: Mapping[str, str]) -> tuple[list[Mount], list[str]]:
        """The container's mounts (subPath and subPathExpr applied) and a note for each one left out."""
        mounts: list[Mount] = []
        notes: list[str] = []
        for mount in container.get("volumeMounts") or []:
            name, path = str(mount.get("name")), str(mount.get("mountPath"))
            if path == contract.SHM_MOUNT_PATH:
                continue  # the host's /dev/shm serves
            local = self.dirs.get(name)
            if local is None:
                notes.append(f"mount {path}: volume {name} is not defined: left out")
                continue
            sub_path = str(mount.get("subPath") or "")
            if mount.get("subPathExpr"):
                sub_path = expand(str(mount["subPathExpr"]), env)
            if sub_path:
                relative = safe_relative(sub_path)
                if relative is None:
                    notes.append(f"mount {path}: subPath {sub_path!r} leaves the volume: left out")
                    continue
                local = local / relative
                if not local.exists():
                    local.mkdir(parents=True)
            mounts.append(Mount(path, local))
        return mounts, notes


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Writes `data` atomically (a reader never sees half a file) with `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def object_bytes(kind: str, obj: JsonDict | None, key: str) -> bytes | None:
    """One key of a ConfigMap (data or binaryData) or of a Secret (data, decoded, or stringData)."""
    if obj is None:
        return None
    data = obj.get("data") or {}
    if kind == "ConfigMap":
        if key in data:
            return str(data[key]).encode()
        binary = (obj.get("binaryData") or {}).get(key)
        return None if binary is None else base64.b64decode(binary)
    if key in data:
        return base64.b64decode(data[key])
    plain = (obj.get("stringData") or {}).get(key)
    return None if plain is None else str(plain).encode()


def object_value(kind: str, obj: JsonDict | None, key: str) -> str | None:
    """One key of a ConfigMap or Secret as text (environment variables)."""
    value = object_bytes(kind, obj, key)
    return None if value is None else value.decode("utf-8", errors="replace")


def object_keys(obj: JsonDict) -> list[str]:
    return sorted({*(obj.get("data") or {}), *(obj.get("binaryData") or {}), *(obj.get("stringData") or {})})


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

    def pod_dir(self, pod: JsonDict) -> Path:
        metadata = pod["metadata"]
        return self.state_dir / str(metadata["namespace"]) / "pods" / f"{metadata['name']}-{metadata['uid']}"

    def remove_pod(self, pod: JsonDict) -> None:
        """The pod's own directories (emptyDir, configMap, secret, token, home), once it is deleted and
        nothing of it runs, as a kubelet cleans up after a pod."""
        shutil.rmtree(self.pod_dir(pod), ignore_errors=True)

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.state_dir / namespace / "claims" / claim

    def prepare(self, pod: JsonDict) -> PodVolumes:
        """Every volume of the pod as a local directory; configMap, secret, projected and downwardAPI
        contents written now (SkipPod when a required ConfigMap or Secret does not exist)."""
        result = PodVolumes(self.pod_dir(pod))
        for volume in pod["spec"].get("volumes") or []:
            name = str(volume.get("name"))
            local = self.volume_dir(pod, volume, result)
            if not local.is_file():  # a hostPath of type File is a file
                local.mkdir(parents=True, exist_ok=True)
            result.dirs[name] = local
        return result

    def volume_dir(self, pod: JsonDict, volume: JsonDict, result: PodVolumes) -> Path:
        namespace, name = str(pod["metadata"]["namespace"]), str(volume.get("name"))
        own = result.pod_dir / "volumes" / name
        if "persistentVolumeClaim" in volume:
            return self.claim_dir(namespace, str((volume["persistentVolumeClaim"] or {}).get("claimName")))
        if "nfs" in volume:
            nfs = volume["nfs"] or {}
            export = safe_relative(str(nfs.get("path") or "/")) or PurePosixPath("root")
            return self.state_dir / "nfs" / str(nfs.get("server")) / export
        if "hostPath" in volume:
            return self.host_path(pod, volume["hostPath"] or {}, result)
        if "configMap" in volume or "secret" in volume:
            kind = "ConfigMap" if "configMap" in volume else "Secret"
            source = volume.get("configMap") or volume.get("secret") or {}
            self.write_object(
                kind, namespace, source, own, what=f"volume {name}", default_mode=source.get("defaultMode")
            )
        elif "projected" in volume:
            projected = volume["projected"] or {}
            for source in projected.get("sources") or []:
                self.write_projection(pod, source, own, result, projected.get("defaultMode"))
        elif "downwardAPI" in volume:
            downward = volume["downwardAPI"] or {}
            self.write_downward(pod, downward, own, result, downward.get("defaultMode"))
        elif not any(kind in volume for kind in POD_LOCAL):
            kinds = ", ".join(kind for kind in volume if kind != "name") or "no source"
            result.notes.append(f"volume {name} ({kinds}) is an empty directory here")
        return own

    def host_path(self, pod: JsonDict, source: JsonDict, result: PodVolumes) -> Path:
        """The node's path under hostpath/<node>/; a FileOrCreate or File path becomes a file."""
        node = str(pod["spec"].get("nodeName") or "no-node")
        path = str(source.get("path") or "/")
        local = self.state_dir / "hostpath" / node / (safe_relative(path) or PurePosixPath("root"))
        kind = str(source.get("type") or "")
        if kind in ("File", "FileOrCreate"):
            local.parent.mkdir(parents=True, exist_ok=True)
            local.touch(exist_ok=True)
        elif kind in ("Socket", "CharDevice", "BlockDevice"):
            result.notes.append(f"hostPath {path} of type {kind} is an empty directory here")
        return local

    def write_object(
        self, kind: str, namespace: str, source: JsonDict, directory: Path, *, what: str, default_mode: object
    ) -> None:
        """A ConfigMap's or Secret's keys (or the chosen `items`) as files in `directory`."""
        object_name = str(source.get("name") or source.get("secretName"))
        obj = self.lookup(kind, namespace, object_name)
        if obj is None:
            if source.get("optional"):
                return
            raise SkipPod(f"{kind} {object_name} of {what} does not exist")
        items = source.get("items")
        selected = (
            [(str(i.get("key")), str(i.get("path")), i.get("mode")) for i in items]
            if items
            else [(key, key, None) for key in object_keys(obj)]
        )
        for key, path, mode in selected:
            value = object_bytes(kind, obj, key)
            relative = safe_relative(path)
            if value is None:
                if items and not source.get("optional"):
                    raise SkipPod(f"{kind} {object_name} of {what} has no key {key}")
                continue
            if relative is not None:
                write_private(directory / relative, value, file_mode(mode, default_mode))

    def write_projection(
        self, pod: JsonDict, source: JsonDict, directory: Path, result: PodVolumes, default_mode: object
    ) -> None:
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
            object_source = source.get("configMap") or source.get("secret") or {}
            self.write_object(
                kind, namespace, object_source, directory, what="a projection", default_mode=default_mode
            )
        elif "downwardAPI" in source:
            self.write_downward(pod, source["downwardAPI"] or {}, directory, result, default_mode)
        else:
            result.notes.append(f"projected source {', '.join(source)}: not supported locally, skipped")

    def write_downward(
        self, pod: JsonDict, source: JsonDict, directory: Path, result: PodVolumes, default_mode: object
    ) -> None:
        for item in source.get("items") or []:
            path = str((item.get("fieldRef") or {}).get("fieldPath", ""))
            value = field_value(pod, path)
            relative = safe_relative(str(item.get("path", "")))
            if value is None or relative is None:
                result.notes.append(f"downwardAPI {item.get('path')} ({path or 'resourceFieldRef'}): skipped")
                continue
            write_private(directory / relative, value.encode(), file_mode(item.get("mode"), default_mode))

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


def file_mode(mode: object, default_mode: object) -> int:
    """An item's mode, else the volume's defaultMode, else 0644; the owner can always read its files."""
    for value in (mode, default_mode):
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777:
            return value | 0o400
    return DEFAULT_MODE
