"""Expectations: what a reconcile is still waiting to see in the cache after its own writes.

The informer cache lags the controller's writes, and the controller's own status PATCH re-queues the
job at once. A reconcile that trusted the cache blindly would re-create a Pod it just created, count
a failure twice, or publish status that goes backwards. kube-controller-manager guards against this
with ControllerExpectations / UIDTrackingControllerExpectations; this is the same idea, per job key:

- before creating objects, `expect_creates(key, names)`; each `created(key, name)` (the informer saw
  the object, or the create answered 409 AlreadyExists, or failed so it will never appear) lowers it;
- before deleting objects, `expect_deletes(key, uids)`; each `deleted(key, uid)` (the informer saw the
  delete, or it answered 404, or failed) lowers it;
- `satisfied(key)` says whether the cache can be trusted for that job: nothing pending, no record at
  all, or a record older than the TTL (a lost watch event must not wedge a job forever).

A reconcile that `satisfied` turned away leaves its job to the informer event that fulfils the
record: `created` and `deleted` then say `Seen.AWAITED`, so that event can be put ahead of other
work (as StatusWrites does for a status write), instead of waiting behind the first reconciles of
every newer job.

Pending creates are tracked by name and deletes by UID, so observing the same object twice (informer
event and API answer) lowers the expectation once. Unlike upstream, a second `expect_*` call while the
record is live adds to it instead of replacing it, so a reconcile that both creates and deletes keeps
both; a call on an expired record starts a fresh one.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.runtime.clock import Clock

EXPECTATIONS_TTL_SECONDS = 300.0


class Seen(enum.IntEnum):
    """What observing one object did to its job's expectations (falsy when it was not expected)."""

    UNEXPECTED = 0
    EXPECTED = 1  # lowered one expectation
    AWAITED = 2  # lowered the last one of a record a reconcile was turned away for


@dataclass(frozen=True)
class PendingExpectations:
    """A snapshot of one job's unfulfilled expectations, for logs and tests."""

    creates: frozenset[str]
    deletes: frozenset[str]
    age_seconds: float
    expired: bool


@dataclass
class _Record:
    set_at: float
    creates: set[str] = field(default_factory=set)
    deletes: set[str] = field(default_factory=set)
    awaited: bool = False  # `satisfied` turned a reconcile away

    def fulfilled(self) -> bool:
        return not self.creates and not self.deletes


class Expectations:
    """Thread-safe per-job expectations; the TTL is judged on the injected monotonic clock."""

    def __init__(self, clock: Clock, ttl: float = EXPECTATIONS_TTL_SECONDS) -> None:
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}

    def expect_creates(self, key: str, names: Iterable[str]) -> None:
        """Records that objects named `names` are about to be created for job `key`."""
        with self._lock:
            record = self._live_record_locked(key)
            record.creates.update(names)
            self._drop_if_fulfilled_locked(key, record)

    def expect_deletes(self, key: str, uids: Iterable[str]) -> None:
        """Records that objects with `uids` are about to be deleted for job `key`."""
        with self._lock:
            record = self._live_record_locked(key)
            record.deletes.update(uids)
            self._drop_if_fulfilled_locked(key, record)

    def created(self, key: str, name: str) -> Seen:
        """Lowers the create expectation for `name`, if it was pending."""
        with self._lock:
            record = self._records.get(key)
            if record is None or name not in record.creates:
                return Seen.UNEXPECTED
            record.creates.discard(name)
            return self._drop_if_fulfilled_locked(key, record)

    def deleted(self, key: str, uid: str) -> Seen:
        """Lowers the delete expectation for `uid`, if it was pending."""
        with self._lock:
            record = self._records.get(key)
            if record is None or uid not in record.deletes:
                return Seen.UNEXPECTED
            record.deletes.discard(uid)
            return self._drop_if_fulfilled_locked(key, record)

    def satisfied(self, key: str) -> bool:
        """True when the cache can be trusted for `key`: no record, nothing pending, or record expired.
        False marks the record awaited: the caller waits for the events that fulfil it."""
        with self._lock:
            record = self._records.get(key)
            if record is None or record.fulfilled() or self._expired_locked(record):
                return True
            record.awaited = True
            return False

    def forget(self, key: str) -> None:
        """Drops everything recorded for `key` (the job was deleted)."""
        with self._lock:
            self._records.pop(key, None)

    def pending(self, key: str) -> PendingExpectations | None:
        """What `key` is still waiting for, or None if nothing is recorded."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return None
            return PendingExpectations(
                creates=frozenset(record.creates),
                deletes=frozenset(record.deletes),
                age_seconds=self._clock.monotonic() - record.set_at,
                expired=self._expired_locked(record),
            )

    def _live_record_locked(self, key: str) -> _Record:
        record = self._records.get(key)
        if record is None or self._expired_locked(record):
            record = _Record(set_at=self._clock.monotonic())
            self._records[key] = record
        else:
            record.set_at = self._clock.monotonic()
        return record

    def _expired_locked(self, record: _Record) -> bool:
        return self._clock.monotonic() - record.set_at > self._ttl

    def _drop_if_fulfilled_locked(self, key: str, record: _Record) -> Seen:
        if not record.fulfilled():
            return Seen.EXPECTED
        del self._records[key]
        return Seen.AWAITED if record.awaited else Seen.EXPECTED
