"""What the operator watches of the admission policies its guarantees rest on, and what it tells of them.

Why: the rights the operator hands out are safe only while crd/'s admission policies bound them (the
trainers' ClusterRole lets them patch any pod of their namespace; `trainingjob-trainer-progress`
narrows that to their own pod's progress annotation). A check at start-up does not see a policy
deleted later, so the operator watches each policy and its binding (controller/resources.py,
GUARD_POLICIES) for as long as it runs, each by name: a list or watch with a field selector on
metadata.name is authorized as a request for that name, so the deployed RBAC grants exactly these
objects (get, list, watch with resourceNames).

Their informers are required: the operator starts work only once it knows whether each is installed.
`snapshot()` is what a reconcile hands the planner (`planner.Guards`), which decides what to withhold
(planner/guards.py: the trainers' RoleBindings without `trainingjob-trainer-progress`, the pods of a
job asking for more than a tenant's ordinary rights without `trainingjob-escalation`); this module
only observes and says so: one log line when a policy goes missing (or is missing at start-up), one
when it is back, and every job woken to act on it.

A policy counts as installed when the ValidatingAdmissionPolicy exists and so does its binding, naming
it, with the Deny action (a binding that only warns or audits protects nothing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Final

from controller.planner.model import Guards
from controller.resources import ADMISSION_POLICIES, ADMISSION_POLICY_BINDINGS, GUARD_POLICIES, name_selector
from controller.runtime.informer import Informer
from controller.watches import Watches
from crd import contract

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
APPLY_CRD: Final = "apply crd/ (kubectl apply --server-side -k crd/), which make deploy and the Helm chart do"
# What each policy's absence withholds (planner/guards.py), and what comes back with it, as the log says.
WITHHELD: Final = {
    contract.TRAINER_POLICY: "trainers get no right to patch pods",
    contract.ESCALATION_POLICY: (
        "no pod is created for a job that asks for more than the baseline Pod Security Standard or for "
        "another ServiceAccount"
    ),
}
RESTORED: Final = {
    contract.TRAINER_POLICY: "trainers get their rights back",
    contract.ESCALATION_POLICY: "the jobs it held back are started",
}


def essentials(obj: JsonDict) -> JsonDict:
    """All the operator keeps of a policy or its binding: its name, whether it is being deleted, and of
    a binding the policy it names and its actions."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    kept: JsonDict = {key: spec[key] for key in ("policyName", "validationActions") if key in spec}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            key: meta[key] for key in ("name", "resourceVersion", "deletionTimestamp") if key in meta
        },
        "spec": kept,
    }


def what_is_missing(
    name: str, policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None
) -> str | None:
    """What of the policy `name` is not installed, as a sentence's subject; None when it all is."""
    if policy is None or policy.get("metadata", {}).get("deletionTimestamp"):
        return f"{ADMISSION_POLICIES.kind} {name} is not installed"
    if binding is None or binding.get("metadata", {}).get("deletionTimestamp"):
        return f"{ADMISSION_POLICY_BINDINGS.kind} {name} is not installed"
    spec = binding.get("spec") or {}
    if spec.get("policyName") != name:
        bound = spec.get("policyName") or "no policy"
        return f"{ADMISSION_POLICY_BINDINGS.kind} {name} binds {bound}, not {name}"
    if "Deny" not in (spec.get("validationActions") or []):
        return f"{ADMISSION_POLICY_BINDINGS.kind} {name} does not deny (validationActions has no Deny)"
    return None


class GuardsWatch:
    """The informers of the guard policies and their bindings, built without I/O (Watches starts them)."""

    def __init__(self, watches: Watches, policies: tuple[str, ...] = GUARD_POLICIES) -> None:
        self._watches = watches
        self._lock = threading.Lock()
        self._told: dict[str, str] | None = None  # what the log said last: policy -> what is missing
        self._informers: dict[str, tuple[Informer, Informer]] = {
            name: (
                self._follow(watches, ADMISSION_POLICIES, name),
                self._follow(watches, ADMISSION_POLICY_BINDINGS, name),
            )
            for name in policies
        }

    def _follow(self, watches: Watches, resource: Any, name: str) -> Informer:
        informer = watches.informer(
            resource,
            label_selector=None,
            field_selector=name_selector(name),
            cluster=True,
            transform=essentials,
        )
        informer.add_handler(
            on_add=lambda _obj: self.report(),
            on_update=lambda _old, _new: self.report(),
            on_delete=lambda _obj: self.report(),
        )
        return informer

    @property
    def informers(self) -> list[Informer]:
        return [informer for pair in self._informers.values() for informer in pair]

    def snapshot(self) -> Guards:
        """What the caches show now; unknown until every informer has synced."""
        if not all(informer.has_synced() for informer in self.informers):
            return Guards(known=False)
        missing = {}
        for name, (policies, bindings) in self._informers.items():
            gap = what_is_missing(name, policies.store.get(name), bindings.store.get(name))
            if gap is not None:
                missing[name] = gap
        return Guards(missing)

    def report(self) -> None:
        """Says what changed since the last report (every missing policy, the first time) in one line per
        policy, and wakes every job when anything did. Called by the informers' handlers and once by the
        manager when the caches have synced (a policy missing at start-up brings no event)."""
        guards = self.snapshot()
        if not guards.known:
            return
        with self._lock:
            before = self._told
            self._told = dict(guards.missing)
        for name, gap in guards.missing.items():
            if before is None or before.get(name) != gap:
                logger.warning(
                    "%s: %s until it is installed; %s",
                    gap,
                    WITHHELD.get(name, "what it guards is withheld"),
                    APPLY_CRD,
                    extra={"action": "guard-missing", "policy": name},
                )
        for name in (before or {}).keys() - guards.missing.keys():
            logger.info(
                "the admission policy %s is installed again: %s",
                name,
                RESTORED.get(name, "what it guards is back"),
                extra={"action": "guard-installed", "policy": name},
            )
        if before is not None and before != guards.missing:
            self._watches.wake_jobs(lambda _job: True)
