"""The fuzz run on the real cluster: apply generated manifests in batches and check the operator's
promises about each one.

Why: issue 15's fuzz run of 1,670 manifests found jobs left without any state, tracebacks, and
status writes the API server refused. This is that run, repeatable (`make fuzz`, tests/fuzz/). For
every batch (a namespace of its own) it creates the manifests through the raw API, then checks, within
a deadline:
- every accepted job has a state, a blocked condition (Created=False, FailedCreate) or Failed with a
  reason and a message, and at least one Event (tests/fuzz/judge.py);
- the operator is alive, /readyz and /healthz answer 200;
- its log has no traceback and no ERROR line, except the justified ones;
- its writes (rest_client_requests_total, POST/PUT/PATCH/DELETE) stay within a budget per job;
- the canary job created before the first batch is still Running.
At the end a second canary must reach Running: the watch still works. Every violation is kept with
its manifest; tests/fuzz/shrink.py then reduces each kind of violation to a minimal manifest.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.operator import OperatorProcess
from tests.fuzz.cluster_api import ApiServer
from tests.fuzz.judge import Outcome, events_by_uid, judge_job, log_problems, refusal_layer, write_budget
from tests.fuzz.manifests import Generated, root_schema
from tests.fuzz.mutations import Manifest
from tests.fuzz.watch import OperatorWatch, wait_until

JsonDict = dict[str, Any]
CANARY_SPEC: JsonDict = {"model": "cnn", "dataset": "mnist", "numWorkers": 1, "gpusPerWorker": 0}
# Log lines that are the operator doing its job, not a fault (none so far).
JUSTIFIED_LOG_LINES: tuple[str, ...] = ()
CREATE_THREADS = 8
# How long the writes caused by one manifest are watched after its outcome (shrinking, regressions).
WRITE_WINDOW = 30.0


@dataclass(frozen=True)
class Violation:
    kind: str
    namespace: str
    name: str
    detail: str
    manifest: Manifest | None = None
    mutations: tuple[str, ...] = ()

    def line(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}: {self.detail}"


@dataclass
class Accepted:
    name: str
    uid: str
    generated: Generated


@dataclass
class Report:
    generated: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    writes: float = 0.0
    seconds: float = 0.0

    def summary(self, seed: int) -> str:
        def listed(counter: Counter[str]) -> str:
            return ",".join(f"{key}={count}" for key, count in sorted(counter.items())) or "-"

        kinds = Counter(violation.kind for violation in self.violations)
        per_job = self.writes / self.accepted if self.accepted else 0.0
        return (
            f"fuzz: seed={seed} generated={self.generated} accepted={self.accepted} "
            f"refused[{listed(self.refused)}] outcomes[{listed(self.outcomes)}] "
            f"violations={len(self.violations)}[{listed(kinds)}] writes/job={per_job:.1f} "
            f"seconds={self.seconds:.0f}"
        )


def unique_names(items: Sequence[Generated]) -> list[str]:
    """The name each manifest is created with: its own, unless an earlier one in the batch has it
    (then `-<index>` is appended, so no create is refused as a mere name clash)."""
    seen: set[str] = set()
    names = []
    for index, item in enumerate(items):
        name = str((item.manifest.get("metadata") or {}).get("name", ""))
        if name in seen:
            name = f"{name}-{index}"
        seen.add(name)
        names.append(name)
    return names


def _encode(manifest: Manifest) -> bytes:
    return json.dumps(manifest).encode()


class FuzzRun:
    """One fuzz run against one operator; `run(items)` returns the report."""

    def __init__(
        self,
        api: ApiServer,
        operator: OperatorProcess,
        *,
        batch_size: int = 50,
        deadline: float = 90.0,
        progress: Callable[[str], None] = print,
    ) -> None:
        self.api = api
        self.operator = operator
        self.batch_size = batch_size
        self.deadline = deadline
        self.progress = progress
        self.prefix = f"fz-{uuid.uuid4().hex[:5]}"
        self.root = root_schema()
        self.report = Report()
        self.watch = OperatorWatch(operator)
        self._singles = 0

    # ---------------------------------------------------------------------------------- the run

    def run(self, items: Sequence[Generated]) -> Report:
        started = time.monotonic()
        canary_ns = f"{self.prefix}-canary"
        self.api.create_namespace(canary_ns)
        try:
            self._canary(canary_ns, "canary-first")
            for first in range(0, len(items), self.batch_size):
                batch = items[first : first + self.batch_size]
                self._batch(first // self.batch_size, batch)
                self._check_operator(canary_ns, f"after batch {first // self.batch_size}")
                self.progress(
                    f"fuzz: {min(first + self.batch_size, len(items))}/{len(items)} manifests, "
                    f"{self.report.accepted} accepted, {len(self.report.violations)} violations"
                )
            self._canary(canary_ns, "canary-last")
        finally:
            self._clean_up(canary_ns)
        self.report.seconds = time.monotonic() - started
        return self.report

    def _canary(self, namespace: str, name: str) -> None:
        manifest = {
            "apiVersion": "ml.example.com/v1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": CANARY_SPEC,
        }
        status, answer = self.api.create_job(namespace, _encode(manifest))
        if status != 201:
            raise RuntimeError(f"canary {name} refused: HTTP {status}: {answer.get('message')}")
        if not wait_until(lambda: self._state(namespace, name) == "Running", self.deadline):
            self._violate("canary", namespace, name, f"not Running within {self.deadline:.0f}s")

    def _state(self, namespace: str, name: str) -> str | None:
        job = self.api.job(namespace, name)
        return None if job is None else (job.get("status") or {}).get("state")

    def _check_operator(self, canary_ns: str, when: str) -> None:
        for problem in self.watch.health_problems(when):
            self._violate("operator", "", "", problem)
        state = self._state(canary_ns, "canary-first")
        if state != "Running":
            self._violate("canary", canary_ns, "canary-first", f"state {state} {when}")

    # -------------------------------------------------------------------------------- one batch

    def _batch(self, index: int, items: Sequence[Generated]) -> None:
        namespace = f"{self.prefix}-b{index}"
        self.api.create_namespace(namespace)
        writes_before = self.watch.quiet_writes()
        self.watch.skip_logs()
        try:
            accepted = self._create_all(namespace, items)
            self._judge_all(namespace, accepted)
            entries = self.watch.read_logs()
            self._check_logs(namespace, accepted, entries)
            writes = self.watch.job_writes() - writes_before
            self.report.writes += writes
            budget = write_budget(item.generated.manifest for item in accepted)
            if writes > budget:
                self._blame_writes(
                    namespace,
                    accepted,
                    entries,
                    f"{writes:.0f} writes for {len(accepted)} jobs (budget {budget})",
                )
        finally:
            self._clean_up(namespace)

    def _clean_up(self, namespace: str) -> None:
        """Deletes the jobs first, then the namespace: a job left in a terminating namespace would be
        reconciled until the namespace controller gets to it, every create refused as the namespace is
        terminating, and those writes would count against the next batch."""
        self.api.delete_jobs(namespace)
        wait_until(lambda: not self.api.jobs(namespace), self.deadline)
        self.api.delete_namespace(namespace)

    def _create_all(self, namespace: str, items: Sequence[Generated]) -> list[Accepted]:
        names = unique_names(items)

        def create(position: int) -> tuple[int, JsonDict]:
            manifest = dict(items[position].manifest)
            manifest["metadata"] = {**(manifest.get("metadata") or {}), "name": names[position]}
            return self.api.create_job(namespace, _encode(manifest))

        with ThreadPoolExecutor(max_workers=CREATE_THREADS, thread_name_prefix="fuzz-create") as pool:
            answers = list(pool.map(create, range(len(items))))
        accepted = []
        for position, (status, answer) in enumerate(answers):
            self.report.generated += 1
            if status == 201:
                uid = str(answer.get("metadata", {}).get("uid", ""))
                accepted.append(Accepted(str(answer["metadata"]["name"]), uid, items[position]))
                self.report.accepted += 1
            else:
                self.report.refused[refusal_layer(status, answer, self.root)] += 1
        return accepted

    def _judge(self, namespace: str, accepted: Sequence[Accepted]) -> dict[str, Outcome]:
        jobs = {str(job["metadata"]["uid"]): job for job in self.api.jobs(namespace)}
        events = events_by_uid(self.api.events(namespace))
        return {item.uid: judge_job(jobs.get(item.uid), events.get(item.uid, [])) for item in accepted}

    def _judge_all(self, namespace: str, accepted: Sequence[Accepted]) -> None:
        outcomes: dict[str, Outcome] = {}

        def settled() -> bool:
            outcomes.update(self._judge(namespace, accepted))
            return all(outcome.problem is None for outcome in outcomes.values())

        wait_until(settled, self.deadline)
        for item in accepted:
            outcome = outcomes[item.uid]
            self.report.outcomes[outcome.label] += 1
            if outcome.problem is not None:
                self._violate("no-outcome", namespace, item.name, outcome.problem, item.generated)

    def _blame_writes(
        self, namespace: str, accepted: Sequence[Accepted], entries: Sequence[JsonDict], detail: str
    ) -> None:
        """A batch over its write budget: the jobs whose own log lines (one per create, failed create,
        patch or retry) exceed their budget get the violation, else the batch does."""
        lines = Counter(str(e.get("name")) for e in entries if e.get("namespace") == namespace)
        blamed = [item for item in accepted if lines[item.name] > write_budget([item.generated.manifest])]
        for item in blamed:
            self._violate(
                "write-budget",
                namespace,
                item.name,
                f"{lines[item.name]} log lines; {detail}",
                item.generated,
            )
        if not blamed:
            self._violate("write-budget", namespace, "", detail)

    def _check_logs(self, namespace: str, accepted: Sequence[Accepted], entries: Sequence[JsonDict]) -> None:
        by_name = {item.name: item for item in accepted}
        for problem in log_problems(entries, JUSTIFIED_LOG_LINES):
            item = by_name.get(problem.name) if problem.namespace == namespace else None
            self._violate(
                "log-error",
                problem.namespace,
                problem.name,
                problem.message,
                item.generated if item else None,
            )

    # ------------------------------------------------------------------------- one manifest alone

    def violations_of(self, manifest: Manifest, deadline: float, kind: str) -> set[str]:
        """The kinds of violation one manifest causes on its own (what the shrinker asks, about `kind`)."""
        watch = WRITE_WINDOW if kind == "write-budget" else 0.0
        return self.check_alone(manifest, deadline, watch_writes=watch)[1]

    def check_alone(
        self, manifest: Manifest, deadline: float, *, watch_writes: float = 0.0
    ) -> tuple[bool, set[str]]:
        """Whether the API server accepts the manifest, and the kinds of violation it causes, alone in
        a namespace of its own. A refused manifest causes none. With `watch_writes`, the operator's
        writes are watched that long after the outcome: a retry loop shows only over time."""
        self._singles += 1
        namespace = f"{self.prefix}-s{self._singles}"
        self.api.create_namespace(namespace)
        writes_before = self.watch.quiet_writes()
        self.watch.skip_logs()
        try:
            status, answer = self.api.create_job(namespace, _encode(manifest))
            if status != 201:
                return False, set()
            uid = str(answer["metadata"]["uid"])
            name = str(answer["metadata"]["name"])

            def settled() -> bool:
                job = self.api.job(namespace, name)
                events = events_by_uid(self.api.events(namespace)).get(uid, [])
                return judge_job(job, events).problem is None

            kinds = set() if wait_until(settled, deadline) else {"no-outcome"}
            budget = write_budget([manifest])

            def over_budget() -> bool:
                return self.watch.job_writes() - writes_before > budget

            if wait_until(over_budget, watch_writes):
                kinds.add("write-budget")
            problems = log_problems(self.watch.read_logs(), JUSTIFIED_LOG_LINES)
            if any(p.namespace == namespace for p in problems):
                kinds.add("log-error")
            return True, kinds
        finally:
            self._clean_up(namespace)

    # ------------------------------------------------------------------------------------ helpers

    def _violate(
        self, kind: str, namespace: str, name: str, detail: str, generated: Generated | None = None
    ) -> None:
        violation = Violation(
            kind,
            namespace,
            name,
            detail,
            generated.manifest if generated else None,
            generated.mutations if generated else (),
        )
        self.report.violations.append(violation)
        self.progress(f"fuzz: VIOLATION {violation.line()}")
