"""The jobs a soak keeps in flight, and what happens to them every tick.

Every tick (one LIST of jobs and one of pods): finished jobs are deleted; of the running ones, each has
a small chance that rank 1 fails (a gang restart) and a small chance that both ranks succeed (it
completes); then new jobs, under names never used before, fill the namespace back up. Pods end the
way a kubelet reports it (testbed/cluster/podstatus.py).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable
from typing import Final

from controller.resources import PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError
from crd import contract
from testbed.cluster.podstatus import terminated_status_patch
from testbed.common import JsonDict

NAMESPACE: Final = "soak"
FAIL_CHANCE: Final = 0.02
COMPLETE_CHANCE: Final = 0.02


def job_manifest(name: str) -> JsonDict:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": "soak",
            "dataset": "synthetic",
            "numWorkers": 2,
            "gpusPerWorker": 0,
            "failurePolicy": {
                "restartPolicy": "OnFailure",
                "backoffLimit": 100,
                "restartBackoff": {"initialDelaySeconds": 1, "maxDelaySeconds": 2},
            },
        },
    }


class Churn:
    def __init__(self, client: KubeClient, in_flight: int, seed: int) -> None:
        self._client = client
        self._in_flight = in_flight
        self._rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
        self._next = 0
        self.counts: Counter[str] = Counter()

    def tick(self) -> None:
        jobs = self._client.list(TRAININGJOBS, NAMESPACE)["items"]
        pods = self._client.list(PODS, NAMESPACE)["items"]
        running_pods: dict[str, list[JsonDict]] = {}
        for pod in pods:
            job = (pod["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL)
            if (
                job
                and pod.get("status", {}).get("phase") == "Running"
                and not pod["metadata"].get("deletionTimestamp")
            ):
                running_pods.setdefault(job, []).append(pod)
        live = 0
        for job in jobs:
            name, state = job["metadata"]["name"], (job.get("status") or {}).get("state")
            if job["metadata"].get("deletionTimestamp"):
                continue
            if state in ("Completed", "Failed"):
                self._write(functools.partial(self._client.delete, TRAININGJOBS, NAMESPACE, name), "deleted")
                continue
            live += 1
            ranks = running_pods.get(name, [])
            if state != "Running" or len(ranks) < 2:
                continue
            roll = self._rng.random()
            if roll < FAIL_CHANCE:
                self._end(ranks[1], 1, "rank_failures")
            elif roll < FAIL_CHANCE + COMPLETE_CHANCE:
                for pod in ranks:
                    self._end(pod, 0, None)
                self.counts["completions"] += 1
        for _ in range(self._in_flight - live):
            name = f"soak-{self._next:06d}"
            self._next += 1
            create = functools.partial(self._client.create, TRAININGJOBS, NAMESPACE, job_manifest(name))
            self._write(create, "created")

    def _end(self, pod: JsonDict, exit_code: int, counter: str | None) -> None:
        patch = terminated_status_patch(pod, exit_code=exit_code, who="make soak")
        name = pod["metadata"]["name"]
        done = self._write(
            lambda: self._client.patch(
                PODS, NAMESPACE, name, patch, patch_type="strategic", subresource="status"
            ),
            counter,
        )
        if not done:
            self.counts["skipped"] += 1

    def _write(self, call: Callable[[], object], counter: str | None) -> bool:
        try:
            call()
        except KubeError:
            self.counts["write_errors"] += 1
            return False
        if counter:
            self.counts[counter] += 1
        return True
