"""Following one TrainingJob through the Kubernetes API: a list, then a watch, and again after any break.

The supervisor of an in-place restart (supervise) must see the operator's order
(status.inPlaceRestart) within milliseconds, without polling: a 1,024-pod gang polling its job would
load the API server more than the restart saves. So it lists its job once (for the resourceVersion)
and watches from there with bookmarks; a watch that ends, breaks or is refused (410 Gone: the
version is too old) starts over with a list, after a short capped backoff when it keeps failing. It
hands every version of the job it sees (or GONE when the job is deleted) to a callback and knows
nothing of what the supervisor does with it.

Standard library only, Python 3.9 or later; HTTP through transport.open_api (the rotating token, the
CA, no proxies, timeouts), like the progress reports.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final

from .base import DEFAULT_TIMEOUT, MAX_RESPONSE_BYTES, OnceLogger, log
from .supervision import GONE, JobView, parse_job, watch_event
from .transport import ApiAccess, open_api, status_message

GROUP_VERSION: Final = "ml.example.com/v1"
# The API server ends a watch after timeoutSeconds (picked at random in this range so a gang's
# watches do not all end together); the read timeout is longer, so a connection that went silent
# (a half-open one) is given up too.
WATCH_SECONDS: Final = (240, 300)
WATCH_READ_SLACK: Final = 30.0
# A watch that lasted this long, or delivered an event, was healthy: the backoff starts over.
HEALTHY_WATCH: Final = 10.0
FIRST_BACKOFF: Final = 0.1
MAX_BACKOFF: Final = 3.0
MAX_EVENT_BYTES: Final = 4 * MAX_RESPONSE_BYTES


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def backoff(failures: int) -> float:
    """Seconds to wait before the next list after `failures` failed rounds in a row."""
    if failures <= 0:
        return 0.0
    return float(min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF))


class JobWatch:
    """Lists and watches the TrainingJob `name` in `namespace`, calling `on_job` with each version."""

    def __init__(
        self,
        *,
        access: ApiAccess,
        namespace: str,
        name: str,
        on_job: Callable[[JobView], None],
        once: OnceLogger,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        quote = urllib.parse.quote
        self._collection = (
            f"{access.url.rstrip('/')}/apis/{GROUP_VERSION}/namespaces/{quote(namespace, safe='')}"
            "/trainingjobs"
        )
        self._selector = f"metadata.name={name}"
        self._access = access
        self._on_job = on_job
        self._once = once
        self._timeout = timeout
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="trainingjob-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the loop at its next step (a watch in progress is left to the daemon thread)."""
        self._stopped.set()

    def run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                version = self.list_job()
                healthy = self.watch_job(version)
                failures = 0 if healthy or time.monotonic() - started >= HEALTHY_WATCH else failures + 1
            except Expired:
                log.info("the watch of the job expired (410 Gone): listing it again")
                failures = 1  # at once, nearly: a list that keeps expiring must not spin
            except Exception as error:
                failures += 1
                self._warn(error)
            self._stopped.wait(backoff(failures))

    def list_job(self) -> str:
        """Hands over the job as it is now (GONE when there is none); returns the list's version."""
        query = {"fieldSelector": self._selector}
        try:
            found = self._get(query, self._timeout)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                self._on_job(GONE)
            raise
        items = found.get("items")
        if not isinstance(items, list):
            raise ValueError("the list of TrainingJobs has no items")
        matching = [item for item in items if isinstance(item, Mapping)]
        self._on_job(parse_job(matching[0]) if matching else GONE)
        version = _resource_version(found)
        if not version:
            raise ValueError("the list of TrainingJobs has no resourceVersion")
        return version

    def watch_job(self, version: str) -> bool:
        """Follows the job from `version` until the stream ends; True when it delivered an event."""
        low, high = WATCH_SECONDS
        seconds = random.randint(low, high)  # noqa: S311 - spreading timeouts, not a secret
        query = {
            "fieldSelector": self._selector,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        delivered = False
        with open_api(
            f"{self._collection}?{urllib.parse.urlencode(query)}",
            token_path=self._access.token_path,
            ca_path=self._access.ca_path,
            timeout=seconds + WATCH_READ_SLACK,
            once=self._once,
        ) as response:
            while not self._stopped.is_set():
                line = response.readline(MAX_EVENT_BYTES)
                if not line:
                    return delivered
                if not line.strip():
                    continue
                kind, obj = watch_event(line)
                delivered = True
                if kind in ("ADDED", "MODIFIED"):
                    self._on_job(parse_job(obj))
                elif kind == "DELETED":
                    self._on_job(GONE)
                elif kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired
                    raise ValueError(f"watch error: {obj.get('message') or obj.get('reason')}")
        return delivered

    def _get(self, query: Mapping[str, str], timeout: float) -> Mapping[str, Any]:
        url = f"{self._collection}?{urllib.parse.urlencode(query)}"
        with open_api(
            url,
            token_path=self._access.token_path,
            ca_path=self._access.ca_path,
            timeout=timeout,
            once=self._once,
        ) as response:
            body = json.loads(response.read())
        if not isinstance(body, Mapping):
            raise ValueError("the API's answer is not an object")
        return body

    def _warn(self, error: Exception) -> None:
        if isinstance(error, urllib.error.HTTPError):
            detail = f"HTTP {error.code}: {status_message(error)}"
        else:
            reason = getattr(error, "reason", error)
            detail = f"{type(reason).__name__}: {reason}"
        self._once.warning(f"watch:{detail}", "cannot watch the TrainingJob (%s); retrying", detail)


def _resource_version(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    return version if isinstance(version, str) else ""
