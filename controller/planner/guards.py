"""The rights the operator hands out only while the admission policies that bound them are installed.

Why: the trainers' ClusterRole (crd/trainer-clusterrole.yaml) lets them patch any pod of their
namespace; only the ValidatingAdmissionPolicy `trainingjob-trainer-progress` and its binding narrow
that to the progress annotation of the trainer's own pod. Checked once at start-up, a policy deleted
later left every trainer that right for good. So the operator follows the policy (its watch,
controller/guards_watch.py, puts what it sees into `Observed.guards`) and fails closed:

- `trainer_rights`: GRANT while the policy and its binding are installed; REVOKE while either is
  missing; WITHHOLD while the operator cannot tell yet (nothing new is granted, nothing taken back).
- `rights_deletes`: the namespace's trainer RoleBinding is deleted under REVOKE (`desired_objects`
  leaves it out under REVOKE and WITHHOLD, so none is created), and replaced when it binds anything but
  the shipped ClusterRole (a RoleBinding of an earlier version bound a Role; roleRef cannot change, so
  it is deleted and the next reconcile creates the new one).
- `show_progress_rights`: the ProgressReporting condition of a job whose trainers run under the
  namespace's account says False (AdmissionPolicyMissing) with an Event while the right is taken back,
  and True (AdmissionPolicyInstalled) with an Event once it is back. A job that never lost the right
  carries no such condition. Stall detection waits while it is False (decide.py, timers.py).

Every job of a namespace sees its shared RoleBinding, so whichever reconciles first deletes it; the
others find it gone (a UID precondition) and write nothing: no write loop while the policy is missing.

The tenant-escalation policy `trainingjob-escalation` judges, at admission, what a job asks its pods to
do against its creator's rights. A job carrying such settings (crd/escalation.py's findings) that was
admitted while the policy was missing was never judged, so while it is missing no pod of such a job is
created (`Facts.held_back`; decide.py waits instead of creating ranks), and `show_held` says why: the
Created condition False with reason AdmissionPolicyMissing and a Warning Event. Pods that run already
are left alone; an ordinary job is not concerned.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Final

from builders.shared import is_shared
from controller.planner import conditions as cond
from controller.planner.change import Change, moment
from controller.planner.facts import Facts, state_of
from controller.planner.model import Delete, Event, Guards, Observed
from crd.contract import FINISHED_STATES, TRAINER_ACCOUNT, TRAINER_CLUSTER_ROLE, TRAINER_POLICY, Condition

JsonDict = dict[str, Any]

TRAINER_ROLE_REF: Final = {
    "apiGroup": "rbac.authorization.k8s.io",
    "kind": "ClusterRole",
    "name": TRAINER_CLUSTER_ROLE,
}
APPLY_CRD: Final = "kubectl apply --server-side -k crd/"


class Rights(Enum):
    GRANT = "grant"
    WITHHOLD = "withhold"
    REVOKE = "revoke"


def trainer_rights(guards: Guards) -> Rights:
    """Whether the namespace's trainer account gets its RoleBinding."""
    if not guards.known:
        return Rights.WITHHOLD
    return Rights.REVOKE if TRAINER_POLICY in guards.missing else Rights.GRANT


def rights_deletes(observed: Observed, rights: Rights) -> tuple[Delete, ...]:
    """The namespace's trainer RoleBinding, when it must go: taken back, or of an earlier version."""
    binding = observed.owned.get(("RoleBinding", TRAINER_ACCOUNT))
    if binding is None or not is_shared(binding) or binding["metadata"].get("deletionTimestamp"):
        return ()
    uid = str(binding["metadata"].get("uid", ""))
    if rights is Rights.REVOKE:
        why = f"{observed.guards.missing[TRAINER_POLICY]}: the trainers' right to patch pods is taken back"
        return (Delete("RoleBinding", TRAINER_ACCOUNT, uid, why),)
    if binding.get("roleRef") != TRAINER_ROLE_REF:
        why = f"it binds {_role_ref(binding)}, replaced by one of ClusterRole {TRAINER_CLUSTER_ROLE}"
        return (Delete("RoleBinding", TRAINER_ACCOUNT, uid, why),)
    return ()


def _role_ref(binding: Mapping[str, Any]) -> str:
    ref = binding.get("roleRef") or {}
    return f"{ref.get('kind', '?')} {ref.get('name', '?')}"


def show_progress_rights(facts: Facts, status: Mapping[str, Any]) -> tuple[JsonDict, tuple[Event, ...]]:
    """`status` with the ProgressReporting condition as the trainers' right stands, and its Events."""
    state = state_of(status)
    if facts.spec.service_account_name or state is None or state in FINISHED_STATES:
        return dict(status), ()
    guards = facts.observed.guards
    current = cond.get(status.get("conditions"), Condition.PROGRESS_REPORTING)
    change = Change(moment(facts), status)
    rights = trainer_rights(guards)
    if rights is Rights.REVOKE:
        missing = guards.missing[TRAINER_POLICY]
        message = (
            f"{missing}: the trainers may not report progress (their RoleBinding {TRAINER_ACCOUNT} is "
            f"removed) until it is installed ({APPLY_CRD})"
        )
        if current is None or current.get("status") != "False":
            change.note("Warning", "AdmissionPolicyMissing", message)
        change.set(Condition.PROGRESS_REPORTING, False, "AdmissionPolicyMissing", message)
    elif rights is Rights.GRANT and current is not None and current.get("status") != "True":
        message = f"the admission policy {TRAINER_POLICY} is installed: the trainers may report progress"
        change.note("Normal", "AdmissionPolicyInstalled", message)
        change.set(Condition.PROGRESS_REPORTING, True, "AdmissionPolicyInstalled", message)
    return change.status, tuple(change.events)


def show_held(facts: Facts, status: Mapping[str, Any]) -> tuple[JsonDict, tuple[Event, ...]]:
    """`status` saying why the job's missing pods are not created while it is held back, and its Event."""
    state = state_of(status)
    held = facts.held_back
    if held is None or state is None or state in FINISHED_STATES or not facts.gang(status).to_create(status):
        return dict(status), ()
    current = cond.get(status.get("conditions"), Condition.CREATED)
    change = Change(moment(facts), status)
    if current is None or current.get("reason") != "AdmissionPolicyMissing":
        change.note("Warning", "AdmissionPolicyMissing", held)
    change.set(Condition.CREATED, False, "AdmissionPolicyMissing", held)
    return change.status, tuple(change.events)
