"""One soak: a cluster of its own, the operator, the churn for a bounded time, samples, the verdict."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.clock import parse_time
from controller.runtime.errors import KubeError
from testbed.common import JsonDict, Say, ToolError, wait_until
from testbed.harness.base import HarnessCluster
from testbed.harness.bench.operator import Operator
from testbed.harness.soak.analysis import Sample, level_off, summary
from testbed.harness.soak.churn import NAMESPACE, Churn
from testbed.harness.soak.options import Options

say = Say("soak")
TICK_SECONDS = 2.0


@dataclass
class Soak:
    options: Options
    samples: list[Sample] = field(default_factory=list)
    _operator: Operator | None = None
    cluster: HarnessCluster = field(init=False)

    def __post_init__(self) -> None:
        self.cluster = HarnessCluster("soak", self.options.dev_dir, say)

    @property
    def client(self) -> KubeClient:
        return self.cluster.client

    @property
    def operator(self) -> Operator:
        if self._operator is None:
            raise ToolError("the operator is not started")
        return self._operator

    def run(self) -> JsonDict:
        load = os.getloadavg()[0]
        self.up()
        churn = Churn(self.client, self.options.jobs, self.options.seed)
        started = time.monotonic()
        next_sample = started
        while (elapsed := time.monotonic() - started) < self.options.seconds:
            self.operator.check_alive()
            try:
                churn.tick()
            except KubeError as error:
                say(f"a tick failed: {error}")
            if time.monotonic() >= next_sample:
                proc = self.operator.sample()
                self.samples.append(Sample(elapsed, proc.rss_mb, proc.cpu_seconds, churn.counts["created"]))
                say(
                    f"{elapsed:5.0f}s: RSS {proc.rss_mb:.1f} MB, CPU {proc.cpu_seconds:.1f} s, "
                    + ", ".join(f"{key} {value}" for key, value in sorted(churn.counts.items()))
                )
                next_sample += self.options.sample_every
            time.sleep(TICK_SECONDS)
        verdict = level_off(self.samples, self.options.tolerance_mb)
        report: JsonDict = {
            "jobs_in_flight": self.options.jobs,
            "churn": dict(churn.counts),
            **summary(self.samples),
            "levelled_off": verdict.levelled_off,
            "rss_median_mb": {
                "earlier": verdict.earlier_mb,
                "later": verdict.later_mb,
                "growth": verdict.growth_mb,
            },
            "tolerance_mb": self.options.tolerance_mb,
            "stuck_terminating": self.stuck_terminating(),
            "load_average": round(load, 2),
            "samples": [
                [round(s.seconds), round(s.rss_mb, 1), round(s.cpu_seconds, 1), s.jobs_created]
                for s in self.samples
            ],
        }
        (self.options.dev_dir / "soak-report.json").write_text(json.dumps(report, indent=2) + "\n")
        return report

    def stuck_terminating(self, older_than: float = 60.0) -> int:
        """Pods still Terminating a minute after their deletion: none may be left held."""
        now = time.time()
        count = 0
        for pod in self.client.list(PODS, NAMESPACE)["items"]:
            stamp = pod["metadata"].get("deletionTimestamp")
            if stamp and now - parse_time(stamp).timestamp() > older_than:
                count += 1
        return count

    def up(self) -> None:
        dev_dir = self.options.dev_dir
        self.cluster.start(NAMESPACE)
        kubeconfig = self.cluster.kubeconfig
        self._operator = Operator(kubeconfig, dev_dir / "operator.log", ("--progress-interval=1s",))
        self.operator.start()
        wait_until("the operator to lead", self.operator.ready, timeout=120, guard=self.operator.check_alive)
        jobs, seconds = self.options.jobs, self.options.seconds
        say(f"the operator runs (pid {self.operator.pid}); churning {jobs} jobs for {seconds:.0f}s")

    def down(self) -> None:
        if self._operator is not None:
            say("stopping the operator")
            self._operator.stop()
        self.cluster.stop()
