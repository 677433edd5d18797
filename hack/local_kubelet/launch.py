"""From a Running pod to a Launch: the trainer's command, environment and directories, or SkipPod.

Why apart: this is where the kubelet's pieces meet (the pod's facts, its environment, its volumes),
and where a pod the local kubelet cannot run is refused with the reason: no job label, more than one
container, a command other than the reference trainer, no trainer in its config volume. Only the
reference trainer runs here, started with the kubelet's own interpreter and its arguments remapped.
"""

from __future__ import annotations

from pathlib import Path

from crd import contract
from hack.common import JsonDict, free_port
from hack.local_kubelet.env import expand, local_env, resolve_env
from hack.local_kubelet.pods import SkipPod, attempt_of, job_of, reference_trainer_args
from hack.local_kubelet.processes import Launch
from hack.local_kubelet.volumes import LocalVolumes, remap

AttemptKey = tuple[str, str, str]  # (namespace, job, attempt)


def prepare(
    pod: JsonDict,
    volumes: LocalVolumes,
    *,
    python: str,
    ports: dict[AttemptKey, int],
    api_url: str,
    ca_file: Path | None,
) -> Launch:
    """Everything the process needs: volumes written, environment resolved and remapped, token minted.
    Every rank of one attempt of a job gets the same MASTER_PORT (a free one, kept in `ports`)."""
    metadata, spec = pod["metadata"], pod["spec"]
    uid, namespace, name = str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"])
    job, attempt = job_of(pod), attempt_of(pod)
    if not job:
        raise SkipPod(f"no {contract.JOB_NAME_LABEL} label")
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise SkipPod(f"{len(containers)} containers; the local kubelet runs pods of one container")
    container = containers[0]
    resolved, notes = resolve_env(pod, container, volumes.lookup)
    tokens = [
        expand(str(t), resolved) for t in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    around = reference_trainer_args(tokens)
    if around is None:
        raise SkipPod(
            f"command {' '.join(tokens) or '(the image default)'!r}: only the reference trainer "
            f"(python {contract.CONFIG_MOUNT_PATH}/{contract.TRAINER_FILE}) can run locally"
        )
    local = volumes.mounts(pod, container, job)
    mounts = local.mounts
    config = next((m.local for m in mounts if m.path == contract.CONFIG_MOUNT_PATH), None)
    if config is None or not (config / contract.TRAINER_FILE).is_file():
        raise SkipPod(f"no {contract.TRAINER_FILE} in the volume mounted at {contract.CONFIG_MOUNT_PATH}")
    work = volumes.job_dir(namespace, job) / "pods" / name
    work.mkdir(parents=True, exist_ok=True)
    port = ports.setdefault((namespace, job, attempt), free_port())
    env = local_env(
        resolved, mounts, home=work, port=port, api_url=api_url, ca_file=ca_file, notes=local.notes
    )
    flags, arguments = around
    trainer = str(config / contract.TRAINER_FILE)
    return Launch(
        uid=uid,
        namespace=namespace,
        name=name,
        job=job,
        attempt=attempt,
        command=[python, *flags, trainer, *(remap(token, mounts) for token in arguments)],
        env=env,
        work=work,
        port=port,
        notes=notes + local.notes,
        tokens=local.tokens,
        fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
    )
