"""controller.planner.plan for an in-place job whose image cannot run the trainers' supervisor (no
python3, one too old): one uncounted restart, status.inPlaceUnavailable, and from then on pods built
without the supervisor whose restarts recreate them.

Why apart from test_lifecycle_inplace.py: the mechanism failing is not the training failing, and it
changes how every later pod of the job is built; the pods here are as the operator's cache holds
them (no spec), which is how the operator must recognise a supervised pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.watches import pod_essentials
from tests.unit.lifecycle_steps import W0, W1, created_pod_names, pod_creates
from tests.unit.lifecycle_world import names, world
from tests.unit.test_lifecycle_inplace import IN_PLACE, event_reasons, report


def supervised(pod: dict[str, Any]) -> bool:
    return str(pod["spec"]["containers"][0]["command"][:2]) == str(["python3", "-c"])


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (128, "StartError", 'exec: "python3": executable file not found in $PATH'),
        (1, "Error", "SyntaxError: invalid syntax"),  # a python3 older than the supervisor's 3.9
    ],
)
def test_an_image_that_cannot_run_the_supervisor_has_its_pods_recreated_without_it(
    code: int, reason: str, message: str
) -> None:
    """The operator's mechanism failed, not the training: the gang restarts at once, uncounted, and
    from then on the job's pods run the command directly and every restart recreates them."""
    w = world(IN_PLACE)
    w.run_to_running()
    assert all(supervised(pod) for pod in w.pods.values())
    report(w, 0, 0, "Running")
    w.exit(1, code, reason, message)  # rank 1's supervisor never reported: its container ended
    # The operator's pod cache keeps no spec: the pods' annotation says they run the supervisor.
    for name, pod in w.pods.items():
        w.pods[name] = pod_essentials(pod)
    result = w.step()
    status = w.status
    assert (w.state, status["lastRestartReason"], status["lastRestartKind"]) == (
        "Restarting",
        "SupervisorNotStarted",
        "Recreate",
    )
    assert status.get("restarts") == {}
    assert status["restartCount"] == 1
    assert "restartAt" not in status
    why = status["inPlaceUnavailable"]
    assert f"the supervisor did not start in pod {W1} (pod {W1}, container trainer, exit code {code}" in why
    assert "needs python3, 3.9 or later, on the image's PATH" in why
    assert message in why
    assert sorted(event_reasons(w, len(w.events) - len(result.events))) == [
        ("Warning", "InPlaceRestartFallback"),
        ("Warning", "SupervisorNotStarted"),
    ]
    assert names(result.deletes) == [W0, W1]
    w.finish_terminating()
    created = w.step()
    assert created_pod_names(created) == [W0, W1]
    assert not any(supervised(pod) for pod in pod_creates(created))
    # A failure of the training later is counted as usual and recreates the pods, saying why.
    w.run_to_running()
    w.exit(0, 1)
    result = w.step()
    fallbacks = [event.message for event in result.events if event.reason == "InPlaceRestartFallback"]
    assert len(fallbacks) == 1
    assert fallbacks[0].startswith(f"the supervisor did not start in pod {W1}")
    assert (w.state, w.status["restarts"], w.status["restartCount"]) == ("Restarting", {"failure": 1}, 2)
    assert names(result.deletes) == [W0, W1]
    assert w.status["inPlaceUnavailable"] == why
