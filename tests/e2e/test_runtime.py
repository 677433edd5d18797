"""The operator's runtime against the real local control plane: leader election, crashes, API outages.

Each test runs the real operator (`python -m controller`) as a process scoped to the test's namespace
and checks what a cluster administrator would: who holds the Lease and who reconciles, how long a
standby takes to step in after the leader is killed or shut down, that nothing is missed or duplicated
when watches break, expire (410 Gone) or the process dies mid-reconcile, that failing jobs are retried
with backoff without stopping the others, and that /healthz, /readyz and the JSON logs say what is
going on.

Timing bounds are the ones the design promises, written out from the flags the test passes plus a
stated allowance for process scheduling and API latency on a busy two-core machine. Everything else
waits for a condition with a deadline (`tests.cluster.wait_for`), never a fixed sleep.

Leader election is tested here; API outages, crashes, faults and the process basics in
tests/e2e/test_runtime_faults_e2e.py, with what both share in tests/e2e/runtime_support.py. The API
server restarts and outages there briefly affect anyone else using the shared dev cluster; there are
two per run of that file (one `restart`, one `stop`/`start`).
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Callable

import pytest

from testbed import Kubectl, wait_for
from tests.e2e import runtime_support
from tests.e2e.conftest import StartOperator
from tests.e2e.runtime_support import (
    ALLOWANCE,
    GRACE_PERIOD,
    JITTERED_RETRY,
    LEASE_DURATION,
    RETRY_PERIOD,
    LogEntry,
    create_jobs,
    elector_pair,
    find_log,
    identity_of,
    job_events,
    lease_spec,
    log_time,
    managed_pods,
    message_has,
    reconcile_lines,
    training_job,
    wait_log,
    wait_running,
    writes_made,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
operator_kubeconfig = runtime_support.operator_kubeconfig
lease_namespace = runtime_support.lease_namespace


# -------------------------------------------------------------------------------- leader election


def test_only_the_leader_reconciles(kubectl: Kubectl, namespace: str, start_operator: StartOperator) -> None:
    first, second = elector_pair(start_operator)
    assert first.metric("leader_election_master_status") == 1.0
    assert second.metric("leader_election_master_status") == 0.0

    create_jobs(kubectl, namespace, training_job("alpha"), training_job("beta", workers=3))
    wait_running(kubectl, namespace, "alpha", "beta")
    # The leader writes its last events off the reconcile path: wait for them before counting.
    wait_for(
        "the Running events",
        lambda: all(
            any(e["reason"] == "Running" for e in job_events(kubectl, namespace, name))
            for name in ("alpha", "beta")
        ),
    )

    assert [first.is_leader(), second.is_leader()] == [True, False]
    assert {line["name"] for line in reconcile_lines(first)} >= {"alpha", "beta"}
    assert reconcile_lines(second) == []
    assert find_log(second, message_has("became the leader")) is None
    # The standby only read: no create, update, patch or delete, not even of the lease.
    assert writes_made(second) == 0

    # Every object was created once, by the leader.
    created = collections.Counter(
        (line["name"], obj)
        for line in first.logs()
        if line.get("action") == "create"
        for obj in line["objects"]
    )
    assert all(count == 1 for count in created.values()), created
    pods = {(name, obj) for name, obj in created if obj.startswith("Pod/")}
    assert pods == {("alpha", f"Pod/alpha-worker-{i}") for i in range(2)} | {
        ("beta", f"Pod/beta-worker-{i}") for i in range(3)
    }
    assert len(managed_pods(kubectl, namespace)) == 5

    # One Event per happening, each seen once: a second reconciler would have doubled them.
    for name in ("alpha", "beta"):
        events = job_events(kubectl, namespace, name)
        keys = collections.Counter((e["reason"], e["message"]) for e in events)
        assert all(count == 1 for count in keys.values()), keys
        assert all(e.get("count", 1) == 1 for e in events), [(e["reason"], e.get("count")) for e in events]


@pytest.mark.slow
def test_standby_takes_over_after_the_leader_is_killed(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    first, second = elector_pair(start_operator)
    create_jobs(kubectl, namespace, training_job("before"))
    wait_running(kubectl, namespace, "before")
    transitions = int(lease_spec(kubectl, namespace).get("leaseTransitions", 0))

    killed_at = time.time()
    first.signal(signal.SIGKILL)
    assert first.wait_exit(timeout=10) == -signal.SIGKILL

    became = wait_log(second, "the standby becomes the leader", message_has("became the leader"), timeout=60)
    elapsed = log_time(became) - killed_at
    print(f"standby took over {elapsed:.2f}s after the kill")
    # The lease expires lease_duration after the standby last saw the leader's renewal change it. The
    # standby sees that renewal only at its next poll (one jittered retry period at most) and notices
    # the expiry at the poll after the deadline (another one at most): client-go's algorithm, which
    # never trusts the other machine's clock. The renewal itself was at most one retry period old.
    upper = LEASE_DURATION + 2 * JITTERED_RETRY + ALLOWANCE
    lower = LEASE_DURATION - RETRY_PERIOD - ALLOWANCE
    assert lower <= elapsed <= upper, f"took over {elapsed:.2f}s after the kill; expected [{lower}, {upper}]"
    assert second.is_leader()

    spec = lease_spec(kubectl, namespace)
    assert spec["holderIdentity"] == identity_of(second)
    assert spec["leaseDurationSeconds"] == LEASE_DURATION
    assert int(spec["leaseTransitions"]) == transitions + 1

    # The new leader reconciles new work, and has taken over the old job without disturbing it.
    create_jobs(kubectl, namespace, training_job("after"))
    wait_running(kubectl, namespace, "after", "before")
    assert "after" in {line["name"] for line in reconcile_lines(second)}
    assert len(managed_pods(kubectl, namespace)) == 4


@pytest.mark.slow
def test_sigterm_releases_the_lease_to_the_standby(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    first, second = elector_pair(start_operator)
    create_jobs(kubectl, namespace, training_job("before"))
    wait_running(kubectl, namespace, "before")
    transitions = int(lease_spec(kubectl, namespace).get("leaseTransitions", 0))
    first_identity = identity_of(first)

    sent = time.monotonic()
    first.signal(signal.SIGTERM)
    code = first.wait_exit(timeout=GRACE_PERIOD + 10)
    took = time.monotonic() - sent
    assert code == 0, first.tail()
    assert took < GRACE_PERIOD, f"exited {took:.1f}s after SIGTERM"

    # The lease right after the exit: released (empty holder, 1 s) or already the standby's.
    released_spec = lease_spec(kubectl, namespace)
    assert released_spec.get("holderIdentity", "") != first_identity
    if not released_spec.get("holderIdentity"):
        assert released_spec["leaseDurationSeconds"] == 1

    # Shutdown order: workers drain, then the lease is released, then the process ends.
    logs = first.logs()

    def position(predicate: Callable[[LogEntry], bool]) -> int:
        return next(i for i, entry in enumerate(logs) if predicate(entry))

    assert (
        position(message_has("received SIGTERM"))
        < position(message_has("draining workers"))
        < position(message_has("released lease"))
        < position(lambda entry: entry.get("message") == "stopped")
    )
    assert logs[position(lambda entry: entry.get("message") == "stopped")]["exit_code"] == 0
    released = logs[position(message_has("released lease"))]

    became = wait_log(second, "the standby becomes the leader", message_has("became the leader"), timeout=30)
    handover = log_time(became) - log_time(released)
    print(f"exited {took:.2f}s after SIGTERM; standby took over {handover:.2f}s after the release")
    # A released lease is free at once: the standby takes it at its next poll.
    assert handover <= JITTERED_RETRY + ALLOWANCE, f"took over {handover:.2f}s after the release"

    second_identity = identity_of(second)
    assert released_spec.get("holderIdentity", "") in ("", second_identity)
    spec = lease_spec(kubectl, namespace)
    assert spec["holderIdentity"] == second_identity
    assert int(spec["leaseTransitions"]) == transitions + 1

    create_jobs(kubectl, namespace, training_job("after"))
    wait_running(kubectl, namespace, "after", "before")
    assert "after" in {line["name"] for line in reconcile_lines(second)}
