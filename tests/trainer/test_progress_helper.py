"""The progress helper (trainer/trainingjob_progress/) against a local fake API.

Why: training code calls report() from its hot loop, so the promises that matter are about failure:
it never blocks or raises when the API is unreachable, stalls or refuses; it logs each distinct error
once; it keeps at most one request in flight and sends only the newest report. What it sends must be
what controller/progress.py parses. The fake API (tests/unit/fakeapi.py) is plain HTTP on 127.0.0.1.
The checkpoint helpers (retention, atomic writes, resume resolution) work on a temporary directory.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import trainingjob_progress as tp

from controller.planner.progress import parse_report
from crd import contract
from tests.trainer.progress_support import DEADLINE, POD_PATH, warnings_from
from tests.unit import fakeapi
from tests.unit.fakeapi import FakeApi, Recorded, Reply, Stream


def reporter_for(api: FakeApi, token: Path | None, **settings: Any) -> tp.Reporter:
    options: dict[str, Any] = {"min_interval": 0.0, "timeout": 2.0, **settings}
    return tp.Reporter(
        api_url=api.url,
        namespace="ml-training",
        pod_name="mnist-worker-0",
        token_path=str(token) if token else None,
        ca_path=None,
        **options,
    )


def annotation_of(request: Recorded) -> dict[str, Any]:
    body = request.json()
    text = body["metadata"]["annotations"][contract.PROGRESS_ANNOTATION]
    report = json.loads(text)
    assert isinstance(report, dict)
    return report


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# ---------------------------------------------------------------------------------------------------
# What is sent


def test_report_merge_patches_the_annotation_on_its_own_pod(api: FakeApi, token: Path) -> None:
    reporter = reporter_for(api, token)
    reporter.report(
        epoch=3,
        total_epochs=10,
        step=300,
        total_steps=1000,
        metrics={"loss": 0.41, "accuracy": 0.87},
        checkpoint="/checkpoints/epoch-3",
    )
    assert reporter.flush(DEADLINE)
    reporter.close()
    [request] = api.requests("PATCH", POD_PATH)
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.headers["Authorization"] == "Bearer token-1"
    assert list(request.json()["metadata"]["annotations"]) == [contract.PROGRESS_ANNOTATION]
    raw = annotation_of(request)
    assert set(raw) == {
        "epoch",
        "totalEpochs",
        "step",
        "totalSteps",
        "metrics",
        "checkpoint",
        "checkpointTime",
        "time",
    }
    report, error = parse_report(request.json()["metadata"]["annotations"][contract.PROGRESS_ANNOTATION])
    assert error is None
    assert report is not None
    assert (report.epoch, report.total_epochs, report.step, report.total_steps) == (3, 10, 300, 1000)
    assert report.metrics == {"loss": 0.41, "accuracy": 0.87}
    assert report.checkpoint == "/checkpoints/epoch-3"
    assert report.checkpoint_time == raw["checkpointTime"]
    assert raw["time"].endswith("Z")
    assert reporter.sent == 1


def test_the_token_is_read_again_for_every_request(api: FakeApi, token: Path) -> None:
    reporter = reporter_for(api, token)
    reporter.report(epoch=1)
    assert reporter.flush(DEADLINE)
    token.write_text("token-2")  # the kubelet rotated the projected token
    reporter.report(epoch=2)
    assert reporter.flush(DEADLINE)
    reporter.close()
    first, second = api.requests("PATCH", POD_PATH)
    assert first.headers["Authorization"] == "Bearer token-1"
    assert second.headers["Authorization"] == "Bearer token-2"


def test_values_are_sanitised_and_the_checkpoint_is_repeated(api: FakeApi, token: Path) -> None:
    class Scalar:  # numpy scalars and one-element tensors convert with float()
        def __float__(self) -> float:
            return 0.25

    reporter = reporter_for(api, token)
    reporter.report(
        epoch=-1,
        step=True,
        metrics={"loss": Scalar(), "nan": float("nan"), "name": "x", "ok": 1, "flag": True},
        checkpoint="/checkpoints/epoch-1",
    )
    assert reporter.flush(DEADLINE)
    reporter.report(epoch=2, total_epochs=4)
    assert reporter.flush(DEADLINE)
    reporter.report(epoch=3, checkpoint="/checkpoints/epoch-3")
    assert reporter.flush(DEADLINE)
    reporter.close()
    first, second, third = (annotation_of(r) for r in api.requests("PATCH", POD_PATH))
    assert "epoch" not in first
    assert "step" not in first
    assert first["metrics"] == {"loss": 0.25, "ok": 1.0}
    # A report without a checkpoint still carries the newest one, so replacing a pending report with
    # a newer one can never hide a checkpoint from the operator.
    assert second["checkpoint"] == "/checkpoints/epoch-1"
    assert second["checkpointTime"] == first["checkpointTime"]
    assert third["checkpoint"] == "/checkpoints/epoch-3"


def test_report_never_raises(api: FakeApi, token: Path, caplog: pytest.LogCaptureFixture) -> None:
    reporter = reporter_for(api, token)
    reporter.report(metrics=object())  # type: ignore[arg-type]
    reporter.close()
    assert api.requests("PATCH") == []
    assert any("progress report dropped" in message for message in warnings_from(caplog))


# ---------------------------------------------------------------------------------------------------
# Failures: never block, never raise, log once, drop


def test_an_unreachable_api_never_blocks_and_is_logged_once(
    token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = tp.Reporter(
        api_url=f"http://127.0.0.1:{closed_port()}",
        namespace="ml-training",
        pod_name="mnist-worker-0",
        token_path=str(token),
        ca_path=None,
        min_interval=0.0,
        timeout=1.0,
    )
    for epoch in range(3):
        started = time.monotonic()
        reporter.report(epoch=epoch)
        assert time.monotonic() - started < 1.0  # queued, not sent, by report()
        assert reporter.flush(DEADLINE)
    reporter.close()
    assert reporter.failed == 3
    assert reporter.sent == 0
    unreachable = [m for m in warnings_from(caplog) if "could not reach" in m]
    assert len(unreachable) == 1, warnings_from(caplog)


def test_a_refusing_api_is_logged_once_per_error_and_the_report_dropped(
    api: FakeApi, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forbidden = fakeapi.status(403, "Forbidden", 'pods "mnist-worker-0" is forbidden: cannot patch')
    api.script("PATCH", POD_PATH, Reply(403, forbidden), Reply(403, forbidden), Reply(500, {}))
    reporter = reporter_for(api, token)
    for epoch in range(4):
        reporter.report(epoch=epoch)
        assert reporter.flush(DEADLINE)
    reporter.close()
    assert len(api.requests("PATCH", POD_PATH)) == 4
    assert (reporter.failed, reporter.sent) == (3, 1)
    refused = [m for m in warnings_from(caplog) if "refused" in m]
    assert len(refused) == 2, refused  # one for the 403 (twice), one for the 500
    assert "HTTP 403" in refused[0]
    assert "cannot patch" in refused[0]


def test_a_stalled_api_times_out(api: FakeApi, token: Path) -> None:
    api.script("PATCH", POD_PATH, Stream(stall=True))
    reporter = reporter_for(api, token, timeout=0.3)
    reporter.report(epoch=1)
    assert reporter.flush(DEADLINE)
    reporter.report(epoch=2)
    assert reporter.flush(DEADLINE)
    reporter.close()
    assert (reporter.failed, reporter.sent) == (1, 1)
    assert annotation_of(api.requests("PATCH", POD_PATH)[-1])["epoch"] == 2


def test_rapid_reports_coalesce_with_one_request_in_flight(api: FakeApi, token: Path) -> None:
    # The first request stalls until the client gives up; everything reported meanwhile collapses
    # into the newest report, sent once the first request is over.
    api.script("PATCH", POD_PATH, Stream(stall=True))
    reporter = reporter_for(api, token, timeout=1.0)
    reporter.report(epoch=1)
    api.wait_for_requests(1, "PATCH", POD_PATH, timeout=DEADLINE)
    for epoch in range(2, 11):
        reporter.report(epoch=epoch)
    assert reporter.flush(DEADLINE)
    reporter.close()
    requests = api.requests("PATCH", POD_PATH)
    assert [annotation_of(r)["epoch"] for r in requests] == [1, 10]


def test_min_interval_spaces_requests_and_flush_overrides_it(api: FakeApi, token: Path) -> None:
    reporter = reporter_for(api, token, min_interval=0.5)
    started = time.monotonic()
    reporter.report(epoch=1)
    reporter.report(epoch=1, step=1)  # replaces the first if it has not left yet
    api.wait_for_requests(1, "PATCH", POD_PATH, timeout=DEADLINE)
    reporter.report(epoch=2)
    api.wait_for_requests(2, "PATCH", POD_PATH, timeout=DEADLINE)
    assert time.monotonic() - started >= 0.5
    reporter.close()

    slow = reporter_for(api, token, min_interval=3600)
    slow.report(epoch=3)
    api.wait_for_requests(3, "PATCH", POD_PATH, timeout=DEADLINE)
    slow.report(epoch=4)
    assert slow.flush(DEADLINE)  # an hour early: flush does not wait for the interval
    assert annotation_of(api.requests("PATCH", POD_PATH)[-1])["epoch"] == 4
    slow.close()


def test_close_sends_the_pending_report_and_drops_later_ones(api: FakeApi, token: Path) -> None:
    reporter = reporter_for(api, token, min_interval=3600)
    reporter.report(epoch=1)
    api.wait_for_requests(1, "PATCH", POD_PATH, timeout=DEADLINE)
    reporter.report(epoch=2)  # held back by the interval
    reporter.close()
    reporter.report(epoch=3)
    reporter.close()
    assert [annotation_of(r)["epoch"] for r in api.requests("PATCH", POD_PATH)] == [1, 2]
