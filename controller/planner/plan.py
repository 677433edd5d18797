"""The planner's entry point: from what the caches show to the status a job should have and the writes
that get the cluster there, with no I/O, so every rule is tested by calling `plan` directly.

Three steps:

1. decide and apply: `decide` (decide.py) names the next decision, a pure transition
   (transitions.py) applies it to the status; steps repeat until a decision that waits on the
   cluster. The supporting objects (ConfigMap, Services, RBAC, claim, PodGroup) are compared with
   the cache on the way (supporting.py; the trainers' RoleBinding only while the admission policy
   that bounds it is installed: guards.py), a queued job's Kueue Workload is kept in step with the
   status the decisions left (workloads.py), and pods stuck on lost nodes are force-deleted.
2. create failures reported by the reconciler come back as data (`Observed.create_failures`): an
   invalid object fails the job (InvalidSpec, through the same Finish as any failure), a blocked one
   shows on the Created condition and the message.
3. the fields derived from the pods (workers, resources, the Scheduled condition: scheduled.py),
   observedGeneration and the time of the next look (timers.py) are computed once, from the final
   status; so are the pods whose end that status accounts for, whose tracking finalizer the
   reconciler then removes (tracking.py).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from builders.meta import selector_labels
from controller.planner import guards, inplace, roles, texts, tracking, volcano
from controller.planner.admission import apply_queueing
from controller.planner.change import Change, Moment, Step, moment
from controller.planner.decide import AnyDecision, Finish, decide
from controller.planner.facts import Facts
from controller.planner.kueue import current_workload
from controller.planner.model import Delete, Event, Observed, Plan, Settings
from controller.planner.multikueue import plan_managed_elsewhere
from controller.planner.queueing import Admit, Dequeue, Enqueue, Evict
from controller.planner.reports import progress
from controller.planner.scheduled import show_scheduled
from controller.planner.supporting import Patch, desired_objects, diff_objects, release_claims
from controller.planner.timers import ceil_to_second, wake_up
from controller.planner.transitions import (
    apply,
    blocked,
    finish_status,
    force_delete_stuck,
    show_blocked,
)
from controller.planner.workloads import workload_writes
from controller.runtime import boundedjson
from controller.runtime.clock import rfc3339
from crd import contract
from crd.contract import FINISHED_STATES, ReplicaType, State
from crd.spec import parse
from crd.spec_fields import SpecError
from crd.validation import validate

JsonDict = dict[str, Any]
# A reconcile takes at most this many decisions (the longest path: Resume, RecordProgress,
# RemoveExtraPods, then CreateRanks; or Accept, Finish, DeleteJob); more would be a loop.
MAX_DECISIONS: Final = 8
# How soon a job looks again for the Workload Kueue made for it (prebuilt) while the cache lacks it.
PREBUILT_WAIT: Final = 1.0


def plan(observed: Observed, settings: Settings | None = None) -> Plan:
    status: JsonDict = copy.deepcopy(observed.job.get("status") or {})
    try:
        job = parse(observed.job)
    except SpecError as error:
        return _unreadable(observed, status, error)
    facts = Facts(job, observed, settings or Settings(), spec_errors(observed.job))
    if job.managed_elsewhere is not None:
        return plan_managed_elsewhere(facts, status)
    result = _Result(status)
    for _ in range(MAX_DECISIONS):
        decision = decide(facts, result.status, result.taken)
        result.add(decision, apply_decision(facts, result.status, decision))
        if not decision.STEP:
            break
    else:
        raise RuntimeError(f"no decision ends the reconcile after {result.taken}")
    creates: list[JsonDict] = []
    patches: list[Patch] = []
    rights = guards.trainer_rights(observed.guards)
    if status.get("state") not in FINISHED_STATES and not facts.spec_errors and not facts.being_deleted:
        desired = desired_objects(job, facts.gang_scheduler, trainer_rights=rights is guards.Rights.GRANT)
        creates, patches = diff_objects(desired, observed.owned)
    patches += release_claims(job, observed.owned)
    result.deletes_also(guards.rights_deletes(observed, rights))
    if not facts.being_deleted:  # the garbage collector deletes the job's Workload with it
        workload = workload_writes(facts, result.status)
        creates += workload.creates
        patches += workload.patches
        result.deletes_also(tuple(workload.deletes))
    result.deletes_also(force_delete_stuck(facts, result.status))
    final = result.status
    refused = facts.failures("blocked")
    if refused and not any(isinstance(step, Finish) for step in result.taken):
        final = show_blocked(moment(facts), final, (failure.message for failure in refused))
    final = show_scheduled(facts, final)
    final, rights_events = guards.show_progress_rights(facts, final)
    final, held_events = guards.show_held(facts, final)
    final, queue_events = volcano.show_queue_hold(facts, final)
    gang = facts.gang(final)
    final = _derived(final, facts)
    events = [*result.events, *rights_events, *held_events, *queue_events]
    if not status.get("state") and job.spec.scheduling.gang_scheduling and observed.gang_scheduler is None:
        events.append(
            Event(
                "Warning",
                "GangSchedulingUnavailable",
                "scheduling.gangScheduling is set but the cluster serves no PodGroup API of a gang scheduler "
                "the operator uses (scheduler-plugins' or Volcano's, as its --gang-scheduler allows); "
                "scheduling pods individually",
            )
        )
    ignored_queue = volcano.queue_ignored(facts, status)
    if ignored_queue is not None:
        events.append(ignored_queue)
    if not status.get("state") and job.spec.scheduling.topology is not None and job.queue_name is None:
        events.append(
            Event(
                "Warning",
                "TopologyIgnored",
                f"spec.scheduling.topology is set but the job has no {contract.QUEUE_NAME_LABEL} label: "
                "topology-aware placement is Kueue's; scheduling pods without it",
            )
        )
    all_creates = [*creates, *result.creates]
    deletes = list(result.deletes.values())
    update, _ = progress(facts, final)
    requeue_after = wake_up(
        facts,
        final,
        gang,
        update.retry_in if update is not None else None,
        inplace.deadlines(facts, final, gang),
    )
    if job.prebuilt_workload and observed.kueue is not None and current_workload(job, observed.owned) is None:
        # Kueue's Workload for the job is not cached yet; nothing that shows it wakes an unowned job.
        requeue_after = min(requeue_after or PREBUILT_WAIT, PREBUILT_WAIT)
    return Plan(
        status=final,
        creates=all_creates,
        patches=patches,
        deletes=deletes,
        events=events,
        requeue_after=requeue_after,
        delete_job=result.delete_job,
        objects_first=blocked(status) and bool(all_creates) and not deletes,
        slow_start=blocked(status),
        releases=tracking.releases(observed.pods, observed.now),
    )


def apply_decision(facts: Facts, status: Mapping[str, Any], decision: AnyDecision) -> Step:
    """The transition of `decision`: the lifecycle's (transitions.py) or the queueing's (admission.py)."""
    if isinstance(decision, Enqueue | Admit | Evict | Dequeue):
        return apply_queueing(facts, status, decision)
    return apply(facts, status, decision)


def spec_errors(job: Mapping[str, Any]) -> tuple[str, ...]:
    """What is wrong with the spec beyond what the API server checks: where the bounded decoder cut it
    (values nested deeper than the operator reads, which it refuses rather than guesses at), then
    crd.validation's findings."""
    cut = [
        f"spec.{path}: nested deeper than {boundedjson.DEFAULT_MAX_DEPTH} levels, "
        "which the operator does not read"
        for path in boundedjson.truncated_paths(job.get("spec") or {})
    ]
    return (*cut, *(str(error) for error in validate(dict(job))))


class _Result:
    """The decisions a reconcile took, and what they add up to."""

    def __init__(self, status: JsonDict) -> None:
        self.status = status
        self.taken: list[AnyDecision] = []
        self.creates: list[JsonDict] = []
        # By pod UID: a pod stopped for one reason is not deleted again for another.
        self.deletes: dict[str, Delete] = {}
        self.events: list[Event] = []
        self.delete_job = False

    def add(self, decision: AnyDecision, step: Step) -> None:
        self.taken.append(decision)
        self.status = step.status
        self.creates.extend(step.creates)
        self.deletes_also(step.deletes)
        self.events.extend(step.events)
        self.delete_job = self.delete_job or step.delete_job

    def deletes_also(self, deletes: tuple[Delete, ...]) -> None:
        for delete in deletes:
            self.deletes.setdefault(delete.uid, delete)


def _derived(status: Mapping[str, Any], facts: Facts) -> JsonDict:
    """The fields that only restate what the pods and the spec say, computed once per reconcile."""
    gang = facts.gang(status)
    derived = dict(status)
    if facts.job.generation is not None:
        derived["observedGeneration"] = facts.job.generation
    derived["workers"] = gang.workers()
    summary = roles.summary(gang)
    if summary is not None:
        derived["roles"] = gang.role_counts()
        derived["roleSummary"] = summary
    derived["resources"] = {"gpus": gang.allocated * facts.spec.gpus_per_worker, "workers": gang.allocated}
    # The scale subresource's view (kubectl scale, a HorizontalPodAutoscaler): the worker pods (what
    # numWorkers counts) and the selector of the job's pods.
    workers = set(facts.spec.replicas.slots(ReplicaType.WORKER))
    derived["replicas"] = sum(1 for slot in gang.ranks if slot in workers)
    derived["selector"] = ",".join(f"{key}={value}" for key, value in selector_labels(facts.job).items())
    if derived.get("startTime"):
        # A job whose first gang started counts attempts and restarts from there.
        derived.setdefault("attempt", 0)
        derived.setdefault("restartCount", 0)
    return derived


def _unreadable(observed: Observed, status: JsonDict, error: SpecError) -> Plan:
    """A spec the operator cannot read at all (a value of the wrong type, stored under an older, looser
    schema): the job fails with InvalidSpec and its pods are left alone (nothing about them can be
    judged without a spec). Once failed, nothing more is done."""
    if status.get("state") in FINISHED_STATES:
        return Plan(status=status, releases=tracking.releases(observed.pods, observed.now))
    generation = observed.job.get("metadata", {}).get("generation")
    now = observed.now
    change = Change(
        Moment(now, rfc3339(ceil_to_second(now)), generation if isinstance(generation, int) else None), status
    )
    finish_status(change, State.FAILED, "InvalidSpec", texts.message(f"invalid spec: {error}"))
    if change.moment.generation is not None:
        change.status["observedGeneration"] = change.moment.generation
    return Plan(
        status=change.status,
        events=list(change.events),
        releases=tracking.releases(observed.pods, observed.now),
    )
