"""trainingjob_progress.wait_for_name: the retry of a name lookup that xgboost's collective lacks (a pod
of the job may start before rank 0's name resolves), against the real resolver and a scripted one."""

from __future__ import annotations

import logging
import socket

import pytest
import trainingjob_progress as tp


class Resolver:
    """Fails with the resolver's error for the first `failures` lookups, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures, self.lookups = failures, 0

    def __call__(self, host: str) -> str:
        self.lookups += 1
        if self.lookups <= self.failures:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return "10.0.0.1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_name_that_resolves_returns_at_once() -> None:
    tp.wait_for_name("localhost", timeout=5)


def test_a_lookup_that_fails_is_retried_until_the_name_resolves(caplog: pytest.LogCaptureFixture) -> None:
    resolver, clock = Resolver(failures=3), Clock()
    with caplog.at_level(logging.INFO, logger="trainingjob_progress"):
        tp.wait_for_name(
            "job-master", timeout=10, interval=0.5, resolve=resolver, clock=clock, sleep=clock.sleep
        )
    assert resolver.lookups == 4
    assert clock.now == 1.5
    assert [r.getMessage() for r in caplog.records] == [
        "waiting for job-master to resolve ([Errno -2] Name or service not known)"
    ]


def test_a_name_that_never_resolves_raises_after_the_timeout_naming_the_host() -> None:
    resolver, clock = Resolver(failures=1000), Clock()
    with pytest.raises(TimeoutError, match=r"^job-master did not resolve within 2 s: "):
        tp.wait_for_name(
            "job-master", timeout=2, interval=0.5, resolve=resolver, clock=clock, sleep=clock.sleep
        )
    assert resolver.lookups == 5  # at 0, 0.5, 1, 1.5 and 2 s


def test_the_real_resolver_fails_for_a_reserved_name_and_the_error_says_so() -> None:
    with pytest.raises(TimeoutError, match=r"^no-such-host\.invalid did not resolve within 0 s"):
        tp.wait_for_name("no-such-host.invalid", timeout=0)
