"""A local kubelet for the dev cluster: runs TrainingJob pods' reference trainer as local processes.

Why: the local control plane has no kubelet (kwok moves pods to Running and nothing ever runs), so
without this a TrainingJob never trains there: no progress, no checkpoints, no completion. For the
demo and for end-to-end tests of the whole loop (operator -> pods -> trainer -> progress annotation ->
status -> restart from the reported checkpoint) this plays the part of the kubelet for the pods the
operator manages in the namespaces it is given:

- it watches pods labelled app.kubernetes.io/managed-by=trainingjob-operator (the project's informer,
  admin kubeconfig); a pod that kwok marked Running is started once as a local process;
- the pod's volumes become local directories under <state-dir>/<ns>/<job>/: the job's ConfigMap
  (train.py, trainingjob_progress.py, config.json) is `config/`, the checkpoint volume `checkpoints/`,
  other configMap, secret and storage volumes `volumes/<name>/`, and the pod's own (emptyDir, the
  projected service-account volume) `pods/<pod>/<name>/`; configMap, secret and projected contents
  are written from the API. Every mount path is remapped in the environment (CHECKPOINT_DIR,
  RESUME_FROM, TRAININGJOB_CONFIG, ...) and in the trainer's arguments;
- the environment is resolved as a kubelet does (values with $(VAR) expansion, fieldRef,
  secretKeyRef / configMapKeyRef and envFrom through the API; what cannot be resolved is skipped with a
  log line) and handed over clean: of this process's environment only PATH and the locale, so no
  admin credentials reach the trainer;
- progress goes to the real API server with the pod's own ServiceAccount token: the projected token is
  minted with a TokenRequest bound to the pod, as a kubelet does, and renewed before it expires; the
  progress helper finds it, the projected CA and the API server's address through
  TRAININGJOB_PROGRESS_TOKEN_FILE / _CA_FILE / _API_URL (the in-pod path cannot be remapped);
- only the reference trainer runs (`python /etc/trainingjob/train.py`, started with this interpreter);
  other commands are logged and their pods left Running. The trainer runs its pure-Python simulation
  (TRAIN_SIMULATE=1): ranks exchange nothing, so nothing listens on any port, it needs no torch (the
  demo's virtualenv has none) and an epoch takes as long as TRAIN_STEP_SECONDS says. Real
  torch.distributed with the operator's environment is covered by tests/e2e/test_real_training.py.
  MASTER_ADDR is 127.0.0.1 and MASTER_PORT one free port per job attempt, the same for every rank;
- the gang starts together, as a rendezvous would hold it: a pod's process starts once every pod of
  its attempt is Running and no process of an older attempt of the job is still stopping;
- when a process exits, the pod's status is patched as a kubelet reports it (hack/podstatus.py: phase,
  the container's terminated state with exit code and reason, the log's tail as message on failure);
- a pod that is deleted (gang restart, suspend, clean-up) gets SIGTERM, then SIGKILL after its grace
  period. When this process stops it stops its trainers and ends their pods with DisruptionTarget
  TerminationByKubelet (a node shutdown); pods it ran before a crash are ended the same way when it
  starts again (ContainerStatusUnknown), so the operator restarts the gang from its last checkpoint.

Each pod's output goes to <log-dir>/<ns>_<pod>.log (appended across attempts). This process logs plain
lines to stderr. It never exits because of a pod: anything odd is logged and the pod skipped.

    .venv/bin/python hack/local_kubelet.py --namespace demo [--namespace other ...]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from builders.pods import CHECKPOINT_VOLUME, CONFIG_VOLUME  # noqa: E402
from controller.errors import KubeError, NotFound, is_retryable  # noqa: E402
from controller.informer import Informer  # noqa: E402
from controller.kube import CONFIGMAPS, PODS, SECRETS, SERVICEACCOUNTS, KubeClient, from_kubeconfig  # noqa: E402
from controller.store import Store  # noqa: E402
from crd import contract  # noqa: E402
from hack.podstatus import (  # noqa: E402
    exit_code_of,
    log_tail_message,
    now_rfc3339,
    terminated_status_patch,
)

DEV: Final = Path(os.environ.get("TJ_DEV_DIR", REPO / ".dev"))
# Where a kubelet mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS: Final = 3600
TOKEN_REFRESH_FRACTION: Final = 0.8
TOKEN_REFRESH_SECONDS: Final = 30.0  # retry a failed renewal this much later
DEFAULT_GRACE_SECONDS: Final = 30
# A stop takes at most SHUTDOWN_SECONDS, below `hack/dev-cluster.sh stop`'s 30 s wait, so trainers are
# never left behind: SIGTERM, SIGKILL after SHUTDOWN_GRACE_SECONDS, then reports retried until the end.
SHUTDOWN_GRACE_SECONDS: Final = 10.0
SHUTDOWN_SECONDS: Final = 25.0
TICK_SECONDS: Final = 0.5
PYTHON_NAME: Final = re.compile(r"^python(\d+(\.\d+)?)?$")
PYTHON_FLAG: Final = re.compile(r"^-[uBOsSEIq]+$")
WHO: Final = "the local kubelet"
# Environment variables passed on from this process: only what finding programs needs.
PASSED_ENV: Final = ("PATH", "LANG", "LC_ALL", "TZ")

log = logging.getLogger("local-kubelet")

JsonDict = dict[str, Any]
Lookup = Callable[[str, str, str], JsonDict | None]  # (kind, namespace, name) -> object or None


class SkipPod(Exception):
    """This pod cannot run here (the reason is the message); it is left as it is."""


# ---------------------------------------------------------------------------------------------------
# Pure helpers: what a kubelet computes from a pod (unit-tested in tests/unit/test_local_kubelet.py)


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


_SUBSCRIPT: Final = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


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


def _key_of(kind: str, obj: JsonDict | None, key: str) -> str | None:
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
                value = _key_of(kind, obj, key)
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
            value = _key_of(kind, obj, str(ref.get("key")))
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


def reference_trainer_args(
    tokens: list[str], config_mount: str = contract.CONFIG_MOUNT_PATH
) -> tuple[list[str], list[str]] | None:
    """For `python [-u ...] /etc/trainingjob/train.py [args...]`: the interpreter's flags and the
    script's arguments. None for any other command."""
    if not tokens or not PYTHON_NAME.match(os.path.basename(tokens[0])):
        return None
    script = f"{config_mount}/{contract.TRAINER_FILE}"
    for index, token in enumerate(tokens[1:], start=1):
        if token == script:
            return tokens[1:index], tokens[index + 1 :]
        if not PYTHON_FLAG.match(token):
            return None
    return None


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
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return max(1, int(annotations.get(contract.NUM_WORKERS_ANNOTATION, "1")))
    except ValueError:
        return 1


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (identifies it even if the pid is reused); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return None if fields[0] == "Z" else fields[19]


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Writes `data` atomically (a reader never sees half a file) with `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------------
# Running processes


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


@dataclass(frozen=True)
class Launch:
    """What starting one pod's trainer takes, decided before anything runs."""

    uid: str
    namespace: str
    name: str
    job: str
    attempt: str
    command: list[str]
    env: dict[str, str]
    work: Path
    port: int
    notes: list[str]
    tokens: list[TokenFile]
    fallback_to_logs: bool


@dataclass
class Running:
    """One trainer process standing in for a pod's container."""

    uid: str
    namespace: str
    name: str
    job: str
    attempt: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    tokens: list[TokenFile]
    token_minted: float
    fallback_to_logs: bool
    stopping: str | None = None  # why SIGTERM was sent: "deleted" or "shutdown"
    kill_at: float | None = None


@dataclass
class Exited:
    uid: str
    returncode: int


@dataclass
class PodEvent:
    kind: str  # "upsert" or "delete"
    pod: JsonDict


@dataclass
class Kubelet:
    client: KubeClient
    namespaces: list[str]
    state_dir: Path
    log_dir: Path
    python: str = sys.executable
    events: queue.Queue[PodEvent | Exited | None] = field(default_factory=queue.Queue)
    pods: dict[str, JsonDict] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # uids started and ended, or skipped
    retry_at: dict[str, tuple[int, float]] = field(default_factory=dict)
    ports: dict[tuple[str, str, str], int] = field(default_factory=dict)
    unreported: dict[str, JsonDict] = field(default_factory=dict)  # uid -> status patch to retry
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        configuration = self.client.api_client.configuration
        self.api_url = str(configuration.host).rstrip("/")
        self.ca_file: Path | None = None
        if configuration.ssl_ca_cert:
            self.ca_file = self.state_dir / "ca.crt"
            write_private(self.ca_file, Path(configuration.ssl_ca_cert).read_bytes(), 0o644)
        self.records = self.state_dir / "processes"

    # ---- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        informers = [
            Informer(self.client, PODS, Store(), namespace=ns, label_selector=contract.MANAGED_SELECTOR)
            for ns in self.namespaces
        ]
        for informer in informers:
            informer.add_handler(
                on_add=lambda pod: self.events.put(PodEvent("upsert", pod)),
                on_update=lambda _old, pod: self.events.put(PodEvent("upsert", pod)),
                on_delete=lambda pod: self.events.put(PodEvent("delete", pod)),
            )
        threads = [
            threading.Thread(target=i.run, args=(self.stop,), name=f"informer-{i.name}", daemon=True)
            for i in informers
        ]
        for thread in threads:
            thread.start()
        while not self.stop.is_set() and not all(i.has_synced() for i in informers):
            self.stop.wait(0.1)
        self._drain(block=False)
        log.info(
            "watching pods of %s in namespace(s) %s; trainer logs in %s",
            contract.OPERATOR_NAME,
            ", ".join(self.namespaces),
            self.log_dir,
        )
        self.recover()
        while not self.stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("unexpected error; carrying on")
            self._drain(block=True)
        log.info("stopping: ending %d trainer process(es)", len(self.running))
        for informer in informers:
            informer.stop()
        self.shutdown()

    def _drain(self, *, block: bool) -> None:
        try:
            item = self.events.get(timeout=TICK_SECONDS) if block else self.events.get_nowait()
            while True:
                self.handle(item)
                item = self.events.get_nowait()
        except queue.Empty:
            return

    def handle(self, item: PodEvent | Exited | None) -> None:
        if item is None:
            return
        try:
            if isinstance(item, Exited):
                self.on_exit(item)
            elif item.kind == "delete":
                self.on_delete(item.pod)
            else:
                self.on_pod(item.pod)
        except Exception:
            log.exception("could not handle %s", item if isinstance(item, Exited) else pod_label(item.pod))

    def on_pod(self, pod: JsonDict) -> None:
        if not well_formed(pod):
            log.warning("ignoring a malformed pod: %.300r", pod)
            return
        uid = str(pod["metadata"]["uid"])
        self.pods[uid] = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.terminate(uid, "deleted")

    def on_delete(self, pod: JsonDict) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        self.pods.pop(uid, None)
        self.done.discard(uid)
        self.retry_at.pop(uid, None)
        self.unreported.pop(uid, None)
        self.terminate(uid, "deleted")

    def tick(self) -> None:
        """Periodic work: retry unreported ends, start pods whose gang is ready, deadlines, tokens."""
        now = time.monotonic()
        for uid in list(self.unreported):
            self.report_end(uid, self.unreported.pop(uid))
        self.start_ready(now)
        self.enforce_deadlines(now)
        live = {(p.namespace, p.job, p.attempt) for p in self.running.values()}
        live |= {
            (str(p["metadata"]["namespace"]), job_of(p) or "", attempt_of(p)) for p in self.pods.values()
        }
        for key in [key for key in self.ports if key not in live]:
            del self.ports[key]

    def start_ready(self, now: float) -> None:
        for uid, pod in list(self.pods.items()):
            try:
                self.maybe_start(uid, pod, now)
            except Exception:
                log.exception("%s: skipped: cannot make sense of it", pod_label(pod))
                self.done.add(uid)

    def maybe_start(self, uid: str, pod: JsonDict, now: float) -> None:
        if uid in self.running or uid in self.done or not is_running(pod):
            return
        tries, when = self.retry_at.get(uid, (0, 0.0))
        if now < when or not self.gang_ready(pod):
            return
        try:
            self.start(pod)
            self.retry_at.pop(uid, None)
        except SkipPod as reason:
            log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), reason)
            self.done.add(uid)
        except KubeError as error:
            if not is_retryable(error):
                log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), error)
                self.done.add(uid)
                return
            delay = min(30.0, 2.0**tries)
            log.warning("%s: could not start (%s); retrying in %.0fs", pod_label(pod), error, delay)
            self.retry_at[uid] = (tries + 1, now + delay)

    def enforce_deadlines(self, now: float) -> None:
        for proc in self.running.values():
            if proc.kill_at is not None and now >= proc.kill_at:
                log.warning("%s/%s: still running after its grace period; SIGKILL", proc.namespace, proc.name)
                self._signal(proc, signal.SIGKILL)
                proc.kill_at = None
            elif proc.tokens and now - proc.token_minted > TOKEN_REFRESH_FRACTION * min(
                token.seconds for token in proc.tokens
            ):
                current = self.pods.get(proc.uid)
                if current is None or proc.stopping is not None:
                    continue
                try:
                    for token in proc.tokens:
                        self.mint_token(current, token)
                    proc.token_minted = now
                except KubeError as error:
                    log.warning("%s/%s: could not renew the token (%s)", proc.namespace, proc.name, error)
                    proc.token_minted += TOKEN_REFRESH_SECONDS

    def gang_ready(self, pod: JsonDict) -> bool:
        """Every pod of this attempt is Running (or already ran) and no older attempt still stops."""
        namespace, job, attempt = str(pod["metadata"]["namespace"]), job_of(pod), attempt_of(pod)
        if any(
            p.namespace == namespace and p.job == job and p.attempt != attempt for p in self.running.values()
        ):
            return False
        members = [
            (uid, p)
            for uid, p in self.pods.items()
            if p["metadata"].get("namespace") == namespace and job_of(p) == job and attempt_of(p) == attempt
        ]
        ready = sum(1 for uid, p in members if is_running(p) or uid in self.running or uid in self.done)
        return ready >= gang_size(pod)

    # ---- starting ---------------------------------------------------------------------------------

    def lookup(self, kind: str, namespace: str, name: str) -> JsonDict | None:
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
            value = _key_of(kind, obj, key)
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

    def start(self, pod: JsonDict) -> None:
        self.spawn(self.prepare(pod))

    def prepare(self, pod: JsonDict) -> Launch:
        """Everything the process needs: volumes written, environment resolved and remapped, token minted."""
        metadata, spec = pod["metadata"], pod["spec"]
        uid, namespace, name = str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"])
        job, attempt = job_of(pod), attempt_of(pod)
        if not job:
            raise SkipPod(f"no {contract.JOB_NAME_LABEL} label")
        containers = spec.get("containers") or []
        if len(containers) != 1:
            raise SkipPod(f"{len(containers)} containers; the local kubelet runs pods of one container")
        container = containers[0]
        resolved, notes = resolve_env(pod, container, self.lookup)
        tokens = [
            expand(str(t), resolved)
            for t in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        around = reference_trainer_args(tokens)
        if around is None:
            raise SkipPod(
                f"command {' '.join(tokens) or '(the image default)'!r}: only the reference trainer "
                f"(python {contract.CONFIG_MOUNT_PATH}/{contract.TRAINER_FILE}) can run locally"
            )
        volumes = self.mounts(pod, container, job)
        mounts = volumes.mounts
        config = next((m.local for m in mounts if m.path == contract.CONFIG_MOUNT_PATH), None)
        if config is None or not (config / contract.TRAINER_FILE).is_file():
            raise SkipPod(f"no {contract.TRAINER_FILE} in the volume mounted at {contract.CONFIG_MOUNT_PATH}")
        work = self.job_dir(namespace, job) / "pods" / name
        work.mkdir(parents=True, exist_ok=True)
        # Nothing of this process's environment but what finding programs needs: no KUBECONFIG, no
        # admin credentials. Then the container's own, with mount paths made local.
        env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        env["HOME"] = str(work)
        env.update({key: remap(value, mounts) for key, value in resolved.items()})
        port = self.ports.setdefault((namespace, job, attempt), free_port())
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRAIN_SIMULATE="1")
        for key, value in (("PET_MASTER_ADDR", "127.0.0.1"), ("PET_MASTER_PORT", str(port))):
            if key in env:
                env[key] = value
        if "JAX_COORDINATOR_ADDRESS" in env:
            env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
        # The progress helper reads the mounted service-account directory at a fixed path; point it at
        # the local copy of the pod's projected volume (token bound to the pod, the cluster's CA).
        env["TRAININGJOB_PROGRESS_API_URL"] = self.api_url
        account = Path(remap(SERVICE_ACCOUNT_DIR, mounts))
        for key in ("TRAININGJOB_PROGRESS_TOKEN_FILE", "TRAININGJOB_PROGRESS_CA_FILE"):
            env.pop(key, None)
        if (account / "token").is_file():
            env["TRAININGJOB_PROGRESS_TOKEN_FILE"] = str(account / "token")
        else:
            volumes.notes.append("no service-account token is mounted: progress reports go unauthenticated")
        ca_file = account / "ca.crt" if (account / "ca.crt").is_file() else self.ca_file
        if ca_file is not None:
            env["TRAININGJOB_PROGRESS_CA_FILE"] = str(ca_file)
        flags, arguments = around
        trainer = str(config / contract.TRAINER_FILE)
        return Launch(
            uid=uid,
            namespace=namespace,
            name=name,
            job=job,
            attempt=attempt,
            command=[self.python, *flags, trainer, *(remap(token, mounts) for token in arguments)],
            env=env,
            work=work,
            port=port,
            notes=notes + volumes.notes,
            tokens=volumes.tokens,
            fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        )

    def spawn(self, launch: Launch) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{launch.namespace}_{launch.name}.log"
        with log_path.open("ab") as handle:
            header = [
                f"{now_rfc3339()} local kubelet: pod {launch.namespace}/{launch.name} "
                f"(uid {launch.uid}, attempt {launch.attempt})",
                f"command: {' '.join(launch.command)}",
                f"MASTER_ADDR=127.0.0.1 MASTER_PORT={launch.port}; TRAIN_SIMULATE=1 (the reference trainer's "
                "pure-Python simulation: no torch, nothing listens)",
                *(f"skipped: {note}" for note in launch.notes),
            ]
            handle.write("".join(f"===== {line}\n" for line in header).encode())
            handle.flush()
            offset = handle.tell()  # the termination message comes from the trainer's output only
            process = subprocess.Popen(
                launch.command,
                env=launch.env,
                cwd=launch.work,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        record = {
            "namespace": launch.namespace,
            "name": launch.name,
            "pid": process.pid,
            "start_time": process_start_time(process.pid),
        }
        write_private(self.records / f"{launch.uid}.json", json.dumps(record).encode())
        self.running[launch.uid] = Running(
            uid=launch.uid,
            namespace=launch.namespace,
            name=launch.name,
            job=launch.job,
            attempt=launch.attempt,
            process=process,
            log_path=log_path,
            log_offset=offset,
            tokens=launch.tokens,
            token_minted=time.monotonic(),
            fallback_to_logs=launch.fallback_to_logs,
        )
        uid = launch.uid
        threading.Thread(
            target=lambda: self.events.put(Exited(uid, process.wait())),
            name=f"wait-{launch.name}",
            daemon=True,
        ).start()
        for note in launch.notes:
            log.warning("%s/%s: %s", launch.namespace, launch.name, note)
        log.info(
            "%s/%s: started pid %d (attempt %s, MASTER_PORT %d); log %s",
            launch.namespace,
            launch.name,
            process.pid,
            launch.attempt,
            launch.port,
            log_path,
        )

    # ---- stopping and exits -----------------------------------------------------------------------

    def _signal(self, proc: Running, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.process.pid, signum)

    def terminate(self, uid: str, why: str, grace: float | None = None) -> None:
        proc = self.running.get(uid)
        if proc is None or proc.stopping is not None:
            return
        pod = self.pods.get(uid)
        seconds = grace if grace is not None else grace_seconds(pod) if pod else float(DEFAULT_GRACE_SECONDS)
        proc.stopping = why
        proc.kill_at = time.monotonic() + seconds
        log.info(
            "%s/%s: pod %s; SIGTERM to pid %d (SIGKILL after %.0fs)",
            proc.namespace,
            proc.name,
            why,
            proc.process.pid,
            seconds,
        )
        self._signal(proc, signal.SIGTERM)

    def on_exit(self, exited: Exited) -> None:
        proc = self.running.pop(exited.uid, None)
        if proc is None:
            return
        code = exit_code_of(exited.returncode)
        with proc.log_path.open("ab") as handle:
            handle.write(f"===== {now_rfc3339()} exited with code {code}\n".encode())
        for token in proc.tokens:
            token.path.unlink(missing_ok=True)
        log.info("%s/%s: pid %d exited with code %d", proc.namespace, proc.name, proc.process.pid, code)
        pod = self.pods.get(exited.uid)
        if pod is not None:
            self.done.add(exited.uid)  # never started again; forgotten when the pod is deleted
        if pod is None or proc.stopping == "deleted":
            (self.records / f"{exited.uid}.json").unlink(missing_ok=True)
            return  # the pod is gone (or going): nobody reads its status any more
        message = None
        if code != 0 and proc.fallback_to_logs:
            with proc.log_path.open("rb") as handle:
                handle.seek(proc.log_offset)
                message = log_tail_message(handle.read().decode("utf-8", errors="replace"))
        disruption = "TerminationByKubelet" if proc.stopping == "shutdown" else None
        patch = terminated_status_patch(pod, exit_code=code, message=message, disruption=disruption, who=WHO)
        self.report_end(exited.uid, patch)

    def report_end(self, uid: str, patch: JsonDict) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            (self.records / f"{uid}.json").unlink(missing_ok=True)
            return
        metadata = pod["metadata"]
        try:
            self.client.patch(
                PODS,
                str(metadata["namespace"]),
                str(metadata["name"]),
                patch,
                patch_type="strategic",
                subresource="status",
            )
        except NotFound:
            pass
        except KubeError as error:
            log.warning("%s: could not report the container's end (%s); retrying", pod_label(pod), error)
            self.unreported[uid] = patch
            return
        (self.records / f"{uid}.json").unlink(missing_ok=True)
        log.info("%s: reported phase %s", pod_label(pod), patch["status"]["phase"])

    def recover(self) -> None:
        """Processes a previous run of this kubelet started: killed if still there, and their pods ended
        like containers lost on a node restart, so the operator restarts the gang."""
        if not self.records.is_dir():
            return
        for path in sorted(self.records.glob("*.json")):
            uid = path.stem
            try:
                record = json.loads(path.read_text())
                pid = int(record["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if process_start_time(pid) is not None and process_start_time(pid) == record.get("start_time"):
                log.warning(
                    "killing pid %d left by an earlier run (pod %s/%s)",
                    pid,
                    record.get("namespace"),
                    record.get("name"),
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            pod = self.pods.get(uid)
            self.done.add(uid)
            if pod is None or not is_running(pod):
                path.unlink(missing_ok=True)
                continue
            patch = terminated_status_patch(
                pod,
                exit_code=137,
                reason="ContainerStatusUnknown",
                message="The container could not be located when the local kubelet restarted",
                disruption="TerminationByKubelet",
                who=WHO,
            )
            self.report_end(uid, patch)

    def shutdown(self) -> None:
        """Stops every trainer (SIGTERM, SIGKILL after its grace) and reports their pods ended, within
        SHUTDOWN_SECONDS: reports the API server refuses are retried until then (it may be restarting),
        then left to the next start (`recover`)."""
        started = time.monotonic()
        # Short requests from now on: an API server that is away must not hold the stop up.
        self.client = KubeClient(self.client.api_client, qps=0, burst=0, max_attempts=2, max_elapsed=3.0)
        for uid in list(self.running):
            self.terminate(
                uid, "shutdown", grace=min(SHUTDOWN_GRACE_SECONDS, grace_seconds(self.pods.get(uid, {})))
            )
        while self.running and time.monotonic() < started + SHUTDOWN_GRACE_SECONDS + 5:
            with contextlib.suppress(queue.Empty):
                self.handle(self.events.get(timeout=TICK_SECONDS))
            now = time.monotonic()
            for proc in self.running.values():
                if proc.kill_at is not None and now >= proc.kill_at:
                    self._signal(proc, signal.SIGKILL)
                    proc.kill_at = None
        while self.unreported and time.monotonic() < started + SHUTDOWN_SECONDS:
            for uid in list(self.unreported):
                self.report_end(uid, self.unreported.pop(uid))
            if self.unreported:
                time.sleep(TICK_SECONDS)
        if self.unreported:
            log.warning("%d pod end(s) not reported; the next start reports them", len(self.unreported))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/local_kubelet.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--namespace", "-n", action="append", required=True, help="watch this namespace (repeatable)"
    )
    parser.add_argument(
        "--kubeconfig", default=str(DEV / "kubeconfig"), help="admin kubeconfig (default: the dev cluster's)"
    )
    parser.add_argument(
        "--state-dir", default=str(DEV / "local-kubelet"), help="volumes, tokens and process records"
    )
    parser.add_argument(
        "--log-dir", default=str(DEV / "logs" / "pods"), help="one log per pod: <ns>_<pod>.log"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the trainer (default: this one)"
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        client = from_kubeconfig(args.kubeconfig, None, qps=50, burst=100)
    except Exception as error:
        log.error("cannot load the kubeconfig %s: %s", args.kubeconfig, error)
        return 1
    client = KubeClient(client.api_client, qps=50, burst=100, max_elapsed=10.0)
    kubelet = Kubelet(
        client,
        sorted(set(args.namespace)),
        Path(args.state_dir).resolve(),
        Path(args.log_dir).resolve(),
        python=args.python,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        kubelet.stop.set()
        kubelet.events.put(None)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kubelet.run()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
