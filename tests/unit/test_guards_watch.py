"""The watch of crd/'s admission policies (controller/guards_watch.py): what counts as installed, what a
reconcile is handed, and what the operator says about it: for each policy, one log line when it goes
missing (or is missing at start-up) and one when it is back, every job woken on a change, nothing while
the watches have not synced. Its informers ask for each object by name (a field selector), the request
RBAC grants by resourceNames.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.guards_watch import GuardsWatch, essentials, what_is_missing
from controller.planner.model import Guards
from controller.resources import ADMISSION_POLICIES, ADMISSION_POLICY_BINDINGS
from controller.runtime.informer import Informer
from crd import contract
from tests.unit import informer_support
from tests.unit.fakeapi import FakeApi
from tests.unit.shell_scene import manager_for

api = informer_support.api

NAME = contract.TRAINER_POLICY
ESCALATION = contract.ESCALATION_POLICY


def policy(name: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "resourceVersion": "1", "uid": "u1", "managedFields": [{}]},
        "spec": {"failurePolicy": "Fail", "validations": [{"expression": "true"}]},
    }


def binding(name: str = NAME, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "resourceVersion": "2"},
        "spec": {"policyName": name, "validationActions": ["Deny"], **spec},
    }


@pytest.mark.parametrize(
    ("found_policy", "found_binding", "missing"),
    [
        (policy(), binding(), None),
        (None, binding(), f"ValidatingAdmissionPolicy {NAME} is not installed"),
        (policy(), None, f"ValidatingAdmissionPolicyBinding {NAME} is not installed"),
        (None, None, f"ValidatingAdmissionPolicy {NAME} is not installed"),
        (
            policy(),
            binding(policyName="other"),
            f"ValidatingAdmissionPolicyBinding {NAME} binds other, not {NAME}",
        ),
        (
            policy(),
            binding(validationActions=["Warn", "Audit"]),
            f"ValidatingAdmissionPolicyBinding {NAME} does not deny (validationActions has no Deny)",
        ),
        (policy(), binding(validationActions=["Deny", "Audit"]), None),
        (
            {**policy(), "metadata": {"name": NAME, "deletionTimestamp": "2026-01-01T00:00:00Z"}},
            binding(),
            f"ValidatingAdmissionPolicy {NAME} is not installed",
        ),
    ],
)
def test_what_counts_as_installed(
    found_policy: dict[str, Any] | None, found_binding: dict[str, Any] | None, missing: str | None
) -> None:
    kept_policy = essentials(found_policy) if found_policy else None
    kept_binding = essentials(found_binding) if found_binding else None
    assert what_is_missing(NAME, kept_policy, kept_binding) == missing


def test_only_the_name_the_actions_and_the_policy_named_are_kept() -> None:
    assert essentials(binding()) == {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "resourceVersion": "2"},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]},
    }
    assert essentials(policy())["spec"] == {}


class Scene:
    """The manager's GuardsWatch with its informers' caches filled by hand (nothing runs)."""

    def __init__(self, api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
        self.manager = manager_for(api)
        self.guards: GuardsWatch = self.manager.guards
        self.synced = False
        for informer in self.guards.informers:
            monkeypatch.setattr(informer, "has_synced", lambda: self.synced)

    def informer(self, kind: str, name: str) -> Informer:
        (found,) = [
            informer
            for informer in self.guards.informers
            if informer.resource.kind == kind and informer.name.endswith(f"(metadata.name={name})")
        ]
        return found

    def install(self, name: str) -> None:
        self.informer(ADMISSION_POLICIES.kind, name).store.add(essentials(policy(name)))
        self.informer(ADMISSION_POLICY_BINDINGS.kind, name).store.add(essentials(binding(name)))

    def delete_binding(self, name: str) -> None:
        self.informer(ADMISSION_POLICY_BINDINGS.kind, name).store.delete(essentials(binding(name)))


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_each_object_is_watched_by_name_cluster_wide_and_the_operator_waits_for_it(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene = Scene(api, monkeypatch)
    assert sorted(informer.name for informer in scene.guards.informers) == sorted(
        f"{resource} (metadata.name={name})"
        for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
        for name in (NAME, ESCALATION)
    )
    required = {
        informer.name for informer in scene.manager.watches.informers
    } - scene.manager.watches.optional
    assert {informer.name for informer in scene.guards.informers} <= required
    assert scene.manager.reconciler.guards() == Guards(known=False)


def test_missing_at_start_up_is_said_once_and_a_change_wakes_every_job(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scene = Scene(api, monkeypatch)
    queue = scene.manager.queue
    scene.manager.watches.caches.jobs.add(
        {
            "apiVersion": "ml.example.com/v1",
            "kind": "TrainingJob",
            "metadata": {"name": "a", "namespace": "ml"},
        }
    )
    caplog.set_level(logging.INFO, logger="controller.guards_watch")
    scene.install(ESCALATION)

    scene.guards.report()  # not synced: nothing known, nothing said
    assert caplog.records == []
    scene.synced = True
    scene.guards.report()  # the manager's call once the caches synced
    assert messages(caplog) == [
        f"ValidatingAdmissionPolicy {NAME} is not installed: trainers get no right to patch pods until "
        "it is installed; apply crd/ (kubectl apply --server-side -k crd/), which make deploy and the "
        "Helm chart do"
    ]
    assert caplog.records[0].levelname == "WARNING"
    assert queue.len() == 0, "at start-up every job is reconciled anyway"
    scene.guards.report()
    assert len(caplog.records) == 1, "said once"

    caplog.clear()
    scene.install(NAME)
    scene.guards.report()
    assert messages(caplog) == [
        f"the admission policy {NAME} is installed again: trainers get their rights back"
    ]
    assert scene.manager.reconciler.guards() == Guards()
    assert queue.len() == 1, "every job acts on it"

    caplog.clear()
    scene.delete_binding(ESCALATION)
    scene.guards.report()
    assert messages(caplog) == [
        f"ValidatingAdmissionPolicyBinding {ESCALATION} is not installed: no pod is created for a job that "
        "asks for more than the baseline Pod Security Standard or for another ServiceAccount until it is "
        "installed; apply crd/ (kubectl apply --server-side -k crd/), which make deploy and the Helm chart do"
    ]
    assert scene.manager.reconciler.guards() == Guards(
        {ESCALATION: f"ValidatingAdmissionPolicyBinding {ESCALATION} is not installed"}
    )
    caplog.clear()
    scene.install(ESCALATION)
    scene.guards.report()
    assert messages(caplog) == [
        f"the admission policy {ESCALATION} is installed again: the jobs it held back are started"
    ]
