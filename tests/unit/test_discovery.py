"""controller.resources: which optional APIs (a gang scheduler's PodGroups, Kueue) the cluster serves,
from the API server's discovery answers; a request that got no answer changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.resources import KUEUE, POD_GROUPS, Apis, discover, follow_answers
from controller.runtime.client import KubeClient
from tests.unit.fakeapi import FakeApi, Reply, running, status

COSCHEDULING = f"/apis/{POD_GROUPS['coscheduling'].api_version}"
VOLCANO = f"/apis/{POD_GROUPS['volcano'].api_version}"
KUEUE_API = f"/apis/{KUEUE[0].api_version}"


def listing(*plurals: str) -> Reply:
    return Reply(body={"kind": "APIResourceList", "resources": [{"name": name} for name in plurals]})


def refused() -> Reply:
    return Reply(403, status(403, "Forbidden"))


def missing() -> Reply:
    return Reply(404, status(404, "NotFound"))


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


def client(api: FakeApi) -> KubeClient:
    return KubeClient(api.api_client(), qps=0, burst=0, max_attempts=1, backoff_initial=0.01)


@pytest.mark.parametrize(
    ("known", "pod_groups", "kueue_answer", "found"),
    [
        (Apis(), {"coscheduling": False, "volcano": False}, False, Apis()),
        (Apis(), {"coscheduling": True, "volcano": True}, True, Apis("coscheduling", kueue=True)),
        (Apis(), {"coscheduling": False, "volcano": True}, False, Apis("volcano")),
        # Installed, then removed.
        (Apis("coscheduling", kueue=True), {"coscheduling": False, "volcano": False}, False, Apis()),
        # No answer: the last known state stands.
        (
            Apis("coscheduling", kueue=True),
            {"coscheduling": None, "volcano": False},
            None,
            Apis("coscheduling", True),
        ),
        (Apis(), {"coscheduling": True, "volcano": None}, None, Apis()),
    ],
)
def test_the_apis_follow_the_answers_and_keep_what_got_no_answer(
    known: Apis, pod_groups: dict[Any, bool | None], kueue_answer: bool | None, found: Apis
) -> None:
    assert follow_answers(known, pod_groups, kueue_answer) == found


def test_discovery_reads_the_group_versions_and_needs_every_kueue_resource(api: FakeApi) -> None:
    api.script("GET", COSCHEDULING, listing("podgroups", "elasticquotas"))
    api.script("GET", VOLCANO, missing())
    # Kueue's CRDs half installed: no WorkloadPriorityClasses yet.
    api.script("GET", KUEUE_API, listing("workloads", "resourceflavors", "clusterqueues"))
    assert discover(client(api)) == Apis("coscheduling", kueue=False)

    api.script("GET", COSCHEDULING, missing())
    api.script("GET", VOLCANO, missing())
    api.script("GET", KUEUE_API, listing("workloads", "resourceflavors", "workloadpriorityclasses"))
    assert discover(client(api), Apis("coscheduling")) == Apis(None, kueue=True)


def test_a_discovery_request_refused_changes_nothing(api: FakeApi) -> None:
    for path in (COSCHEDULING, VOLCANO, KUEUE_API):
        api.script("GET", path, refused())
    known = Apis("volcano", kueue=True)
    assert discover(client(api), known) == known
