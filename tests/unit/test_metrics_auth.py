"""Who may read /metrics (controller/runtime/authfilter.py), decided with a scripted API server: no
token or one the TokenReview refuses is 401, a user the SubjectAccessReview denies is 403, an API
server that does not answer is 500 (and nothing is cached), and the answers are cached for
controller-runtime's lifetimes (a token's review 1 minute, an allowed access 5 minutes, a denied one
30 seconds) in bounded caches keyed by the token's digest. Then the metrics server over HTTPS with
the filter, as Prometheus meets it.

The real API server's answers (an expired token, a user without the metrics-reader ClusterRole) are
tests/e2e/test_metrics_auth_e2e.py's.
"""

from __future__ import annotations

import hashlib
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from controller.runtime.authfilter import DelegatingAuth, User, bearer_token
from controller.runtime.clock import FakeClock
from controller.runtime.errors import TransportError
from controller.runtime.serving import MetricsServer
from controller.runtime.servingcert import ServingCertificate

JsonObject = dict[str, Any]
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
PROMETHEUS_USER = "system:serviceaccount:monitoring:prometheus"
PROMETHEUS: JsonObject = {
    "username": PROMETHEUS_USER,
    "uid": "1234",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
}


@dataclass
class ScriptedApi:
    """Answers reviews as an API server would: `users` are the tokens it knows, `allowed` the users who
    may get /metrics; `down` makes every request fail as an unreachable server's would."""

    users: dict[str, JsonObject] = field(default_factory=dict)
    allowed: set[str] = field(default_factory=set)
    down: bool = False
    sent: list[tuple[str, JsonObject]] = field(default_factory=list)

    def request(self, method: str, path: str, *, body: JsonObject | None = None) -> JsonObject:
        assert method == "POST"
        assert body is not None
        self.sent.append((path, body))
        if self.down:
            raise TransportError(f"POST {path}: connection refused")
        spec = body["spec"]
        if path == TOKEN_REVIEWS:
            user = self.users.get(spec["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": user}}
        assert path == ACCESS_REVIEWS
        allowed = spec["user"] in self.allowed and spec["nonResourceAttributes"]["verb"] == "get"
        return {"status": {"allowed": allowed}}

    def paths(self) -> list[str]:
        return [path for path, _ in self.sent]


@pytest.fixture
def api() -> ScriptedApi:
    return ScriptedApi(
        users={"good": PROMETHEUS, "stranger": {"username": "jane"}}, allowed={PROMETHEUS_USER}
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def auth(api: ScriptedApi, clock: FakeClock) -> DelegatingAuth:
    return DelegatingAuth(api, clock=clock)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer a b", None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_without_a_token_401_and_the_api_server_is_not_asked(auth: DelegatingAuth, api: ScriptedApi) -> None:
    decision = auth.decide(None, "GET", "/metrics")
    assert (decision.status, decision.message) == (401, "Unauthorized")
    assert api.sent == []


def test_a_refused_token_is_401_and_remembered_for_a_minute(
    auth: DelegatingAuth, api: ScriptedApi, clock: FakeClock
) -> None:
    assert auth.decide("Bearer expired", "GET", "/metrics").status == 401
    assert auth.decide("Bearer expired", "GET", "/metrics").status == 401
    assert api.paths() == [TOKEN_REVIEWS]
    clock.advance(60)
    assert auth.decide("Bearer expired", "GET", "/metrics").status == 401
    assert api.paths() == [TOKEN_REVIEWS, TOKEN_REVIEWS]


def test_an_allowed_user_passes_and_both_answers_are_cached(
    auth: DelegatingAuth, api: ScriptedApi, clock: FakeClock
) -> None:
    decision = auth.decide("Bearer good", "GET", "/metrics")
    assert (decision.status, decision.user) == (200, PROMETHEUS["username"])
    token_review, access_review = api.sent
    assert token_review == (
        TOKEN_REVIEWS,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "good"}},
    )
    # The access review repeats everything the token review said of the user.
    assert access_review == (
        ACCESS_REVIEWS,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": PROMETHEUS["username"],
                "uid": "1234",
                "groups": PROMETHEUS["groups"],
                "extra": PROMETHEUS["extra"],
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            },
        },
    )
    clock.advance(59)
    assert auth.decide("Bearer good", "GET", "/metrics").allowed
    assert len(api.sent) == 2
    clock.advance(1)  # the token's review is a minute old: asked again; the access is still known
    assert auth.decide("Bearer good", "GET", "/metrics").allowed
    assert api.paths()[2:] == [TOKEN_REVIEWS]
    clock.advance(240)  # the allowed access is five minutes old
    assert auth.decide("Bearer good", "GET", "/metrics").allowed
    assert api.paths()[3:] == [TOKEN_REVIEWS, ACCESS_REVIEWS]


def test_a_user_without_the_right_is_403_for_30_seconds(
    auth: DelegatingAuth, api: ScriptedApi, clock: FakeClock
) -> None:
    decision = auth.decide("Bearer stranger", "GET", "/metrics")
    assert (decision.status, decision.message) == (403, "Authorization denied for user jane")
    api.allowed.add("jane")  # a ClusterRoleBinding made meanwhile
    clock.advance(29)
    assert auth.decide("Bearer stranger", "GET", "/metrics").status == 403
    clock.advance(1)
    assert auth.decide("Bearer stranger", "GET", "/metrics").allowed


def test_the_verb_and_path_are_the_requests(auth: DelegatingAuth, api: ScriptedApi) -> None:
    assert auth.decide("Bearer good", "HEAD", "/metrics").status == 403
    assert auth.decide("Bearer good", "GET", "/debug").status == 200
    attributes = [body["spec"]["nonResourceAttributes"] for path, body in api.sent if path == ACCESS_REVIEWS]
    assert attributes == [{"path": "/metrics", "verb": "head"}, {"path": "/debug", "verb": "get"}]


def test_an_api_server_that_does_not_answer_is_500_and_nothing_is_cached(
    auth: DelegatingAuth, api: ScriptedApi
) -> None:
    api.down = True
    decision = auth.decide("Bearer good", "GET", "/metrics")
    assert (decision.status, decision.message) == (500, "Authentication failed")
    api.down = False
    assert auth.decide("Bearer good", "GET", "/metrics").allowed
    api.down = True
    auth.accesses = type(auth.accesses)(FakeClock())  # forget the access; the token stays known
    decision = auth.decide("Bearer good", "GET", "/metrics")
    assert (decision.status, decision.message) == (
        500,
        f"Authorization for user {PROMETHEUS['username']} failed",
    )


def test_the_caches_are_bounded_and_hold_no_token(api: ScriptedApi, clock: FakeClock) -> None:
    auth = DelegatingAuth(api, clock=clock, max_entries=8)
    for number in range(100):
        assert auth.decide(f"Bearer random-{number}", "GET", "/metrics").status == 401
    assert len(auth.tokens) == 8
    assert auth.tokens.get("random-99") is None
    assert auth.tokens.get(hashlib.sha256(b"random-99").hexdigest()) == (None,)
    assert auth.tokens.get(hashlib.sha256(b"random-0").hexdigest()) is None  # the oldest went first


def test_a_token_review_without_a_username_is_not_a_user(api: ScriptedApi, auth: DelegatingAuth) -> None:
    api.users["nameless"] = {"uid": "x"}
    assert auth.decide("Bearer nameless", "GET", "/metrics").status == 401
    assert User.from_review(PROMETHEUS).extra == (
        ("authentication.kubernetes.io/pod-name", ("prometheus-0",)),
    )


# ---- the metrics server over HTTPS, with the filter -------------------------------------------------------


@pytest.fixture
def secure_server(tmp_path: Path, api: ScriptedApi) -> Iterator[tuple[MetricsServer, ssl.SSLContext]]:
    registry = CollectorRegistry()
    Counter("scraped", "a series", registry=registry).inc()
    certificate = ServingCertificate.generate(["localhost", "127.0.0.1"], scratch=tmp_path)
    server = MetricsServer("127.0.0.1", 0, registry, certificate=certificate, auth=DelegatingAuth(api))
    server.start()
    try:
        yield server, ssl.create_default_context(cafile=str(certificate.cert))
    finally:
        server.stop()


def scrape(
    server: MetricsServer, context: ssl.SSLContext, token: str | None, path: str = "/metrics"
) -> tuple[int, str, str | None]:
    """Status, body and the Connection header of one HTTPS request."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"https://127.0.0.1:{server.port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:  # noqa: S310
            return response.status, response.read().decode(), response.headers.get("Connection")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode(), error.headers.get("Connection")


def test_https_scrape_with_and_without_the_right(secure_server: tuple[MetricsServer, ssl.SSLContext]) -> None:
    server, context = secure_server
    assert scrape(server, context, None) == (401, "Unauthorized\n", "close")
    assert scrape(server, context, "forged") == (401, "Unauthorized\n", "close")
    assert scrape(server, context, "stranger") == (403, "Authorization denied for user jane\n", "close")
    status, body, _ = scrape(server, context, "good")
    assert status == 200
    assert "scraped_total 1.0" in body
    # Every path of the metrics server is behind the filter; an allowed user gets a 404 for the others.
    assert scrape(server, context, None, "/healthz")[0] == 401
    assert scrape(server, context, "good", "/healthz")[0] == 404
