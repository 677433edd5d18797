"""The progress helper (trainer/trainingjob_progress.py) against a local fake API.

Why: training code calls report() from its hot loop, so the promises that matter are about failure:
it never blocks or raises when the API is unreachable, stalls or refuses; it logs each distinct error
once; it keeps at most one request in flight and sends only the newest report. What it sends must be
what controller/progress.py parses. The fake API (tests/unit/fakeapi.py) is plain HTTP on 127.0.0.1.
The checkpoint helpers (retention, atomic writes, resume resolution) work on a temporary directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trainingjob_progress as tp

from builders.env import distributed_env
from controller.planner.progress import parse_report
from crd import contract
from crd.spec import parse
from tests.unit import fakeapi
from tests.unit.crd_cases import job
from tests.unit.fakeapi import FakeApi, Recorded, Reply, Stream

POD_PATH = "/api/v1/namespaces/ml-training/pods/mnist-worker-0"
DEADLINE = 10.0


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fakeapi.running() as server:
        server.default("PATCH", POD_PATH, Reply(200, {"kind": "Pod"}))
        yield server


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("token-1\n")
    return path


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


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trainingjob_progress" and r.levelno >= 30]


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


# ---------------------------------------------------------------------------------------------------
# from_env: who reports, and where to


def pod_env(**overrides: str) -> dict[str, str]:
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "POD_NAME": "mnist-worker-0",
        "TRAININGJOB_NAMESPACE": "ml-training",
        "TRAININGJOB_PROGRESS_ANNOTATION": contract.PROGRESS_ANNOTATION,
        "TRAININGJOB_REPLICA_INDEX": "0",
        "RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    env.update(overrides)
    return env


def test_from_env_uses_the_in_cluster_api(tmp_path: Path) -> None:
    reporter = tp.Reporter.from_env(pod_env(), service_account_dir=str(tmp_path))
    assert reporter.enabled
    assert reporter.url == "https://10.96.0.1:443/api/v1/namespaces/ml-training/pods/mnist-worker-0"
    assert reporter.annotation == contract.PROGRESS_ANNOTATION
    ipv6 = tp.Reporter.from_env(pod_env(KUBERNETES_SERVICE_HOST="fd00::1"), service_account_dir=str(tmp_path))
    assert ipv6.url.startswith("https://[fd00::1]:443/")
    (tmp_path / "namespace").write_text("from-file\n")
    env = pod_env(TRAININGJOB_PROGRESS_ANNOTATION="example.org/custom")
    del env["TRAININGJOB_NAMESPACE"]
    from_file = tp.Reporter.from_env(env, service_account_dir=str(tmp_path))
    assert "/namespaces/from-file/pods/" in from_file.url
    assert from_file.annotation == "example.org/custom"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="outside-a-cluster"),
        pytest.param(pod_env(KUBERNETES_SERVICE_HOST=""), id="no-api"),
        pytest.param(pod_env(POD_NAME=""), id="no-pod-name"),
        pytest.param(pod_env(RANK="1"), id="rank-1"),
        pytest.param(pod_env(RANK="2", TRAININGJOB_REPLICA_INDEX="1"), id="second-pod"),
        pytest.param(pod_env(RANK="", TRAININGJOB_REPLICA_INDEX="1"), id="second-pod-without-rank"),
        pytest.param(pod_env(RANK="", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2"), id="second-local-rank"),
        pytest.param(pod_env(RANK="zero"), id="unreadable-rank"),
    ],
)
def test_from_env_is_a_no_op_off_rank_zero_and_outside_a_cluster(
    env: dict[str, str], api: FakeApi, tmp_path: Path
) -> None:
    if env:
        env[tp.API_URL_ENV] = api.url if env.get("KUBERNETES_SERVICE_HOST") else ""
    reporter = tp.Reporter.from_env(env, service_account_dir=str(tmp_path))
    assert not reporter.enabled
    assert reporter.reason
    reporter.report(epoch=1, metrics={"loss": 1.0})
    assert reporter.flush(DEADLINE)
    reporter.close()
    assert api.requests() == []


def test_from_env_with_a_local_api_url_reports_there(api: FakeApi, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("local")
    env = pod_env(**{tp.API_URL_ENV: api.url})
    reporter = tp.Reporter.from_env(env, min_interval=0, service_account_dir=str(tmp_path))
    reporter.report(epoch=1)
    reporter.close()
    [request] = api.requests("PATCH", POD_PATH)
    assert request.headers["Authorization"] == "Bearer local"


# Local runs (hack/local_kubelet): a real https API with a token file and a CA given by path


@dataclass
class TlsApi:
    """A one-route https server on 127.0.0.1 with its own CA; records each PATCH's Authorization."""

    url: str
    ca_file: Path
    other_ca_file: Path  # a CA that did not sign the server's certificate
    authorizations: list[str]


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[TlsApi]:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a CA")
    pki = tmp_path / "pki"
    pki.mkdir()
    for ca in ("ca", "other"):
        _openssl(pki, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.crt", "-days", "1", "-subj", f"/CN={ca}")  # fmt: skip
    (pki / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(pki, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1")  # fmt: skip
    _openssl(pki, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "server.ext")  # fmt: skip
    authorizations: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_PATCH(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            authorizations.append(self.headers.get("Authorization", ""))
            body = b'{"kind": "Pod"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        yield TlsApi(url, pki / "ca.crt", pki / "other.crt", authorizations)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(DEADLINE)


def test_from_env_with_token_and_ca_files_reports_to_an_https_api(tls_api: TlsApi, tmp_path: Path) -> None:
    account = tmp_path / "serviceaccount"  # what a pod would have mounted: ignored with the overrides
    account.mkdir()
    (account / "token").write_text("mounted-token")
    token = tmp_path / "local-token"
    token.write_text("pod-bound-token\n")
    env = pod_env(
        **{tp.API_URL_ENV: tls_api.url, tp.TOKEN_FILE_ENV: str(token), tp.CA_FILE_ENV: str(tls_api.ca_file)}
    )
    reporter = tp.Reporter.from_env(env, min_interval=0, service_account_dir=str(account))
    assert reporter.url == f"{tls_api.url}/api/v1/namespaces/ml-training/pods/mnist-worker-0"
    reporter.report(epoch=1)
    assert reporter.flush(DEADLINE)
    token.write_text("rotated-token\n")  # re-read for every request, like the mounted one
    reporter.report(epoch=2)
    reporter.close()
    assert (reporter.sent, reporter.failed) == (2, 0)
    assert tls_api.authorizations == ["Bearer pod-bound-token", "Bearer rotated-token"]


def test_without_the_ca_file_an_https_api_is_verified_with_the_mounted_ca(
    tls_api: TlsApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(tls_api.other_ca_file, account / "ca.crt")
    token = tmp_path / "local-token"
    token.write_text("pod-bound-token")
    env = pod_env(**{tp.API_URL_ENV: tls_api.url, tp.TOKEN_FILE_ENV: str(token)})
    reporter = tp.Reporter.from_env(env, min_interval=0, service_account_dir=str(account))
    reporter.report(epoch=1)
    reporter.close()
    # The mounted CA did not sign the server's certificate: the report is dropped with one warning and
    # the token never leaves the process.
    assert (reporter.sent, reporter.failed) == (0, 1)
    assert tls_api.authorizations == []
    assert any("CERTIFICATE_VERIFY_FAILED" in message for message in warnings_from(caplog))


def test_the_local_overrides_are_reserved_names() -> None:
    for name in (tp.API_URL_ENV, tp.TOKEN_FILE_ENV, tp.CA_FILE_ENV):
        assert name.startswith(contract.RESERVED_ENV_PREFIXES), name  # spec.env can never set them


# ---------------------------------------------------------------------------------------------------
# Checkpoints


def make_checkpoints(root: Path, *epochs: int) -> None:
    for epoch in epochs:
        (root / f"epoch-{epoch}").mkdir(parents=True)
        (root / f"epoch-{epoch}" / "model.pt").write_bytes(b"x")


def test_enforce_retention_deletes_the_oldest_checkpoints_beyond_keep(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1, 2, 9, 10, 11)
    (tmp_path / "epoch-final").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".epoch-12.tmp-1-ab").mkdir()
    deleted = tp.enforce_retention(str(tmp_path), keep=2)
    assert deleted == [str(tmp_path / f"epoch-{n}") for n in (1, 2, 9)]  # by epoch number, not by name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".epoch-12.tmp-1-ab",
        "epoch-10",
        "epoch-11",
        "epoch-final",
        "notes.txt",
    ]
    assert tp.enforce_retention(str(tmp_path), keep=2) == []
    assert tp.enforce_retention(str(tmp_path), keep=5) == []


def test_enforce_retention_reads_checkpoint_dir_and_retention_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_checkpoints(tmp_path, 1, 2, 3)
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("CHECKPOINT_RETENTION", raising=False)
    assert tp.enforce_retention() == []  # no retention configured: keep everything
    monkeypatch.setenv("CHECKPOINT_RETENTION", "1")
    assert tp.enforce_retention() == [str(tmp_path / "epoch-1"), str(tmp_path / "epoch-2")]
    assert tp.latest_checkpoint_dir() == str(tmp_path / "epoch-3")
    monkeypatch.delenv("CHECKPOINT_DIR")
    assert tp.enforce_retention(keep=1) == []


def test_enforce_retention_leaves_object_storage_and_rejects_keep_below_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert tp.enforce_retention("s3://bucket/job", keep=1) == []
    assert any("lifecycle rules" in m for m in warnings_from(caplog))
    with pytest.raises(ValueError, match="at least 1"):
        tp.enforce_retention(str(tmp_path), keep=0)


def test_checkpoint_paths_and_resume_resolution(tmp_path: Path) -> None:
    assert tp.checkpoint_path(3, "/checkpoints") == "/checkpoints/epoch-3"
    assert tp.checkpoint_path(3, "gs://bucket/job/") == "gs://bucket/job/epoch-3"
    with pytest.raises(ValueError, match="non-negative"):
        tp.checkpoint_path(-1, "/checkpoints")
    assert tp.checkpoint_epoch("/checkpoints/epoch-12/") == 12
    assert tp.checkpoint_epoch("/checkpoints/model.pt") is None
    assert tp.resume_path({"RESUME_FROM": "/checkpoints/epoch-2"}) == "/checkpoints/epoch-2"
    assert tp.resume_path({"RESUME_FROM": ""}) is None
    assert tp.resume_path({}) is None
    assert tp.latest_checkpoint_dir(str(tmp_path / "missing")) is None
    make_checkpoints(tmp_path, 2, 10)
    assert tp.latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "epoch-10")
    assert tp.resolve_checkpoint(str(tmp_path)) == str(tmp_path / "epoch-10")
    assert tp.resolve_checkpoint(str(tmp_path / "epoch-2")) == str(tmp_path / "epoch-2")
    assert tp.resolve_checkpoint("s3://bucket/job") == "s3://bucket/job"


def test_atomic_checkpoint_publishes_complete_directories_only(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    with tp.atomic_checkpoint(1, str(root)) as partial:
        assert not (root / "epoch-1").exists()
        Path(partial, "model.pt").write_text("v1")
    assert (root / "epoch-1" / "model.pt").read_text() == "v1"
    with tp.atomic_checkpoint(1, str(root)) as partial:  # written again after a restart
        Path(partial, "model.pt").write_text("v2")
    assert (root / "epoch-1" / "model.pt").read_text() == "v2"

    def crash_while_writing() -> None:
        with tp.atomic_checkpoint(2, str(root)) as partial:
            Path(partial, "model.pt").write_text("half")
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        crash_while_writing()
    assert sorted(os.listdir(root)) == ["epoch-1"]
    reference = tmp_path / "made-with-mkdir"
    reference.mkdir()  # the checkpoint gets the umask's mode, not mkdtemp's private 0700
    assert (root / "epoch-1").stat().st_mode == reference.stat().st_mode


def test_the_helper_reads_what_the_operator_injects() -> None:
    # The helper cannot import the operator's modules (it runs in the training image): guard the drift.
    assert tp.DEFAULT_ANNOTATION == contract.PROGRESS_ANNOTATION
    manifest = job({"spec.checkpoint.enabled": True})
    manifest["metadata"]["namespace"] = "ml-training"
    names = {entry["name"] for entry in distributed_env(parse(manifest), 0)}
    read = {
        "POD_NAME",
        "TRAININGJOB_NAMESPACE",
        "TRAININGJOB_PROGRESS_ANNOTATION",
        "TRAININGJOB_REPLICA_INDEX",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "CHECKPOINT_DIR",
        "CHECKPOINT_RETENTION",
    }
    assert read <= names
    assert tp.API_URL_ENV.startswith(contract.RESERVED_ENV_PREFIXES)  # spec.env can never set it
