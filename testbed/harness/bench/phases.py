"""The bench's run: set-up, the bring-up burst, the steady-state window, the memory phase, tear-down.

Why: the phases share the cluster, the operator and the bench's watches, and their order matters (the
steady state is measured only once the operator has drained its work queue and Event backlog). The
set-up lives in BenchCluster, which `down` always tears down, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from controller.runtime.client import KubeClient
from crd import contract
from testbed.common import JsonDict, ToolError, wait_until
from testbed.harness.base import HarnessCluster, create_namespace
from testbed.harness.bench.cluster import (
    NAMESPACE,
    apiserver_requests,
    count_events,
    counter_delta,
    create_jobs,
    training_jobs,
)
from testbed.harness.bench.clustercost import cluster_cpu, stored_pod_and_job_sizes
from testbed.harness.bench.operator import Operator, say
from testbed.harness.bench.options import GPUS_PER_NODE, Options
from testbed.harness.bench.procfs import busy_cores, component_cpu, component_pids, cpu_pressure, machine_busy
from testbed.harness.bench.profile import Profiler
from testbed.harness.bench.sampler import Sampler
from testbed.harness.bench.targets import targets
from testbed.harness.bench.tracker import Tracker, spread

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class BenchCluster:
    """The throwaway cluster, the bench's client and watches, and the operator under test."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.dev_dir = options.dev_dir
        self.kubeconfig = self.dev_dir / "kubeconfig"
        self.operator = Operator(
            self.kubeconfig, self.dev_dir / "logs" / "operator.log", options.operator_args
        )
        self._tracker: Tracker | None = None
        self.cluster = HarnessCluster("bench", self.dev_dir, say)
        self.kind = training_jobs(options)
        # The operator's leader-election Lease, whose renewals the steady state counts apart (None: it
        # does not elect, and the window is not aligned to renewals).
        self.lease_name: str | None = contract.OPERATOR_NAME

    def up(self) -> None:
        self.start_cluster(self.options.nodes)
        create_namespace(self.client, NAMESPACE)
        self._tracker = Tracker(self.client, contract.OPERATOR_NAME)
        self._tracker.start()

    def stop_earlier_cluster(self) -> None:
        """Stops the bench cluster a run before left in the dev directory, if any: a cluster that
        held 20,000 pods keeps its controllers busy for minutes after its run, and nobody would
        measure on a machine it keeps loaded."""
        say(f"stopping any earlier bench cluster in {self.dev_dir}")
        self.cluster.stop_earlier()

    def start_cluster(self, nodes: int) -> None:
        """A fresh bench cluster of `nodes` kwok nodes (any earlier one in the dev directory is stopped
        first) with the CRD Established, and the bench's client of it."""
        self.cluster.start(
            nodes=nodes, gpus_per_node=GPUS_PER_NODE, pool_size=self.options.create_threads + 8
        )

    def down(self) -> None:
        if self.operator.process is not None:
            say("stopping the operator")
            self.operator.stop()
        if self._tracker is not None:
            self._tracker.stop()
        self.cluster.stop()

    def start_operator(self) -> None:
        say(f"starting {self.operator.name}: {' '.join(self.operator.arguments())}")
        self.operator.start()
        deadline = time.monotonic() + 120
        while True:
            self.operator.check_alive()
            if self.operator.ready():
                break
            if time.monotonic() > deadline:
                raise ToolError(f"{self.operator.name} was not ready after 120s:\n{self.operator.tail()}")
            time.sleep(0.2)
        pid, port = self.operator.pid, self.operator.port
        say(f"{self.operator.name} is ready (pid {pid}, metrics on port {port})")

    @property
    def client(self) -> KubeClient:
        return self.cluster.client

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            raise ToolError("the bench cluster is not up")
        return self._tracker


class Bench(BenchCluster):
    """One run of the phases on a BenchCluster."""

    def progress(self, total_jobs: int, t0: float, sampler: Sampler) -> Callable[[], str]:
        tracker = self.tracker
        last: list[tuple[float, float]] = []

        def line() -> str:
            created, bound, running, jobs_running = tracker.counts()
            sample = self.operator.sample()
            now = time.monotonic()
            cpu = ""
            if last:
                share = (sample.cpu_seconds - last[0][1]) / max(1e-9, now - last[0][0])
                cpu = f" ({100 * share:.0f}% of a core)"
                last.clear()
            last.append((now, sample.cpu_seconds))
            latest = sampler.latest()
            depth = f", queue depth {latest:.0f}" if latest is not None else ""
            pods = total_jobs * self.options.replicas
            return (
                f"t={now - t0:5.1f}s pods {created}/{pods} created, {bound} bound, {running} running; "
                f"jobs Running {jobs_running}/{total_jobs}; operator cpu {sample.cpu_seconds:.1f}s{cpu}, "
                f"rss {sample.rss_mb:.0f} MB{depth}"
            )

        return line

    def bring_up(self, first: int, total_jobs: int) -> JsonDict:
        """Creates jobs [first, total_jobs) and waits until all pods exist and every job is Running."""
        options, tracker = self.options, self.tracker
        names = [f"bench-{index:05d}" for index in range(first, total_jobs)]
        pods = total_jobs * options.replicas
        pids = component_pids(self.dev_dir)
        before_metrics = self.operator.metrics()
        before = self.operator.sample()
        before_components = component_cpu(pids)
        before_machine = machine_busy()
        before_apiserver = apiserver_requests(self.client)
        before_bench = time.process_time()
        profiler = None
        if options.profile and first == 0 and self.operator.samples_python_stacks:
            profiler = Profiler(self.operator.pid, self.dev_dir / "logs" / "operator-profile.folded")
            profiler.start()
        threads = options.create_threads
        kind = self.kind.resource.kind
        sampler = Sampler(lambda: self.operator.metrics("workqueue_depth").queue_depth)
        say(f"creating {len(names)} {kind}s x {options.replicas} replicas ({threads} threads)")
        t0 = time.monotonic()
        sampler.start(t0)
        try:
            created_at = create_jobs(self.client, names, options, self.kind, on_created=tracker.created)
            say(f"{len(names)} creates answered in {created_at - t0:.1f}s")
            wait_until(
                f"{pods} pods and {total_jobs} Running jobs",
                lambda: tracker.counts()[0] >= pods and tracker.counts()[3] >= total_jobs,
                timeout=options.timeout,
                guard=self.operator.check_alive,
                progress=self.progress(total_jobs, t0, sampler),
                say=say,
            )
        finally:
            done_at = time.monotonic()
            sampled = sampler.stop()
            profile = profiler.stop() if profiler is not None else None
        after = self.operator.sample()
        after_machine = machine_busy()
        after_components = component_cpu(pids)
        after_metrics = self.operator.metrics()
        after_apiserver = apiserver_requests(self.client)
        bench_cpu = time.process_time() - before_bench
        say(self.progress(total_jobs, t0, sampler)())

        def since(times: dict[str, float], count: int) -> float | None:
            reached = tracker.reached(times, count)
            return round(reached - t0, 2) if reached is not None else None

        requests = after_metrics.minus(before_metrics)
        operator_cpu = after.cpu_seconds - before.cpu_seconds
        components = {
            name: after_components[name] - before_components[name]
            for name in after_components
            if name in before_components
        }
        return {
            "jobs_created": len(names),
            "seconds_to_all_creates_answered": round(created_at - t0, 2),
            "seconds_to_all_pods_created": since(tracker.pod_created, pods),
            "seconds_to_all_pods_bound": since(tracker.pod_bound, pods),
            "seconds_to_all_pods_running": since(tracker.pod_running, pods),
            "seconds_to_all_jobs_running": since(tracker.job_running, total_jobs),
            "seconds_from_job_created_to_all_pods_created": spread(tracker.creation_lags(options.replicas)),
            "seconds_from_last_pod_running_to_job_running": spread(tracker.running_lags()),
            "operator_requests_by_method": requests,
            "operator_requests_by_code": after_metrics.codes_minus(before_metrics),
            "operator_requests_per_job": round(sum(requests.values()) / max(1, len(names)), 1),
            "operator_events_dropped": round(after_metrics.events_dropped - before_metrics.events_dropped),
            "operator_reconciles": round(after_metrics.reconciles - before_metrics.reconciles),
            "operator_cpu_seconds": round(operator_cpu, 2),
            "operator_cpu_seconds_per_job": round(operator_cpu / max(1, len(names)), 4),
            "operator_cpu_cores_average": round(operator_cpu / max(1e-9, done_at - t0), 2),
            "operator_peak_rss_mb": round(after.peak_rss_mb, 1),
            "operator_rss_mb": round(after.rss_mb, 1),
            "component_cpu_seconds": {name: round(value, 2) for name, value in components.items()},
            "cluster_cpu": cluster_cpu(components, operator_cpu, len(names)),
            **sampled,
            "machine_busy_cores_average": busy_cores(before_machine, after_machine),
            "bench_cpu_seconds": round(bench_cpu, 2),
            "apiserver_requests_total": round(sum(after_apiserver.values()) - sum(before_apiserver.values())),
            "apiserver_requests_top": counter_delta(after_apiserver, before_apiserver),
            **({"operator_profile": profile} if profile is not None else {}),
            **({"stored_sizes": self.stored_sizes()} if first == 0 else {}),
        }

    def stored_sizes(self) -> JsonDict:
        """A pod's and a job's sizes as the cluster stores them (testbed/harness/bench/clustercost.py)."""
        return stored_pod_and_job_sizes(self.client, self.dev_dir, self.kind.resource, self.kind.namespace)

    def steady_state(self) -> JsonDict:
        options = self.options
        # Steady state begins when the operator has nothing left to do: no queued reconcile and no
        # Event still waiting to be written (the bring-up leaves a backlog behind its Event rate limit).
        idle_since = time.monotonic()
        deadline = idle_since + options.timeout
        while time.monotonic() < deadline:
            now_metrics = self.operator.metrics()
            if now_metrics.queue_depth == 0 and now_metrics.events_pending == 0:
                break
            time.sleep(1)
        say(f"operator idle after {time.monotonic() - idle_since:.0f}s (work queue and Events drained)")
        if options.settle > 0:
            say(f"all Running; letting it settle for {options.settle:.0f}s")
            settle_start = self.operator.metrics()
            time.sleep(options.settle)
            settle_writes = self.operator.metrics().minus(settle_start)
        else:
            settle_writes = {}
        say(f"measuring the steady state over {options.window:.0f}s")
        # The window starts and ends just after a Lease renewal the bench saw, so it holds a known
        # number of them (renewals come every --retry-period seconds; without leader election there
        # are none and the window is not aligned). Scrape first and read /proc second at the start,
        # the other way round at the end, so the scrapes' own CPU falls outside the window.
        renewals_before = self.align_to_renewal()
        start_metrics = self.operator.metrics()
        start = self.operator.sample()
        start_machine = machine_busy()
        t_start = time.monotonic()
        deadline = t_start + options.window
        while time.monotonic() < deadline:
            self.operator.check_alive()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        renewals = self.align_to_renewal() - renewals_before
        end = self.operator.sample()
        end_machine = machine_busy()
        elapsed = time.monotonic() - t_start
        end_metrics = self.operator.metrics()
        requests = end_metrics.minus(start_metrics)
        writes = {method: requests.get(method, 0) for method in WRITE_METHODS}
        all_writes = sum(writes.values())
        per_minute = 60.0 / elapsed
        return {
            "window_seconds": round(elapsed, 1),
            "writes_during_settle": {m: settle_writes.get(m, 0) for m in WRITE_METHODS},
            "requests_by_method": requests,
            "writes_by_method": writes,
            "lease_renewals": renewals,
            "writes_per_minute": round(max(0, all_writes - renewals) * per_minute, 2),
            "writes_per_minute_including_lease_renewals": round(all_writes * per_minute, 2),
            "cpu_percent_of_one_core": round(100 * (end.cpu_seconds - start.cpu_seconds) / elapsed, 2),
            "rss_mb": round(end.rss_mb, 1),
            "peak_rss_mb": round(end.peak_rss_mb, 1),
            "machine_busy_cores_average": busy_cores(start_machine, end_machine),
            "operator_events_in_namespace": count_events(self.client, self.kind.namespace),
        }

    def align_to_renewal(self, timeout: float = 5.0, grace: float = 0.3) -> int:
        """Waits for the next Lease renewal the bench's watch delivers, then `grace` seconds more so the
        operator has counted that PUT; returns how many renewals the bench has seen."""
        if self.lease_name is None:
            return 0
        seen = self.tracker.renewals()
        deadline = time.monotonic() + timeout
        while self.tracker.renewals() == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(grace)
        return self.tracker.renewals()

    def memory_phase(self) -> JsonDict | None:
        options = self.options
        if options.memory_jobs <= 0:
            return None
        total = max(options.memory_jobs, options.jobs)
        if total > options.jobs:
            say(f"memory phase: scaling to {total} jobs ({total * options.replicas} pods)")
            scale = self.bring_up(options.jobs, total)
        else:
            scale = {}
        if options.settle > 0:
            time.sleep(options.settle)
        sample = self.operator.sample()
        return {
            "jobs": total,
            "pods": total * options.replicas,
            "rss_mb": round(sample.rss_mb, 1),
            "peak_rss_mb": round(sample.peak_rss_mb, 1),
            "seconds_to_all_jobs_running": scale.get("seconds_to_all_jobs_running"),
            "operator_requests_by_method": scale.get("operator_requests_by_method"),
            "operator_cpu_seconds": scale.get("operator_cpu_seconds"),
        }

    def run(self) -> JsonDict:
        options = self.options
        load_before = os.getloadavg()
        pressure_before = cpu_pressure()
        self.up()
        self.start_operator()
        bring_up = self.bring_up(0, options.jobs)
        steady = self.steady_state()
        memory = self.memory_phase()
        load_after = os.getloadavg()
        return {
            "config": {
                "jobs": options.jobs,
                "replicas": options.replicas,
                "pods": options.pods,
                "gpus_per_worker": options.gpus_per_worker,
                "nodes": options.nodes,
                "create_threads": options.create_threads,
                "window_seconds": options.window,
                "memory_jobs": options.memory_jobs,
                "operator_args": self.operator.arguments(),
            },
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_before": [round(v, 2) for v in load_before],
                "loadavg_after": [round(v, 2) for v in load_after],
                "cpu_pressure_avg60_before": pressure_before,
                "cpu_pressure_avg60_after": cpu_pressure(),
            },
            "bring_up": bring_up,
            "steady_state": steady,
            "memory": memory,
            "targets": targets(options, bring_up, steady, memory),
        }
