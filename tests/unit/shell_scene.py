"""The reconciler in process, in the style of Kubernetes' sample-controller tests: caches preloaded by
hand, the real REST client talking to the scripted fake API server (tests/unit/fakeapi.py), one
`reconcile(key)` at a time, and the ordered requests it made read back as actions.

The informer's part is played explicitly: `deliver_status()` puts the status the reconciler wrote
into the cached job and tells the status-write tracker it was seen, as the job informer's handler
does.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry

from controller.manager import Manager, Options
from controller.metrics import Metrics
from controller.planner import Settings
from controller.planner.model import Guards
from controller.planner.supporting import desired_objects
from controller.reconciler import Reconciler, Result
from controller.resources import OWNED
from controller.runtime import mergepatch
from controller.runtime.client import KubeClient
from controller.runtime.clock import FakeClock
from controller.runtime.events import EventRecorder
from controller.runtime.expectations import Expectations
from controller.runtime.store import Store, object_key
from controller.runtime.trackers import StatusWrites
from controller.watches import STANDARD_INDEXERS, Caches
from crd import contract
from crd.spec import parse
from tests.unit.fakeapi import FakeApi, Recorded, Reply
from tests.unit.lifecycle_world import NAMESPACE, T0

JsonDict = dict[str, Any]
P = ParamSpec("P")
R = TypeVar("R")

JOB_PATH = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


class InlineExecutor(Executor):
    """Runs each submitted call at once, so the order of the requests is the order of the plan."""

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        future: Future[R] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


class EventsSeen:
    """An EventSink keeping the Events the recorder writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[JsonDict] = []

    def create(self, res: Any, ns: str | None, body: JsonDict) -> JsonDict:
        with self.lock:
            self.bodies.append(body)
        return body

    def patch(self, res: Any, ns: str | None, name: str, body: JsonDict, **_: Any) -> JsonDict:
        with self.lock:
            self.bodies.append(body)
        return {"metadata": {"name": name}}


def stored(obj: JsonDict, number: int) -> JsonDict:
    """`obj` as the API server would return it: with a uid and a resourceVersion."""
    copied = copy.deepcopy(obj)
    copied["metadata"].setdefault("uid", f"uid-{copied['metadata']['name']}-{number}")
    copied["metadata"].setdefault("resourceVersion", str(number))
    return copied


class Scene:
    def __init__(
        self, api: FakeApi, job: JsonDict, *, executor: Executor | None = None, pool_size: int = 16
    ) -> None:
        self.api = api
        self.clock = FakeClock(T0)
        self.client = KubeClient(api.api_client(), qps=0, burst=0, clock=self.clock, max_attempts=1)
        self.caches = Caches(
            jobs=Store(STANDARD_INDEXERS),
            pods=Store(STANDARD_INDEXERS),
            owned={resource.kind: Store(STANDARD_INDEXERS) for resource in OWNED},
            nodes=None,
            nodes_synced=lambda: False,
        )
        self.expectations = Expectations(self.clock)
        self.status_writes = StatusWrites(self.clock)
        self.sink = EventsSeen()
        self.events = EventRecorder(self.sink, contract.OPERATOR_NAME, clock=self.clock)
        self.metrics = Metrics(CollectorRegistry(), process_metrics=False)
        self.reconciler = Reconciler(
            self.client,
            self.caches,
            expectations=self.expectations,
            status_writes=self.status_writes,
            events=self.events,
            metrics=self.metrics,
            clock=self.clock,
            executor=executor or InlineExecutor(),
            executor_size=pool_size,
            settings=Settings(),
        )
        # crd/'s admission policies as the manager's watch would show them: all installed.
        self.reconciler.guards = Guards
        self.job = stored(job, 1)
        self.caches.jobs.add(self.job)
        self.key = object_key(self.job)
        self.status_path = f"{JOB_PATH}/{self.job['metadata']['name']}/status"
        self._seen = 0
        self._version = 100
        api.default("PATCH", self.status_path, Reply(200, {"metadata": {"resourceVersion": "100"}}))

    # ------------------------------------------------------------------------------- the cluster

    def with_supporting_objects(self) -> Scene:
        """The namespace's trainer ConfigMap and RBAC, and the job's Services, exist (only its pods are
        left to create)."""
        for number, obj in enumerate(desired_objects(parse(self.job), None), start=10):
            self.caches.owned[obj["kind"]].add(stored(obj, number))
        return self

    def answer(self, method: str, path: str, *replies: Reply) -> None:
        self.api.script(method, path, *replies)

    def always(self, method: str, path: str, reply: Reply) -> None:
        self.api.default(method, path, reply)

    # ---------------------------------------------------------------------------------- running

    def reconcile(self) -> tuple[Result, list[tuple[str, str]]]:
        """One reconcile; its result and the write requests it made, in order."""
        result = self.reconciler.reconcile(self.key)
        return result, [(request.method, request.path) for request in self.new_writes()]

    def new_writes(self) -> list[Recorded]:
        writes = [request for request in self.api.requests() if request.method in WRITES]
        fresh, self._seen = writes[self._seen :], len(writes)
        return fresh

    def status_patches(self) -> list[JsonDict]:
        """The status merge patches written so far, in order (a PATCH that only confirms the job's
        resourceVersion patches nothing)."""
        return [request.json().get("status", {}) for request in self.api.requests("PATCH", self.status_path)]

    def deliver_status(self) -> None:
        """The job informer delivers the job with every status patch written so far applied."""
        status: JsonDict = {}
        for patch in self.status_patches():
            status = mergepatch.apply(status, patch)
        self._version += 1
        self.job = {**self.job, "status": status}
        self.job["metadata"] = {**self.job["metadata"], "resourceVersion": str(self._version)}
        self.caches.jobs.add(self.job)
        self.status_writes.observed(self.key, "100")

    def status(self) -> JsonDict:
        status: JsonDict = {}
        for patch in self.status_patches():
            status = mergepatch.apply(status, patch)
        return status

    def recorded_events(self) -> list[JsonDict]:
        assert self.events.flush(10)
        with self.sink.lock:
            return list(self.sink.bodies)


def manager_for(api: FakeApi) -> Manager:
    """The operator's whole in-process wiring against `api`, leader election off; nothing runs yet."""
    client = KubeClient(api.api_client(), qps=0, burst=0, max_attempts=1)
    return Manager(
        client,
        client,
        Options(
            metrics_bind_address="127.0.0.1:0", health_probe_bind_address="127.0.0.1:0", leader_elect=False
        ),
        Metrics(CollectorRegistry(), process_metrics=False),
    )


def paths(actions: Iterable[tuple[str, str]]) -> list[str]:
    return [f"{method} {path}" for method, path in actions]


def body_of(request: Recorded) -> JsonDict:
    decoded: JsonDict = json.loads(request.body)
    return decoded
