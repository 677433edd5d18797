"""What a failed end-to-end test reports (tests/e2e/diagnostics.py): the operator's decisions survive
thousands of DEBUG lines, Events read in order, and each pod says how it ended."""

from __future__ import annotations

import json

from tests.e2e import diagnostics


def entry(level: str, message: str, **fields: str) -> str:
    return json.dumps({"time": "t", "level": level, "message": message, **fields})


def test_the_decisions_survive_any_number_of_debug_lines_and_the_end_is_kept_whole() -> None:
    lines = [
        entry("INFO", "state Running -> Restarting", namespace="ns", name="job"),
        *[entry("DEBUG", f"reconciled {index}") for index in range(5000)],
        entry("WARNING", "worker-1 exited with code 1", namespace="ns", name="job"),
        *[entry("DEBUG", f"status updated {index}") for index in range(30)],
    ]
    digest = diagnostics.log_digest(lines, tail=25).splitlines()
    assert digest[:2] == [
        "t INFO ns/job state Running -> Restarting",
        "t WARNING ns/job worker-1 exited with code 1",
    ]
    assert digest[2] == "[... 5005 DEBUG lines above ...]"
    assert digest[3:] == [f"t DEBUG status updated {index}" for index in range(5, 30)]


def test_a_short_log_is_shown_whole_and_urllib3_bookkeeping_is_left_out() -> None:
    lines = [
        "not json",
        entry("INFO", "Starting new HTTPS connection (1): 127.0.0.1:6443"),
        entry("DEBUG", "retry", logger="urllib3.util.retry"),
        entry("ERROR", "boom"),
    ]
    assert diagnostics.log_digest(lines) == "not json\nt ERROR boom"


def done(code: int, reason: str) -> dict[str, object]:
    return {"exitCode": code, "reason": reason}


def test_events_read_oldest_first_with_their_counts() -> None:
    later = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:09Z"},
        "lastTimestamp": "2026-01-01T00:00:09Z",
        "type": "Warning",
        "reason": "WorkerLost",
        "involvedObject": {"kind": "TrainingJob", "name": "elastic"},
        "count": 2,
        "message": "elastic-worker-2: PodDeleted",
    }
    earlier = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:01Z"},
        "eventTime": "2026-01-01T00:00:01.000000Z",
        "type": "Normal",
        "reason": "Scheduled",
        "involvedObject": {"kind": "Pod", "name": "elastic-worker-0"},
        "message": "assigned",
    }
    assert diagnostics.events_digest([later, earlier]).splitlines() == [
        "2026-01-01T00:00:01.000000Z Normal Scheduled Pod/elastic-worker-0: assigned",
        "2026-01-01T00:00:09Z Warning WorkerLost TrainingJob/elastic (x2): elastic-worker-2: PodDeleted",
    ]
    assert diagnostics.events_digest([]) == "(no Events)"


def test_each_pod_says_how_its_containers_ended_and_whether_it_is_being_deleted() -> None:
    ended = {
        "metadata": {"name": "job-worker-1", "deletionTimestamp": "2026-01-01T00:00:05Z"},
        "spec": {"nodeName": "real-node"},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "prepare", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "restartCount": 1,
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
        },
    }
    waiting = {
        "metadata": {"name": "job-worker-0"},
        "spec": {},
        "status": {"phase": "Pending"},
    }
    assert diagnostics.pods_digest([ended, waiting]).splitlines() == [
        "job-worker-0 Pending on unscheduled; no containers yet",
        "job-worker-1 Failed on real-node deleting since 2026-01-01T00:00:05Z; prepare: terminated exit 0 "
        "Completed, trainer: terminated exit 137 OOMKilled (restarts 1)",
    ]
    assert diagnostics.pods_digest([]) == "(no pods)"
