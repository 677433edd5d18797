"""A container's environment as a kubelet computes it, then made fit for a local trainer process.

Why: the trainer behaves as in a cluster only if it sees what a kubelet would hand it: values with
$(VAR) expansion, the downward API (fieldRef), Secret and ConfigMap references, envFrom. What cannot
be resolved locally is skipped with a note, never guessed. The local part comes after: mount paths
made local, the rendezvous on 127.0.0.1, the progress helper pointed at the API server with the pod's
own token, and of this process's environment only what finding programs needs (no admin credentials
reach a trainer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from hack.common import JsonDict
from hack.local_kubelet.pods import expand, field_value
from hack.local_kubelet.volumes import SERVICE_ACCOUNT_DIR, Mount, object_value, remap

Lookup = Callable[[str, str, str], JsonDict | None]  # (kind, namespace, name) -> object or None

# Environment variables passed on from this process: only what finding programs needs.
PASSED_ENV: Final = ("PATH", "LANG", "LC_ALL", "TZ")


def _env_from(namespace: str, container: JsonDict, lookup: Lookup, notes: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(ref_key)
            if not ref:
                continue
            obj = lookup(kind, namespace, str(ref.get("name")))
            if obj is None:
                if not ref.get("optional"):
                    notes.append(f"envFrom {kind} {ref.get('name')} not found: skipped")
                continue
            for key in sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})}):
                value = object_value(kind, obj, key)
                if value is not None:
                    env[prefix + key] = value
    return env


def _value_from(pod: JsonDict, name: str, source: JsonDict, lookup: Lookup, notes: list[str]) -> str | None:
    if "fieldRef" in source:
        path = str((source["fieldRef"] or {}).get("fieldPath", ""))
        value = field_value(pod, path)
        if value is None:
            notes.append(f"{name}: fieldRef {path} is not available locally: skipped")
        return value
    for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
        if ref_key in source:
            ref = source[ref_key] or {}
            obj = lookup(kind, str(pod["metadata"]["namespace"]), str(ref.get("name")))
            value = object_value(kind, obj, str(ref.get("key")))
            if value is None and not ref.get("optional"):
                notes.append(f"{name}: {kind} {ref.get('name')} key {ref.get('key')} not found: skipped")
            return value
    notes.append(f"{name}: {', '.join(source)} is not supported locally: skipped")
    return None


def resolve_env(pod: JsonDict, container: JsonDict, lookup: Lookup) -> tuple[dict[str, str], list[str]]:
    """The container's environment as a kubelet hands it over, and a note for each entry skipped.

    envFrom first, then env in order; a value is expanded against what came before it.
    """
    notes: list[str] = []
    env = _env_from(str(pod["metadata"]["namespace"]), container, lookup, notes)
    for entry in container.get("env") or []:
        name = str(entry.get("name", ""))
        if not name:
            continue
        if "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value", "")), env)
            continue
        value = _value_from(pod, name, entry["valueFrom"] or {}, lookup, notes)
        if value is not None:
            env[name] = value
    return env, notes


def local_env(
    resolved: Mapping[str, str],
    mounts: list[Mount],
    *,
    home: Path,
    port: int,
    api_url: str,
    ca_file: Path | None,
    notes: list[str],
    trainer: bool = True,
    torchrun_port: int | None = None,
) -> dict[str, str]:
    """What a container's process gets: of this process's environment only PATH and the locale (no
    KUBECONFIG, no admin credentials), then the container's own with mount paths made local. The
    trainer also gets the rendezvous on 127.0.0.1:`port`, the simulation, and the progress helper's API
    address, token and CA. A trainer under torchrun (`torchrun_port` set) runs real torch instead of
    the simulation, with torchrun's rendezvous on 127.0.0.1:`torchrun_port` and every peer on the
    loopback interface."""
    env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
    env["HOME"] = str(home)
    env.update({key: remap(value, mounts) for key, value in resolved.items()})
    if not trainer:
        return env
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torchrun_port is None:
        env["TRAIN_SIMULATE"] = "1"
    else:
        # Every agent and process is on this machine: the rendezvous, the address agents publish for
        # their processes' store (PET_LOCAL_ADDR) and Gloo's sockets are all on the loopback.
        env.update(PET_RDZV_ENDPOINT=f"127.0.0.1:{torchrun_port}", PET_LOCAL_ADDR="127.0.0.1")
        env["GLOO_SOCKET_IFNAME"] = "lo"
    for key, value in (("PET_MASTER_ADDR", "127.0.0.1"), ("PET_MASTER_PORT", str(port))):
        if key in env:
            env[key] = value
    if "JAX_COORDINATOR_ADDRESS" in env:
        env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
    # The progress helper reads the mounted service-account directory at a fixed path; point it at
    # the local copy of the pod's projected volume (token bound to the pod, the cluster's CA).
    env["TRAININGJOB_PROGRESS_API_URL"] = api_url
    account = Path(remap(SERVICE_ACCOUNT_DIR, mounts))
    for key in ("TRAININGJOB_PROGRESS_TOKEN_FILE", "TRAININGJOB_PROGRESS_CA_FILE"):
        env.pop(key, None)
    if (account / "token").is_file():
        env["TRAININGJOB_PROGRESS_TOKEN_FILE"] = str(account / "token")
    else:
        notes.append("no service-account token is mounted: progress reports go unauthenticated")
    ca = account / "ca.crt" if (account / "ca.crt").is_file() else ca_file
    if ca is not None:
        env["TRAININGJOB_PROGRESS_CA_FILE"] = str(ca)
    return env
