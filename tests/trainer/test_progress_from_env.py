"""The progress helper's Reporter.from_env: who reports (rank 0 in a TrainingJob pod) and where to (the
in-cluster API, or for local runs an API URL with a token file and a CA given by path, as the local
kubelet sets them).

Split out of tests/trainer/test_progress_helper.py (what is sent, and failures).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trainingjob_progress as tp

from crd import contract
from tests.trainer.progress_support import DEADLINE, POD_PATH, warnings_from
from tests.unit.fakeapi import FakeApi

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


# Local runs (a trainer outside a pod): a real https API with a token file and a CA given by path


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
