"""The operator's /metrics as deployed, against the real API server: HTTPS, every requester's token
reviewed by the API server and its right to get /metrics checked there, and a flood of idle
connections that fills the metrics port's cap while the operator goes on reconciling.

Why end to end: the unit tests (tests/unit/test_metrics_auth.py) script the API server's answers;
here the answers are the real ones, for real ServiceAccounts: no token or one the API server does not
accept (random, expired, or its ServiceAccount deleted) is 401, an account without the shipped
`trainingjob-operator-metrics-reader` ClusterRole 403, one bound to it 200, and the operator asks with
the rights deploy/ grants it (its ServiceAccount's token, tests/e2e/operator_identity.py). The flood is
what the issue asks to survive: connections that never send a byte, more than the cap, kept open as an
attacker would (re-opened as soon as the operator closes one); the operator refuses those past the cap
and says so once in its log, its thread count stays bounded, its probes (another port) keep answering,
a TrainingJob created meanwhile reaches Running, and once the flood ends a scrape is served again.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from controller.runtime.serving import METRICS_LIMITS
from controller.runtime.servingcert import self_signed_pair
from testbed import Kubectl, wait_for
from tests.cluster import SESSION
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, wait_for_state
from tests.e2e.metrics_access import account_token, metrics_reader, resigned, revoked_token, user_of
from tests.e2e.operator import OperatorProcess


def test_the_api_server_decides_who_reads_metrics(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    self_signed_pair(certs, ["127.0.0.1", "localhost"])
    # The certificate given, the operator's TLS is verified (and what the log says it serves).
    context = ssl.create_default_context(cafile=str(certs / "tls.crt"))
    stranger = account_token(cluster, namespace, "stranger")
    revoked = revoked_token(cluster, namespace)
    with metrics_reader(cluster, namespace) as reader:
        operator = start_operator(f"--metrics-cert-path={certs}", secure=True, tls_context=context)
        assert operator.get("/metrics") == (401, "Unauthorized\n")
        assert operator.get("/metrics", token="not-a-token") == (401, "Unauthorized\n")
        assert operator.get("/metrics", token=revoked) == (401, "Unauthorized\n")
        denied = f"Authorization denied for user {user_of(namespace, 'stranger')}\n"
        assert operator.get("/metrics", token=stranger) == (403, denied)
        status, body = operator.get("/metrics", token=reader)
        assert status == 200, body
        assert "leader_election_master_status" in body
        # The reader's own token, expired: refused for its age alone (the same, signed again with an
        # expiry ahead, is served).
        signing_key = SESSION.pki / "sa.key"
        assert operator.get("/metrics", token=resigned(reader, signing_key, 3600))[0] == 200
        assert operator.get("/metrics", token=resigned(reader, signing_key, -3600)) == (401, "Unauthorized\n")
        # Every path of the metrics port is behind the filter; the probes are on their own port.
        assert operator.get("/readyz") == (200, "ok")
        assert operator.get("/metrics?name[]=workqueue_depth", token=reader)[0] == 200
    served = [
        entry for entry in operator.logs() if entry.get("message", "").startswith("serving /metrics over")
    ]
    assert [(entry["message"], entry.get("certificate")) for entry in served] == [
        ("serving /metrics over HTTPS to authenticated and authorized requesters", f"from {certs}")
    ]
    # The reviews went to the API server as the operator's ServiceAccount, with the rights deploy/ grants.
    assert not [entry for entry in operator.logs() if "was not answered" in str(entry.get("message"))]


# ---- a flood of idle connections ---------------------------------------------------------------------

FLOOD = 200  # idle connections the attacker keeps open: several times the cap


class IdleFlood:
    """Keeps FLOOD TCP connections to 127.0.0.1:port open without sending a byte, re-opening each one
    the server closes, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.closed_by_server = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="idle-flood", daemon=True)
        self.open: list[socket.socket] = []
        self.error: BaseException | None = None

    def __enter__(self) -> IdleFlood:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(30)
        if self.error is not None:
            raise AssertionError(f"the flood stopped: {self.error!r}") from self.error

    def closed_at_least(self, count: int) -> bool:
        assert self.error is None, f"the flood stopped: {self.error!r}"
        return self.closed_by_server >= count

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set():
                while len(self.open) < FLOOD:
                    self.open.append(socket.create_connection(("127.0.0.1", self.port), timeout=10))
                readable, _, _ = select.select(self.open, [], [], 0.1)
                for sock in readable:  # the server closed it (nothing else is ever sent)
                    self.closed_by_server += 1
                    self.open.remove(sock)
                    sock.close()
        except BaseException as error:
            self.error = error
        finally:
            for sock in self.open:
                sock.close()
            self.open.clear()


def threads_of(operator: OperatorProcess) -> int:
    for line in Path(f"/proc/{operator.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def refusals(operator: OperatorProcess) -> list[dict[str, Any]]:
    return [entry for entry in operator.logs() if "connection(s) refused" in str(entry.get("message"))]


def test_a_flood_of_idle_connections_fills_the_cap_and_the_operator_keeps_reconciling(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    cap = METRICS_LIMITS.max_connections
    with metrics_reader(cluster, namespace) as reader:
        operator = start_operator(secure=True, metrics_token=reader)
        cluster.apply(job_manifest("before"), "-n", namespace)
        wait_for_state(cluster, namespace, "before", "Running", timeout=120)
        threads_before = threads_of(operator)
        most_threads = threads_before
        with IdleFlood(operator.port) as flood:
            # The connections past the cap are closed at once, while the attacker holds FLOOD open.
            wait_for(
                f"{FLOOD - cap} of the flood's connections closed by the operator",
                lambda: flood.closed_at_least(FLOOD - cap),
                timeout=60,
            )
            cluster.apply(job_manifest("during"), "-n", namespace)

            def running_while_probed() -> bool:
                nonlocal most_threads
                most_threads = max(most_threads, threads_of(operator))
                assert operator.get("/readyz") == (200, "ok"), "the probes answer during the flood"
                job = cluster.get_json("trainingjob", "during", "-n", namespace)
                return (job.get("status") or {}).get("state") == "Running"

            wait_for("the job created during the flood Running", running_while_probed, timeout=120)
        refusal = wait_for("the refusals in the operator's log", lambda: refusals(operator), timeout=30)[0]
        assert refusal["message"].endswith(f"refused: {cap} are open, the most it serves at once")
        # Without the cap each connection held a thread: FLOOD more; with it at most `cap`, plus the
        # pod-creating threads the second job may have started (--create-concurrency, 16).
        assert most_threads <= threads_before + cap + 16, (threads_before, most_threads)
        # The flood's connections gone, a scrape is served again.
        wait_for("a scrape served after the flood", lambda: operator.get("/metrics")[0] == 200, timeout=60)
        assert operator.alive()
