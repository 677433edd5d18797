"""Who may read an endpoint, decided by the API server: authentication with a TokenReview, authorization
with a SubjectAccessReview on the request's path, as controller-runtime's
`filters.WithAuthenticationAndAuthorization` does for a kubebuilder project's /metrics.

Why: /metrics names every tenant's jobs and namespaces, so it must not be readable by anyone who can
reach the pod. The requester's bearer token (Prometheus's ServiceAccount token) is sent to the API
server, which says whose it is; the API server is then asked whether that user may `get` the
non-resource URL (`/metrics`), which a ClusterRole grants (`nonResourceURLs: ["/metrics"]`). The
answers: 401 without a token or with one the API server does not accept (unknown, expired, its
ServiceAccount deleted), 403 when the user lacks the right, 500 when the API server could not be asked.

Answers are cached, so a scrape every 30 s costs no API request once warm, with controller-runtime's
lifetimes: a token's review for 1 minute (accepted or not: a revoked token is refused within a
minute), an allowed access for 5 minutes (a right taken away stops working within 5 minutes), a
denied one for 30 seconds (a right just granted works within 30 s). Tokens are kept only as their
SHA-256 digests, and each cache holds at most `max_entries` answers (least recently used out first),
so a client sending a new random token with every request cannot grow the operator's memory.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from controller.runtime.clock import Clock, RealClock
from controller.runtime.errors import KubeError
from controller.runtime.resource import SUBJECTACCESSREVIEWS, TOKENREVIEWS, Resource

logger = logging.getLogger(__name__)

AUTHENTICATION_TTL: Final = 60.0
ALLOW_TTL: Final = 300.0
DENY_TTL: Final = 30.0
MAX_ENTRIES: Final = 1024

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
JsonObject = dict[str, Any]


class Requester(Protocol):
    """What the filter needs of an API client (controller.runtime.client.KubeClient has it)."""

    def request(self, method: str, path: str, *, body: JsonObject | None = ...) -> JsonObject: ...


class TtlCache(Generic[K, V]):
    """A bounded map whose entries expire, each after its own lifetime; thread-safe."""

    def __init__(self, clock: Clock, max_entries: int = MAX_ENTRIES) -> None:
        self._clock = clock
        self._max = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, value = entry
            if self._clock.monotonic() >= expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V, ttl: float) -> None:
        with self._lock:
            self._entries[key] = (self._clock.monotonic() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@dataclass(frozen=True)
class User:
    """Who a token belongs to, as the TokenReview said (what a SubjectAccessReview must repeat)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_review(cls, user: Mapping[str, Any]) -> User:
        extra = user.get("extra") or {}
        return cls(
            name=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(group) for group in user.get("groups") or ()),
            extra=tuple(
                sorted((str(key), tuple(str(v) for v in values or ())) for key, values in extra.items())
            ),
        )


@dataclass(frozen=True)
class Decision:
    """The filter's answer: `status` 200 lets the request through; any other is the response to send."""

    status: int
    message: str
    user: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHORIZED: Final = Decision(401, "Unauthorized")


def _review(kind: Resource, spec: JsonObject) -> JsonObject:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "spec": spec}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


class DelegatingAuth:
    """Authenticates a request's bearer token and authorizes its verb on its path, through the API server."""

    def __init__(
        self,
        client: Requester,
        *,
        clock: Clock | None = None,
        authentication_ttl: float = AUTHENTICATION_TTL,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._client = client
        clock = clock or RealClock()
        self._authentication_ttl = authentication_ttl
        self._allow_ttl = allow_ttl
        self._deny_ttl = deny_ttl
        # A token's digest -> (its user,) or (None,) when refused.
        self.tokens: TtlCache[str, tuple[User | None]] = TtlCache(clock, max_entries)
        self.accesses: TtlCache[tuple[User, str, str], bool] = TtlCache(clock, max_entries)

    def decide(self, authorization: str | None, method: str, path: str) -> Decision:
        """Whether the request with this Authorization header may `method` the non-resource `path`."""
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHORIZED
        try:
            user = self.authenticate(token)
        except KubeError as error:
            logger.warning("authentication failed: the TokenReview was not answered: %s", error)
            return Decision(500, "Authentication failed")
        if user is None:
            return UNAUTHORIZED
        verb = method.lower()
        try:
            allowed = self.authorize(user, verb, path)
        except KubeError as error:
            message = f"Authorization for user {user.name} failed"
            logger.warning("%s: the SubjectAccessReview was not answered: %s", message, error)
            return Decision(500, message, user.name)
        if not allowed:
            logger.debug("%s %s denied to %s", verb, path, user.name)
            return Decision(403, f"Authorization denied for user {user.name}", user.name)
        return Decision(200, "ok", user.name)

    def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server does not accept the token."""
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self.tokens.get(key)
        if cached is not None:
            return cached[0]
        review = self._client.request(
            "POST",
            TOKENREVIEWS.path(),
            body={
                "apiVersion": TOKENREVIEWS.api_version,
                "kind": TOKENREVIEWS.kind,
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        user = User.from_review(status.get("user") or {}) if status.get("authenticated") else None
        if user is not None and not user.name:
            user = None
        if user is None:
            logger.debug("token refused by the API server: %s", status.get("error") or "not authenticated")
        self.tokens.put(key, (user,), self._authentication_ttl)
        return user

    def authorize(self, user: User, verb: str, path: str) -> bool:
        """Whether `user` may `verb` the non-resource URL `path`, as the cluster's authorizer says."""
        key = (user, verb, path)
        cached = self.accesses.get(key)
        if cached is not None:
            return cached
        spec: JsonObject = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {name: list(values) for name, values in user.extra}
        review = self._client.request(
            "POST",
            SUBJECTACCESSREVIEWS.path(),
            body={
                "apiVersion": SUBJECTACCESSREVIEWS.api_version,
                "kind": SUBJECTACCESSREVIEWS.kind,
                "spec": spec,
            },
        )
        status = review.get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        self.accesses.put(key, allowed, self._allow_ttl if allowed else self._deny_ttl)
        return allowed
