"""`TrainingJobClient`: create, read, wait for, follow and control TrainingJobs from Python.

The ML engineer's entry point, meant for a notebook as much as for a script: submit a job without
YAML, wait for it with a progress bar, read rank 0's log, look at its Events. Every call is one or
two raw-JSON API requests through `controller.runtime.client.KubeClient`; every failure is one of the typed
exceptions of `trainingjob_client.errors`, with a one-line message naming the job.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Unpack, overload

from controller.resources import EVENTS, PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, RealClock
from controller.runtime.errors import KubeError, NotFound
from crd import contract
from trainingjob_client import manifest as manifests
from trainingjob_client import podlogs
from trainingjob_client.connection import connect
from trainingjob_client.errors import JobEnded, JobNotFound, TrainingJobError, WaitTimeout, translate
from trainingjob_client.following import JobWatch, format_seconds, until_gone
from trainingjob_client.manifest import JobFields, JsonDict
from trainingjob_client.progressbar import ProgressBar
from trainingjob_client.views import (
    JobEvent,
    RankStatus,
    TrainingJob,
    events_in_order,
    rank_statuses,
)
from trainingjob_client.waiting import Target

DEFAULT_WAIT_SECONDS = 3600.0


def namespaces_with(kube: KubeClient, name: str, other_than: str) -> tuple[str, ...]:
    """Namespaces holding a job of that name, for a hint; empty when the caller may not list them."""
    try:
        found = kube.list(TRAININGJOBS, None, field_selector=f"metadata.name={name}")
    except KubeError:
        return ()
    namespaces = {str(item["metadata"].get("namespace")) for item in found.get("items") or []}
    return tuple(sorted(namespaces - {other_than}))


class TrainingJobClient:
    """TrainingJobs of one cluster; `namespace` is the default of every call (each takes its own too).

    Credentials come from `kubeconfig` (a path), else $KUBECONFIG, else ~/.kube/config, else the pod's
    service account; `context` picks a kubeconfig context. The default namespace is the context's,
    else the pod's, else "default". `kube` replaces all of that with a ready REST client; `clock`
    measures the timeouts of `wait`, `watch` and `delete(wait=True)`.
    """

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        kube: KubeClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock: Clock = clock or RealClock()
        if kube is None:
            connection = connect(kubeconfig, context, namespace)
            self.kube = connection.kube
            self.namespace = connection.namespace
        else:
            self.kube = kube
            self.namespace = namespace or "default"

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def _error(self, error: KubeError, namespace: str, name: str | None = None) -> TrainingJobError:
        translated = translate(error, namespace=namespace, name=name, host=self.kube.host)
        if isinstance(translated, JobNotFound) and name is not None:
            return JobNotFound(namespace, name, namespaces_with(self.kube, name, namespace))
        return translated

    # --------------------------------------------------------------------------------------- create

    def create(self, manifest: Mapping[str, Any], *, namespace: str | None = None) -> TrainingJob:
        """Creates the TrainingJob in `manifest` (a dict as `kubectl apply` takes it)."""
        job, chosen = manifests.place(manifests.check_manifest(manifest), namespace, self.namespace)
        name = str(job["metadata"].get("name") or job["metadata"].get("generateName"))
        try:
            return TrainingJob.from_dict(self.kube.create(TRAININGJOBS, chosen, job))
        except KubeError as error:
            raise self._error(error, chosen, name) from None

    def create_from_yaml(self, text: str, *, namespace: str | None = None) -> TrainingJob:
        """Creates the one TrainingJob of a YAML (or JSON) text."""
        return self.create(manifests.from_yaml(text), namespace=namespace)

    def create_from_file(self, path: str | os.PathLike[str], *, namespace: str | None = None) -> TrainingJob:
        """Creates the one TrainingJob of a YAML or JSON file."""
        return self.create(manifests.from_file(path), namespace=namespace)

    def submit(self, name: str, *, namespace: str | None = None, **fields: Unpack[JobFields]) -> TrainingJob:
        """Creates a TrainingJob from keyword arguments: `model`, `dataset` and `num_workers`, and
        optionally `gpus_per_worker`, `framework`, `image`, `command`, `args`, `env`, `epochs`,
        `learning_rate`, `batch_size`, `checkpoint`, `suspend`, `ttl_seconds_after_finished`,
        `labels`, and `spec` for any other spec field (see `trainingjob_client.JobFields`)."""
        return self.create(manifests.build_manifest(name, **fields), namespace=namespace)

    # ------------------------------------------------------------------------------- read and change

    def get(self, name: str, *, namespace: str | None = None) -> TrainingJob:
        chosen = self._ns(namespace)
        try:
            return TrainingJob.from_dict(self.kube.get(TRAININGJOBS, chosen, name))
        except KubeError as error:
            raise self._error(error, chosen, name) from None

    def list(self, *, namespace: str | None = None, label_selector: str | None = None) -> list[TrainingJob]:
        """The namespace's TrainingJobs by name; `namespace="*"` lists every namespace."""
        chosen = None if namespace == "*" else self._ns(namespace)
        try:
            answer = self.kube.list(TRAININGJOBS, chosen, label_selector=label_selector)
        except KubeError as error:
            raise self._error(error, chosen or "*") from None
        jobs = [TrainingJob.from_dict(item) for item in answer.get("items") or []]
        return sorted(jobs, key=lambda job: (job.namespace, job.name))

    def delete(
        self, name: str, *, namespace: str | None = None, wait: bool = False, timeout: float = 120.0
    ) -> None:
        """Deletes the job (its pods and other objects go with it); `wait` returns once it is gone."""
        chosen = self._ns(namespace)
        current = self.get(name, namespace=chosen) if wait else None
        try:
            self.kube.delete(TRAININGJOBS, chosen, name, propagation="Foreground" if wait else "Background")
        except KubeError as error:
            raise self._error(error, chosen, name) from None
        if current is not None:
            until_gone(
                JobWatch(self.kube, current.raw, timeout=timeout, until_finished=False, clock=self.clock)
            )

    def suspend(self, name: str, *, namespace: str | None = None) -> TrainingJob:
        """spec.suspend=true: the operator deletes the pods and stops the deadline clock."""
        return self._set_suspend(name, self._ns(namespace), True)

    def resume(self, name: str, *, namespace: str | None = None) -> TrainingJob:
        """spec.suspend=false: the gang starts again from the latest checkpoint."""
        return self._set_suspend(name, self._ns(namespace), False)

    def _set_suspend(self, name: str, namespace: str, suspend: bool) -> TrainingJob:
        try:
            patched = self.kube.patch(TRAININGJOBS, namespace, name, {"spec": {"suspend": suspend}})
        except KubeError as error:
            raise self._error(error, namespace, name) from None
        return TrainingJob.from_dict(patched)

    # ----------------------------------------------------------------------------------- follow

    def watch(
        self,
        name: str,
        *,
        namespace: str | None = None,
        timeout: float | None = None,
        until_finished: bool = True,
    ) -> JobWatch:
        """The job now, then again at every change of its status, through a watch on the API server.

        Ends after the job finished (unless `until_finished=False`) or when `close()`d from another
        thread; raises WaitTimeout after `timeout` seconds and JobDeleted if the job is deleted.
        """
        current = self.get(name, namespace=namespace)
        return JobWatch(
            self.kube, current.raw, timeout=timeout, until_finished=until_finished, clock=self.clock
        )

    def wait(
        self,
        name: str,
        *,
        for_state: str | None = None,
        condition: str | None = None,
        timeout: float | None = DEFAULT_WAIT_SECONDS,
        progress: bool = False,
        namespace: str | None = None,
    ) -> TrainingJob:
        """Waits until the job is in `for_state` or has `condition` (default: state Completed).

        `condition` is a type ("Succeeded") or type=status ("Stalled=False"). Returns the job as it
        was then. Raises JobEnded at once if the job finishes otherwise (Failed while waiting for
        Completed), WaitTimeout after `timeout` seconds (None waits for ever). `progress=True` shows
        a progress bar (a widget in a notebook) driven by the job's status.
        """
        target = Target.of(for_state, condition)
        bar = ProgressBar(name) if progress else None
        watch = self.watch(name, namespace=namespace, timeout=timeout, until_finished=False)
        try:
            for job in watch:
                if bar is not None:
                    bar.update(job)
                if target.reached(job):
                    return job
                ended = target.unreachable(job)
                if ended is not None:
                    raise JobEnded(ended, job)
        except WaitTimeout as error:
            last = error.job
            seen = f"; it is {last.summary()}" if last is not None else ""
            assert timeout is not None
            raise WaitTimeout(
                f"TrainingJob {watch.namespace}/{name} did not reach {target.describe()} within "
                f"{format_seconds(timeout)}{seen}",
                last,
            ) from None
        finally:
            if bar is not None:
                bar.close()
            watch.close()
        raise TrainingJobError(f"watching TrainingJob {watch.namespace}/{name} was stopped")

    # ----------------------------------------------------------------------------- logs and events

    @overload
    def logs(
        self,
        name: str,
        rank: int = 0,
        follow: Literal[False] = False,
        *,
        tail_lines: int | None = None,
        namespace: str | None = None,
    ) -> str: ...

    @overload
    def logs(
        self,
        name: str,
        rank: int = 0,
        *,
        follow: Literal[True],
        tail_lines: int | None = None,
        namespace: str | None = None,
    ) -> Iterator[str]: ...

    def logs(
        self,
        name: str,
        rank: int = 0,
        follow: bool = False,
        *,
        tail_lines: int | None = None,
        namespace: str | None = None,
    ) -> str | Iterator[str]:
        """Rank `rank`'s trainer log through the API server (pods/log), as `kubectl logs` reads it.

        Returns the whole log as a string, or with `follow=True` an iterator over its lines that ends
        when the container does. LogsUnavailable says why a log cannot be read.
        """
        job = self.get(name, namespace=namespace)
        response = podlogs.open_log(self.kube, job, rank, follow=follow, tail_lines=tail_lines)
        description = f"pod {job.namespace}/{job.pod_name(rank)}"
        if follow:
            return podlogs.lines(response, description)
        return podlogs.read_all(response, description)

    def events(self, name: str, *, namespace: str | None = None) -> builtins.list[JobEvent]:
        """The job's Events, oldest first (state changes, pod creations and deletions, restarts)."""
        job = self.get(name, namespace=namespace)
        selector = f"involvedObject.kind={contract.KIND},involvedObject.name={name}"
        try:
            answer = self.kube.list(EVENTS, job.namespace, field_selector=selector)
        except KubeError as error:
            raise self._error(error, job.namespace) from None
        return events_in_order(answer.get("items") or [], job.uid)

    def ranks(self, name: str, *, namespace: str | None = None) -> builtins.list[RankStatus]:
        """Per rank: its pod, node, phase, and exit code or waiting reason (newest attempt)."""
        job = self.get(name, namespace=namespace)
        return rank_statuses(job, self._pods(job))

    def _pods(self, job: TrainingJob) -> builtins.list[JsonDict]:
        selector = f"{contract.JOB_NAME_LABEL}={job.name}"
        try:
            answer = self.kube.list(PODS, job.namespace, label_selector=selector)
        except NotFound:
            return []
        except KubeError as error:
            raise self._error(error, job.namespace) from None
        items: builtins.list[JsonDict] = answer.get("items") or []
        return items
