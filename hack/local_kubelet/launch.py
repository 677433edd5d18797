"""From a Running pod to a PodLaunch: each container's command, environment and directories, or SkipPod.

Why apart: this is where the kubelet's pieces meet (the pod's facts, its environment, its volumes),
and where a pod the local kubelet cannot run is refused with the reason: no job label, no `trainer`
container, a trainer command that cannot run here. What runs: a container whose command is
`python [flags] SCRIPT [args]` with SCRIPT in one of the pod's volumes (the reference trainer at
/etc/trainingjob/train.py, or your own code from a ConfigMap or a claim), started with the kubelet's
interpreter (`--python`), its arguments remapped; and a trainer launched by torchrun (`torchrun ARGS`
or `python -m torch.distributed.run ARGS`, an elastic job's default) whose training script is in one
of the pod's volumes, run by the same interpreter's torch through loopback_torchrun.py, which keeps
every store torchrun starts on 127.0.0.1. Any other command (an image's own program: a proxy, a log
shipper, `sh -c`) cannot run on this machine; for a sidecar or a classic extra
container a stand-in runs instead, which sleeps until the pod is stopped (exit 0), and for an init
container a stand-in that completes at once (exit 0), each saying so in its log. The trainer itself
is never replaced by a stand-in: its pod is left as kwok marked it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from crd import contract
from hack.common import JsonDict, free_ports
from hack.local_kubelet.env import local_env, resolve_env
from hack.local_kubelet.pods import (
    Role,
    SkipPod,
    attempt_of,
    containers_in_order,
    expand,
    job_of,
    python_script_args,
    torchrun_args,
)
from hack.local_kubelet.volumes import LocalVolumes, Mount, PodVolumes, TokenFile, remap

AttemptKey = tuple[str, str, str]  # (namespace, job, attempt)

# The stand-ins, run with `python -c CODE MESSAGE`: one waits for SIGTERM and exits 0, one exits 0 at once.
STAND_IN_SLEEP: Final = (
    "import signal, sys; print(sys.argv[1], flush=True); "
    "stop = {signal.SIGTERM, signal.SIGINT}; signal.pthread_sigmask(signal.SIG_BLOCK, stop); "
    "signal.sigwait(stop); print('stand-in: stopped', flush=True)"
)
STAND_IN_DONE: Final = "import sys; print(sys.argv[1], flush=True)"


NOT_RUNNABLE: Final = (
    "only `python SCRIPT` and torchrun with the script in one of the pod's volumes can run locally (the "
    f"reference trainer is python {contract.CONFIG_MOUNT_PATH}/{contract.TRAINER_FILE})"
)
# torchrun with its stores on 127.0.0.1, run with the trainers' interpreter.
LOOPBACK_TORCHRUN: Final = Path(__file__).resolve().parent / "loopback_torchrun.py"


@dataclass(frozen=True)
class AttemptPorts:
    """The local ports every pod of one attempt of a job shares: MASTER_PORT, torchrun's rendezvous."""

    master: int
    rendezvous: int

    @classmethod
    def free(cls) -> AttemptPorts:
        master, rendezvous = free_ports(2)
        return cls(master, rendezvous)


def command_tokens(container: JsonDict, env: dict[str, str]) -> list[str]:
    """The container's command and arguments, $(VAR) expanded against its environment."""
    raw = [*(container.get("command") or []), *(container.get("args") or [])]
    return [expand(str(token), env) for token in raw]


@dataclass(frozen=True)
class ContainerLaunch:
    """What starting one container takes, decided before anything runs."""

    name: str
    role: Role
    image: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    notes: list[str]
    described: str  # the command as the pod states it (expanded), for the pod's journal
    stand_in: bool
    trainer: bool
    fallback_to_logs: bool
    torchrun: bool = False


@dataclass(frozen=True)
class PodLaunch:
    """A pod's containers in start order, and what they share."""

    uid: str
    namespace: str
    name: str
    job: str
    attempt: str
    port: int
    containers: list[ContainerLaunch]
    tokens: list[TokenFile]
    notes: list[str]

    def container(self, name: str) -> ContainerLaunch:
        return next(c for c in self.containers if c.name == name)


@dataclass(frozen=True)
class LocalSettings:
    """What every launch shares: the interpreter, the API server's address and CA."""

    python: str
    api_url: str
    ca_file: Path | None


def local_script(
    tokens: list[str], working_dir: str, mounts: list[Mount]
) -> tuple[list[str], Path, list[str]] | None:
    """For a python command whose script is a file of the pod's volumes here: the interpreter flags, the
    local script and the arguments; else None."""
    parsed = python_script_args(tokens)
    if parsed is None:
        return None
    flags, script, arguments = parsed
    in_pod = PurePosixPath(working_dir or "/") / script  # a relative script is under the working dir
    local = Path(remap(str(in_pod), mounts))
    if local == Path(str(in_pod)) or not local.is_file():
        return None
    return flags, local, arguments


def local_torchrun(tokens: list[str], working_dir: str, mounts: list[Mount]) -> list[str] | None:
    """For torchrun whose training script (the first argument that is a file of the pod's volumes here)
    is local: torchrun's arguments with that script and every mount path made local; else None."""
    parsed = torchrun_args(tokens)
    if parsed is None:
        return None
    local_args: list[str] = []
    script: Path | None = None
    for argument in parsed:
        in_pod = PurePosixPath(working_dir or "/") / argument
        local = Path(remap(str(in_pod), mounts))
        if script is None and not argument.startswith("-") and local != Path(str(in_pod)) and local.is_file():
            script = local
            local_args.append(str(local))
        else:
            local_args.append(remap(argument, mounts))
    return local_args if script is not None else None


def container_launch(
    pod: JsonDict,
    *,
    role: Role,
    container: JsonDict,
    volumes: PodVolumes,
    local: LocalVolumes,
    settings: LocalSettings,
    ports: AttemptPorts,
) -> ContainerLaunch:
    name = str(container.get("name"))
    trainer = role is Role.MAIN and name == contract.CONTAINER_NAME
    resolved, notes = resolve_env(pod, container, local.lookup)
    mounts, mount_notes = volumes.mounts(container, resolved)
    notes += mount_notes
    tokens = command_tokens(container, resolved)
    described = " ".join(tokens) or "(the image's default command)"
    working_dir = str(container.get("workingDir") or "")
    script = local_script(tokens, working_dir, mounts)
    torchrun = local_torchrun(tokens, working_dir, mounts) if trainer and script is None else None
    home = volumes.pod_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    if script is not None:
        flags, path, arguments = script
        command = [settings.python, *flags, str(path), *(remap(a, mounts) for a in arguments)]
    elif torchrun is not None:
        command = [settings.python, str(LOOPBACK_TORCHRUN), *torchrun]
    elif trainer:
        raise SkipPod(f"command {described!r}: {NOT_RUNNABLE}; it is not a file of the pod's volumes here")
    else:
        image = str(container.get("image") or "")
        waits = role is not Role.INIT
        message = (
            f"local kubelet: {name} ({image}) runs {described!r}, which cannot run on this machine; "
            + ("a stand-in sleeps until the pod is stopped" if waits else "a stand-in completes at once")
        )
        command = [settings.python, "-c", STAND_IN_SLEEP if waits else STAND_IN_DONE, message]
    cwd = Path(remap(working_dir, mounts)) if working_dir else home
    if not cwd.is_dir():
        notes.append(f"workingDir {working_dir} is not in a volume here: the pod's home directory instead")
        cwd = home
    env = local_env(
        resolved,
        mounts,
        home=home,
        port=ports.master,
        api_url=settings.api_url,
        ca_file=settings.ca_file,
        notes=notes,
        trainer=trainer,
        torchrun_port=None if torchrun is None else ports.rendezvous,
    )
    return ContainerLaunch(
        name=name,
        role=role,
        image=str(container.get("image") or ""),
        command=command,
        env=env,
        cwd=cwd,
        notes=notes,
        described=described,
        stand_in=script is None and torchrun is None,
        trainer=trainer,
        fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        torchrun=torchrun is not None,
    )


def prepare(
    pod: JsonDict, volumes: LocalVolumes, settings: LocalSettings, ports: dict[AttemptKey, AttemptPorts]
) -> PodLaunch:
    """Everything the pod's containers need: volumes written, environments resolved and remapped,
    tokens minted. Every rank of one attempt of a job gets the same MASTER_PORT and torchrun rendezvous
    port (free ones, kept in `ports`)."""
    metadata = pod["metadata"]
    uid, namespace, name = str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"])
    job, attempt = job_of(pod), attempt_of(pod)
    if not job:
        raise SkipPod(f"no {contract.JOB_NAME_LABEL} label")
    ordered = containers_in_order(pod)
    trainer = next(
        (c for role, c in ordered if role is Role.MAIN and c.get("name") == contract.CONTAINER_NAME), None
    )
    if trainer is None:
        raise SkipPod(f"no container named {contract.CONTAINER_NAME}")
    tokens = command_tokens(trainer, resolve_env(pod, trainer, volumes.lookup)[0])
    runnable = python_script_args(tokens) is not None or torchrun_args(tokens) is not None
    if not runnable:  # said before any volume is written or token minted
        raise SkipPod(f"command {' '.join(tokens) or '(the image default)'!r}: {NOT_RUNNABLE}")
    pod_volumes = volumes.prepare(pod)
    attempt_ports = ports.setdefault((namespace, job, attempt), AttemptPorts.free())
    containers = [
        container_launch(
            pod,
            role=role,
            container=container,
            volumes=pod_volumes,
            local=volumes,
            settings=settings,
            ports=attempt_ports,
        )
        for role, container in ordered
    ]
    return PodLaunch(
        uid=uid,
        namespace=namespace,
        name=name,
        job=job,
        attempt=attempt,
        port=attempt_ports.master,
        containers=containers,
        tokens=pod_volumes.tokens,
        notes=pod_volumes.notes,
    )
