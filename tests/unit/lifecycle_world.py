"""A fake cluster for stepping a TrainingJob through its life with `controller.planner.plan`.

`World` holds what the controller's caches would: the job (defaulted, with the status the previous plan
wrote), its pods, its other owned objects and the nodes. `step()` calls `plan()` at the world's fixed
clock and applies the plan the way the API server and a fast kubelet would: creates appear (pods as
Pending, unscheduled), deletes remove pods at once, or leave them Terminating when the world is
`graceful` or their node is lost (no kubelet confirms the deletion), and force deletes remove them.
A `tracking` world also keeps the pods' tracking finalizer as the API server does: a deleted pod stays
Terminating, with its last state, until a plan releases it (planner/tracking.py); otherwise releases
only take the finalizer off, as if the next reconcile came at once.
The cluster's side (`FakeCluster`: the API server's rules, and methods that play scheduler and
kubelet: bind, start, exit, disrupt) is apart from the reconciling (`World`), so tests read as a
sequence of cluster events and reconciles.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from builders.names import pod_name
from builders.podgroup import GangScheduler
from controller.planner import Delete, Event, Observed, Plan, Settings, plan, podstate
from controller.planner.model import Guards, Queueing
from controller.runtime.clock import rfc3339
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from tests.unit.crd_cases import job as manifest

JsonDict = dict[str, Any]

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
JOB_UID = "5b0c7f3e-1d2a-4c8b-9e1f-0a1b2c3d4e5f"
NAMESPACE = "ml"
INSUFFICIENT_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def make_job(changes: dict[str, Any] | None = None, *, name: str = "mnist", workers: int = 2) -> JsonDict:
    """A stored, defaulted TrainingJob (2 workers, 1 GPU each) with dotted-path `changes` applied."""
    stored = manifest({"spec.numWorkers": workers, **(changes or {})}, name=name)
    stored["metadata"].update(
        {"namespace": NAMESPACE, "uid": JOB_UID, "generation": 1, "creationTimestamp": rfc3339(T0)}
    )
    return with_defaults(stored)


def make_node(name: str, ready: bool | None = True) -> JsonDict:
    """A Node with a Ready condition: True, False (NotReady) or None (Unknown: kubelet stopped posting)."""
    status = "Unknown" if ready is None else ("True" if ready else "False")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "KubeletReady"}]},
    }


def names(deletes: Iterable[Delete]) -> list[str]:
    return sorted(delete.name for delete in deletes)


def env_of(pod: JsonDict) -> dict[str, str]:
    return {entry["name"]: entry.get("value", "") for entry in pod["spec"]["containers"][0].get("env", [])}


def condition(status: JsonDict, type_: str) -> JsonDict | None:
    for entry in status.get("conditions") or []:
        if entry["type"] == type_:
            return dict(entry)
    return None


@dataclass
class FakeCluster:
    """The API server's and the nodes' side of a World: the job's pods and other objects as stored, the
    nodes, and the scheduler's and kubelets' moves."""

    job: JsonDict
    now: datetime = T0
    pods: dict[str, JsonDict] = field(default_factory=dict)
    owned: dict[tuple[str, str], JsonDict] = field(default_factory=dict)
    nodes: dict[str, JsonDict] = field(default_factory=dict)
    nodes_known: bool = True
    graceful: bool = False
    uid_counter: int = 0
    tracking: bool = False
    # UIDs of terminating pods whose deletion a kubelet (or a force delete) confirmed: gone once no
    # finalizer holds them.
    confirmed: set[str] = field(default_factory=set)

    # ------------------------------------------------------------------------------ the API server

    def default(self, obj: JsonDict) -> None:
        """What the API server adds to a stored object (its schema's defaults); here nothing."""

    def create(self, obj: JsonDict) -> None:
        created = copy.deepcopy(obj)
        self.default(created)
        self.uid_counter += 1
        meta = created["metadata"]
        meta["uid"] = f"uid-{meta['name']}-{self.uid_counter}"
        meta["creationTimestamp"] = rfc3339(self.now)
        meta["resourceVersion"] = str(self.uid_counter)
        if created["kind"] != "Pod":
            assert (created["kind"], meta["name"]) not in self.owned, f"duplicate {meta['name']}"
            self.owned[(created["kind"], meta["name"])] = created
            return
        assert meta["name"] not in self.pods, f"created {meta['name']} while it still exists"
        created["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        self.pods[meta["name"]] = created

    def delete_pod(self, delete: Delete) -> None:
        pod = self.pods.get(delete.name)
        if pod is None or pod["metadata"]["uid"] != delete.uid:
            return  # 404 or a precondition failure: the controller's delete targets a uid
        node = pod["spec"].get("nodeName")
        if not pod["metadata"].get("deletionTimestamp"):
            grace = (
                0 if delete.force or not node else int(pod["spec"].get("terminationGracePeriodSeconds", 30))
            )
            pod["metadata"]["deletionTimestamp"] = rfc3339(self.now + timedelta(seconds=grace))
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
        # Never bound, forced, or on a live node of a world that is not `graceful`: confirmed at once.
        if delete.force or not node or not (self.graceful or self.node_lost(str(node))):
            self.confirm(pod)

    def confirm(self, pod: JsonDict) -> None:
        """The deletion of `pod` is confirmed, as a kubelet (or kwok) confirms it, with a delete of grace
        period 0 once its containers stopped (the API server moves deletionTimestamp to that moment):
        it goes unless a finalizer (in a tracking world) holds it."""
        self.confirmed.add(pod["metadata"]["uid"])
        pod["metadata"]["deletionTimestamp"] = rfc3339(self.now)
        pod["metadata"]["deletionGracePeriodSeconds"] = 0
        self._collect(pod["metadata"]["name"])

    def release(self, name: str, uid: str) -> None:
        """The operator removes the pod's tracking finalizer (if it is still that pod)."""
        pod = self.pods.get(name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        finalizers = pod["metadata"].get("finalizers") or []
        assert contract.TRACKING_FINALIZER in finalizers, f"released {name} twice"
        pod["metadata"]["finalizers"] = [item for item in finalizers if item != contract.TRACKING_FINALIZER]
        self._collect(name)

    def _collect(self, name: str) -> None:
        pod = self.pods[name]
        held = self.tracking and pod["metadata"].get("finalizers")
        if pod["metadata"]["uid"] in self.confirmed and not held:
            del self.pods[name]

    def node_lost(self, name: str) -> bool:
        node = self.nodes.get(name)
        if node is None:
            return True
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        return not ready or ready[0]["status"] != "True"

    def finish_terminating(self) -> None:
        """The kubelets confirm every pending deletion (only on nodes that are still up)."""
        for name in list(self.pods):
            pod = self.pods[name]
            if pod["metadata"].get("deletionTimestamp") and not self.node_lost(
                str(pod["spec"].get("nodeName"))
            ):
                self.confirm(pod)

    # ------------------------------------------------------------------------ pods and nodes

    def pod(self, index: int) -> JsonDict:
        return self.pods[pod_name(parse(self.job), index)]

    def pod_names(self) -> list[str]:
        return sorted(self.pods)

    def live_pods(self) -> list[JsonDict]:
        return [pod for pod in self.pods.values() if not pod["metadata"].get("deletionTimestamp")]

    def indices(self, indices: Sequence[int] | None) -> list[int]:
        """`indices`, else the ranks (slots) of every live pod: the replica index in a job of workers
        only, the slot (crd/replicas.py) of each role's pod in a job with TensorFlow roles."""
        if indices is not None:
            return list(indices)
        replicas = parse(self.job).spec.replicas
        if replicas.has_roles:
            slots = (podstate.slot(pod, replicas) for pod in self.live_pods())
            return sorted(slot for slot in slots if slot is not None)
        return sorted(int(p["metadata"]["labels"][contract.REPLICA_INDEX_LABEL]) for p in self.live_pods())

    def add_node(self, name: str, ready: bool | None = True) -> None:
        self.nodes[name] = make_node(name, ready)

    def set_node_ready(self, name: str, ready: bool | None) -> None:
        self.nodes[name] = make_node(name, ready)

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    def unschedulable(self, *indices: int, message: str = INSUFFICIENT_GPU) -> None:
        for index in self.indices(indices or None):
            status = self.pod(index)["status"]
            status["phase"] = "Pending"
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": rfc3339(self.now),
                }
            ]

    def bind(self, *indices: int) -> None:
        """The scheduler binds the pods (to node-<index>, created Ready if absent)."""
        for index in self.indices(indices or None):
            pod = self.pod(index)
            node = f"node-{index}"
            if node not in self.nodes:
                self.add_node(node)
            pod["spec"]["nodeName"] = node
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(self.now)}
            ]

    def start(self, *indices: int) -> None:
        """The kubelet starts the trainer container (binding the pod first if needed)."""
        for index in self.indices(indices or None):
            pod = self.pod(index)
            if not pod["spec"].get("nodeName"):
                self.bind(index)
            pod["status"].update(
                {
                    "phase": "Running",
                    "startTime": rfc3339(self.now),
                    "containerStatuses": [
                        {
                            "name": contract.CONTAINER_NAME,
                            "ready": True,
                            "restartCount": 0,
                            "started": True,
                            "state": {"running": {"startedAt": rfc3339(self.now)}},
                        }
                    ],
                }
            )
            pod["status"]["conditions"] = [
                *pod["status"]["conditions"],
                {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(self.now)},
            ]

    def exit(
        self,
        index: int,
        code: int,
        reason: str | None = None,
        message: str = "",
        finished_at: datetime | None = None,
    ) -> None:
        """The trainer container of rank `index` terminates with `code`; the pod's phase follows."""
        pod = self.pod(index)
        if pod["status"].get("phase") != "Running":
            self.start(index)
        terminated: JsonDict = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": rfc3339(self.now),
            "finishedAt": rfc3339(finished_at or self.now),
        }
        if message:
            terminated["message"] = message
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"][0].update(
            {"ready": False, "started": False, "state": {"terminated": terminated}}
        )

    def succeed(self, *indices: int) -> None:
        for index in self.indices(indices or None):
            self.exit(index, 0)

    def disrupt(self, index: int, reason: str, *, delete: bool = True, phase: str | None = None) -> None:
        """The scheduler/eviction API/taint manager marks the pod DisruptionTarget and deletes it."""
        pod = self.pod(index)
        pod["status"]["conditions"] = [
            *pod["status"].get("conditions", []),
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": f"{reason}: the pod is being disrupted",
                "lastTransitionTime": rfc3339(self.now),
            },
        ]
        if phase is not None:
            pod["status"]["phase"] = phase
        if delete:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
            pod["metadata"]["deletionTimestamp"] = rfc3339(self.now + timedelta(seconds=grace))
            pod["metadata"]["deletionGracePeriodSeconds"] = grace

    def report(self, index: int = 0, **report: Any) -> None:
        """The trainer patches its progress annotation."""
        annotations = self.pod(index)["metadata"].setdefault("annotations", {})
        annotations[contract.PROGRESS_ANNOTATION] = json.dumps(report)


@dataclass
class World(FakeCluster):
    """A FakeCluster with the operator's planner reconciling its job."""

    settings: Settings = field(default_factory=Settings)
    plans: list[Plan] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    job_deleted: bool = False
    # Kueue as the operator's caches show it (None: its API is not served); tests/unit/kueue_world.py.
    kueue: Queueing | None = None
    # Writes refused because the object changed since the plan read it (resourceVersion preconditions).
    conflicts: int = 0
    # crd/'s admission policies as the operator's watch shows them (tests/unit/test_guards.py).
    guards: Guards = field(default_factory=Guards)
    # The gang scheduler discovery found, and Volcano's Queues by name (tests/unit/test_volcano_planner.py).
    gang_scheduler: GangScheduler | None = None
    volcano_queues: dict[str, JsonDict] | None = None

    # ------------------------------------------------------------------------------ reconciling

    @property
    def status(self) -> JsonDict:
        return dict(self.job.get("status") or {})

    @property
    def state(self) -> str | None:
        state = self.status.get("state")
        return str(state) if state else None

    def condition(self, type_: str) -> JsonDict | None:
        return condition(self.status, type_)

    def observed(self) -> Observed:
        return Observed(
            job=copy.deepcopy(self.job),
            pods=[copy.deepcopy(pod) for pod in self.pods.values()],
            owned=copy.deepcopy(self.owned),
            nodes=copy.deepcopy(self.nodes),
            now=self.now,
            nodes_known=self.nodes_known,
            kueue=copy.deepcopy(self.kueue),
            guards=self.guards,
            gang_scheduler=self.gang_scheduler,
            volcano_queues=copy.deepcopy(self.volcano_queues),
        )

    def plan(self) -> Plan:
        """Plans without applying anything."""
        return plan(self.observed(), self.settings)

    def step(self, seconds: float = 0.0) -> Plan:
        """Advances the clock, plans and applies the plan; returns it."""
        self.advance(seconds)
        result = self.plan()
        self.apply(result)
        return result

    def settle(self, limit: int = 10) -> Plan:
        """Steps at the same instant until a plan writes nothing."""
        for _ in range(limit):
            result = self.step()
            if not (result.creates or result.deletes or result.patches):
                return result
        raise AssertionError("the job never settled")

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def apply(self, result: Plan) -> None:
        self.plans.append(result)
        self.events.extend(result.events)
        before = self.state
        self.job["status"] = copy.deepcopy(result.status)
        if self.state != before and before is not None:
            # Every state transition is announced by an Event that names the new state (a new job's
            # first one, Pending, by the shell's SuccessfulCreate Event for what it then creates).
            assert any(event.message.startswith(f"{self.state}:") for event in result.events), (
                before,
                self.state,
                result.events,
            )
        for release in result.releases:
            self.release(release.name, release.uid)
        for obj in result.creates:
            self.create(obj)
        for patch in result.patches:
            current = self.owned[(patch.kind, patch.name)]
            wanted = patch.body.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                self.conflicts += 1  # 409: the reconcile that follows reads the object again
                continue
            _merge_patch(current, patch.body)
            self.default(current)
            current["metadata"]["resourceVersion"] = f"{current['metadata'].get('resourceVersion')}+"
        for delete in result.deletes:
            if delete.kind == "Pod":
                self.delete_pod(delete)
                continue
            existing = self.owned.get((delete.kind, delete.name))
            if existing is not None and existing["metadata"]["uid"] == delete.uid:
                del self.owned[(delete.kind, delete.name)]
        if result.delete_job:
            self.job_deleted = True

    # ------------------------------------------------------------------------- spec changes

    def update_spec(self, **changes: Any) -> None:
        """Edits spec fields (dotted paths) as a user would: the generation moves."""
        for path, value in changes.items():
            node = self.job["spec"]
            *parents, last = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        self.job = with_defaults(self.job)
        self.job["metadata"]["generation"] = int(self.job["metadata"]["generation"]) + 1

    # --------------------------------------------------------------------------- shortcuts

    def run_to_running(self) -> None:
        """Creates the gang and brings every pod to Running, ending in a settled Running job."""
        self.settle()
        self.start()
        self.settle()
        assert self.state == "Running", self.status


def _merge_patch(into: JsonDict, body: JsonDict) -> None:
    for key, value in body.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_patch(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def world(changes: dict[str, Any] | None = None, *, workers: int = 2, **kwargs: Any) -> World:
    return World(make_job(changes, workers=workers), **kwargs)
