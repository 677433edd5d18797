"""Lease-based leader election, so that of several operator replicas exactly one reconciles at a time.

The Python client's own leader election is unusable here (ConfigMap lock only, wall-clock expiry, no
release, exits the process on bad configuration), so this is a small reimplementation of client-go's
`tools/leaderelection` on a coordination.k8s.io/v1 Lease:

- Expiry is judged only on the local monotonic clock, from the moment this process last saw the
  lease record change. Timestamps inside the Lease come from other machines' clocks and are written
  for humans; trusting them would let clock skew hand the lease to two replicas.
- Every write is a PUT carrying the resourceVersion that was read, so of two replicas racing for an
  expired lease one wins and the other gets 409 Conflict.
- Renewing keeps `acquireTime`; taking over increments `leaseTransitions`. Releasing writes an empty
  holder with `leaseDurationSeconds: 1`, so a standby takes over at once instead of after a full lease.
- A leader that cannot renew within `renew_deadline` of its last successful renewal stops leading
  (and `renew_deadline < lease_duration`, so it stops before any standby may take over).

There is no fencing: two replicas can briefly both believe they lead, so every write the controller
makes must still be conditional (resourceVersion or UID preconditions) and idempotent.

`try_acquire_or_renew` is the single step the loops repeat; tests drive it directly on a `FakeClock`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from controller.runtime.clock import Clock, parse_time, rfc3339_micro
from controller.runtime.errors import KubeError, NotFound
from controller.runtime.resource import LEASES, Resource

logger = logging.getLogger(__name__)

# client-go's JitterFactor: acquisition retries wait retry_period * [1, 1 + JITTER_FACTOR).
JITTER_FACTOR: Final = 1.2
LEASE_API_VERSION: Final = "coordination.k8s.io/v1"

JsonObject = dict[str, Any]


class LeaseClient(Protocol):
    """The part of `client.KubeClient` the lease lock uses."""

    def get(self, res: Resource, ns: str | None, name: str) -> JsonObject: ...

    def create(self, res: Resource, ns: str | None, body: JsonObject) -> JsonObject: ...

    def replace(self, res: Resource, ns: str | None, name: str, body: JsonObject) -> JsonObject: ...


@dataclass(frozen=True)
class LeaderElectionRecord:
    """What a Lease's spec says about leadership (client-go's LeaderElectionRecord)."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    leader_transitions: int

    def to_lease_spec(self) -> JsonObject:
        spec: JsonObject = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.leader_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = rfc3339_micro(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = rfc3339_micro(self.renew_time)
        return spec

    @classmethod
    def claim(cls, holder: str, lease_duration_seconds: int, now: datetime) -> LeaderElectionRecord:
        """A record of `holder` taking the lease now (an empty holder gives it up)."""
        return cls(holder, lease_duration_seconds, acquire_time=now, renew_time=now, leader_transitions=0)

    @classmethod
    def from_lease(cls, lease: JsonObject) -> LeaderElectionRecord:
        spec = lease.get("spec") or {}
        acquire_time = spec.get("acquireTime")
        renew_time = spec.get("renewTime")
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=parse_time(acquire_time) if acquire_time else None,
            renew_time=parse_time(renew_time) if renew_time else None,
            leader_transitions=int(spec.get("leaseTransitions") or 0),
        )


class LeaseLock:
    """Reads and conditionally writes one Lease object."""

    def __init__(self, client: LeaseClient, namespace: str, name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.name = name
        # The last Lease read or written: updates keep its metadata (labels, annotations, owners).
        self._last_lease: JsonObject | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def get(self) -> tuple[LeaderElectionRecord, str, JsonObject] | None:
        """The record, the resourceVersion it was read at and the raw Lease; None if there is no Lease."""
        try:
            lease = self._client.get(LEASES, self.namespace, self.name)
        except NotFound:
            return None
        self._last_lease = lease
        return LeaderElectionRecord.from_lease(lease), _resource_version(lease), lease

    def create(self, record: LeaderElectionRecord) -> str:
        """Creates the Lease holding `record`; returns its resourceVersion. AlreadyExists on a race."""
        body: JsonObject = {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_lease_spec(),
        }
        created = self._client.create(LEASES, self.namespace, body)
        self._last_lease = created
        return _resource_version(created)

    def update(self, record: LeaderElectionRecord, resource_version: str) -> str:
        """Replaces the Lease's spec, only if it is still at `resource_version` (else Conflict)."""
        metadata: JsonObject = {"name": self.name, "namespace": self.namespace}
        if self._last_lease is not None:
            metadata = copy.deepcopy(self._last_lease.get("metadata") or metadata)
            metadata.pop("managedFields", None)
        metadata["resourceVersion"] = resource_version
        body: JsonObject = {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.to_lease_spec(),
        }
        replaced = self._client.replace(LEASES, self.namespace, self.name, body)
        self._last_lease = replaced
        return _resource_version(replaced)


def _resource_version(lease: JsonObject) -> str:
    return str((lease.get("metadata") or {}).get("resourceVersion") or "")


def _check_timings(identity: str, lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    if not identity:
        raise ValueError("leader election identity must not be empty")
    if lease_duration <= renew_deadline:
        raise ValueError("lease_duration must be greater than renew_deadline")
    if renew_deadline <= JITTER_FACTOR * retry_period:
        raise ValueError(f"renew_deadline must be greater than {JITTER_FACTOR} * retry_period")
    if retry_period <= 0:
        raise ValueError("retry_period must be positive")


class LeaderElector:
    """Competes for a LeaseLock and, while holding it, renews it every `retry_period` seconds.

    Callbacks run on the thread that calls `run` and must return promptly: `on_started_leading()`
    should start the workers, `on_stopped_leading()` should stop them (it runs before the lease is
    released). `on_new_leader(identity)` is told about every newly observed non-empty holder.
    Unlike client-go, `on_stopped_leading` is called only if leadership was actually acquired.
    """

    def __init__(
        self,
        lock: LeaseLock,
        identity: str,
        clock: Clock,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        release_on_cancel: bool = True,
        jitter: Callable[[], float] | None = None,
    ) -> None:
        _check_timings(identity, lease_duration, renew_deadline, retry_period)
        self.lock = lock
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._release_on_cancel = release_on_cancel
        self._jitter = jitter or random.Random().random  # noqa: S311 - retry jitter, not cryptography

        # Serialises the steps that talk to the API server (the run thread and an outside `release`).
        self._step_lock = threading.Lock()
        # Guards the observed state below, read by `is_leader` from any thread.
        self._state_lock = threading.Lock()
        self._observed_record: LeaderElectionRecord | None = None
        self._observed_resource_version = ""
        self._observed_at = 0.0
        self._last_renewed_at = 0.0
        self._leading = False
        self._reported_leader = ""

    # --- state ------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this process leads: it won or renewed the lease and has not lost or released it."""
        with self._state_lock:
            return self._leading and self._holds_observed_lease_locked()

    def observed_record(self) -> LeaderElectionRecord | None:
        """The lease record as last seen or written by this elector."""
        with self._state_lock:
            return self._observed_record

    def _holds_observed_lease_locked(self) -> bool:
        return self._observed_record is not None and self._observed_record.holder_identity == self.identity

    def _observed_lease_valid_locked(self, now: float) -> bool:
        if self._observed_record is None:
            return False
        return self._observed_at + self._observed_record.lease_duration_seconds > now

    def _observe(self, record: LeaderElectionRecord, resource_version: str) -> None:
        """Remembers `record`; the expiry countdown restarts only if it differs from what was seen."""
        with self._state_lock:
            if record != self._observed_record:
                self._observed_record = record
                self._observed_at = self._clock.monotonic()
            self._observed_resource_version = resource_version

    def _record_win(
        self, record: LeaderElectionRecord, resource_version: str, attempt_started: float
    ) -> None:
        with self._state_lock:
            self._observed_record = record
            self._observed_at = self._clock.monotonic()
            self._observed_resource_version = resource_version
            # The renew deadline counts from when the winning attempt began: the server wrote the
            # lease no earlier than that, so the deadline never runs later than the lease itself.
            self._last_renewed_at = attempt_started
            self._leading = True

    # --- the single step --------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt to create, take over or renew the lease; True if this process now holds it."""
        with self._step_lock:
            acquired = self._try_acquire_or_renew_locked()
        self._report_new_leader()
        return acquired

    def _try_acquire_or_renew_locked(self) -> bool:
        attempt_started = self._clock.monotonic()
        desired = LeaderElectionRecord.claim(self.identity, int(self.lease_duration), self._clock.now())
        return self._try_fast_renew(desired, attempt_started) or self._try_read_then_write(
            desired, attempt_started
        )

    def _try_fast_renew(self, desired: LeaderElectionRecord, attempt_started: float) -> bool:
        """A leader whose lease is still valid renews against the version it last wrote, without a GET."""
        with self._state_lock:
            observed = self._observed_record
            resource_version = self._observed_resource_version
            renewable = self._holds_observed_lease_locked() and self._observed_lease_valid_locked(
                self._clock.monotonic()
            )
        if not renewable or observed is None:
            return False
        renewal = dataclasses.replace(
            desired, acquire_time=observed.acquire_time, leader_transitions=observed.leader_transitions
        )
        try:
            self._record_win(renewal, self.lock.update(renewal, resource_version), attempt_started)
        except KubeError as exc:
            logger.info("optimistic lease renewal failed, reading the lease: %s", exc)
            return False
        return True

    def _try_read_then_write(self, desired: LeaderElectionRecord, attempt_started: float) -> bool:
        """Reads the lease, then creates it, takes it over (expired or released) or renews it."""
        try:
            current = self.lock.get()
        except KubeError as exc:
            logger.warning("cannot read lease %s: %s", self.lock.describe(), exc)
            return False
        if current is None:
            try:
                self._record_win(desired, self.lock.create(desired), attempt_started)
            except KubeError as exc:
                logger.warning("cannot create lease %s: %s", self.lock.describe(), exc)
                return False
            return True

        record, resource_version, _ = current
        self._observe(record, resource_version)
        with self._state_lock:
            held_by_us = self._holds_observed_lease_locked()
            valid = self._observed_lease_valid_locked(self._clock.monotonic())
        if record.holder_identity and valid and not held_by_us:
            logger.debug("lease %s is held by %s", self.lock.describe(), record.holder_identity)
            return False

        if held_by_us:
            desired = dataclasses.replace(
                desired, acquire_time=record.acquire_time, leader_transitions=record.leader_transitions
            )
        else:
            desired = dataclasses.replace(desired, leader_transitions=record.leader_transitions + 1)
        try:
            self._record_win(desired, self.lock.update(desired, resource_version), attempt_started)
        except KubeError as exc:
            logger.info("cannot update lease %s: %s", self.lock.describe(), exc)
            return False
        return True

    def _report_new_leader(self) -> None:
        with self._state_lock:
            holder = self._observed_record.holder_identity if self._observed_record else ""
            if not holder or holder == self._reported_leader:
                return
            self._reported_leader = holder
        logger.info("new leader for lease %s: %s", self.lock.describe(), holder)
        if self._on_new_leader is not None:
            self._on_new_leader(holder)

    # --- release ----------------------------------------------------------------------------------

    def release(self) -> bool:
        """Gives the lease up (empty holder, 1 s duration) if this process holds it; False if that failed.

        `run` calls this itself on the way out; call it directly only when not using `run` (a running
        renew loop would simply take the freed lease back).
        """
        with self._step_lock:
            with self._state_lock:
                self._leading = False
                observed = self._observed_record
                resource_version = self._observed_resource_version
                if observed is None or not self._holds_observed_lease_locked():
                    return True
            released = dataclasses.replace(
                LeaderElectionRecord.claim("", 1, self._clock.now()),
                leader_transitions=observed.leader_transitions,
            )
            try:
                new_version = self.lock.update(released, resource_version)
            except KubeError as exc:
                logger.warning("cannot release lease %s: %s", self.lock.describe(), exc)
                return False
            self._observe(released, new_version)
            logger.info("released lease %s", self.lock.describe())
            return True

    # --- loops ------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Acquires the lease, leads until it is lost or `stop` is set, then stops leading and releases.

        Returns without calling any callback if `stop` is set before the lease was acquired.
        """
        if not self.acquire(stop):
            return
        logger.info("acquired lease %s as %s", self.lock.describe(), self.identity)
        try:
            if self._on_started_leading is not None:
                self._on_started_leading()
            self.renew(stop)
        finally:
            with self._state_lock:
                self._leading = False
            try:
                if self._on_stopped_leading is not None:
                    self._on_stopped_leading()
            finally:
                if self._release_on_cancel:
                    self.release()

    def acquire(self, stop: threading.Event) -> bool:
        """Retries every jittered `retry_period` until the lease is acquired (True) or `stop` is set."""
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            stop.wait(self.retry_period * (1.0 + self._jitter() * JITTER_FACTOR))
        return False

    def renew(self, stop: threading.Event) -> None:
        """Renews every `retry_period` until `stop` is set or no renewal succeeds within `renew_deadline`.

        The deadline runs on the injected clock from the start of the last successful renewal; the pauses
        between attempts are real waits on `stop`, so a stop request is noticed at once.
        """
        while not stop.wait(self.retry_period):
            while not self.try_acquire_or_renew():
                with self._state_lock:
                    deadline = self._last_renewed_at + self.renew_deadline
                if self._clock.monotonic() >= deadline:
                    logger.error(
                        "failed to renew lease %s within %.1f s: stopping leading",
                        self.lock.describe(),
                        self.renew_deadline,
                    )
                    return
                if stop.wait(self.retry_period):
                    return
