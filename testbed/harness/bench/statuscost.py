"""What one TrainingJob status write costs the API server, with the CRD's CEL rules and without them.

Why: the API server validates the whole object on every write of the status subresource, the spec's
x-kubernetes-validations included (apiextensions-apiserver's status strategy runs the CEL validator
over the new and old object; ratcheting only forgives errors on unchanged fields, it does not skip
their rules). Progress reports make status writes the most frequent write of a running job, so what
the spec's rules add to each is a cost every job pays. This measures it directly: one throwaway
cluster serves the CRD as shipped, a copy under another group with the immutable fields' transition
rules it had before crd/immutability.py's admission policy took them over (self == oldSelf), and one
without any rule (the same schema otherwise), a few jobs of each with the same spec, and rounds of
status merge patches rotate between them while the API server's and etcd's CPU seconds are read
from /proc. `make bench-status` runs it
(`python -m testbed.harness.bench.statuscost`; `--spec-from examples/...yaml` for a richer spec than the
bench's): progress on stderr, one JSON object on stdout, the cluster torn down at the end, also on
Ctrl-C. Results in docs/bench.md, "What a status write costs".
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from controller.resources import CRDS
from controller.runtime.client import KubeClient
from controller.runtime.resource import Resource
from crd import contract
from crd.immutability import IMMUTABLE_FIELDS
from testbed.common import JsonDict, ToolError
from testbed.harness.base import HarnessCluster, HarnessParser, run_to_end, wait_established
from testbed.harness.bench import cluster, procfs, quiet
from testbed.harness.bench.operator import say

NAMESPACE: Final = "status-cost"


@dataclass(frozen=True)
class Variant:
    """The CRD served under `group` with only the rules `keep` accepts (the real CRD keeps them all),
    and `spec_rules` added on spec."""

    group: str
    keep: Callable[[JsonDict], bool]
    spec_rules: tuple[JsonDict, ...] = ()

    @property
    def resource(self) -> Resource:
        return Resource(self.group, contract.VERSION, contract.PLURAL, contract.KIND)


def immutability_as_transition_rules() -> tuple[JsonDict, ...]:
    """The immutable fields of crd/immutability.py as the schema's transition rules on spec, where they
    were before the ValidatingAdmissionPolicy took them over: what each status write paid for them."""
    return tuple(
        {"rule": field.unchanged("self", "oldSelf"), "message": f"{field.name} is immutable"}
        for field in IMMUTABLE_FIELDS
    )


VARIANTS: Final = {
    "immutability_as_transition_rules": Variant(
        f"transition.{contract.GROUP}", lambda rule: True, immutability_as_transition_rules()
    ),
    "as_shipped": Variant(contract.GROUP, lambda rule: True),
    "no_rules": Variant(f"rule-free.{contract.GROUP}", lambda rule: False),
}


def with_rules(crd: JsonDict, variant: Variant) -> JsonDict:
    """The CRD under the variant's group with only the x-kubernetes-validations rules it keeps, and its
    rules on spec added."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            copied = {key: strip(item) for key, item in value.items() if key != "x-kubernetes-validations"}
            kept = [rule for rule in value.get("x-kubernetes-validations") or [] if variant.keep(rule)]
            if kept:
                copied["x-kubernetes-validations"] = copy.deepcopy(kept)
            return copied
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value

    copied: JsonDict = strip(crd)
    copied["metadata"] = {"name": f"{crd['spec']['names']['plural']}.{variant.group}"}
    copied["spec"]["group"] = variant.group
    for version in copied["spec"]["versions"] if variant.spec_rules else ():
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["x-kubernetes-validations"] = [*spec.get("x-kubernetes-validations", ()), *variant.spec_rules]
    return copied


def count_rules(value: Any) -> int:
    """The CEL rules a CRD (or any part of one) holds."""
    if isinstance(value, dict):
        own = len(value.get("x-kubernetes-validations") or [])
        return own + sum(
            count_rules(item) for key, item in value.items() if key != "x-kubernetes-validations"
        )
    if isinstance(value, list):
        return sum(count_rules(item) for item in value)
    return 0


def running_status(write: int, workers: int) -> JsonDict:
    """The status a running job's progress report leaves: what changes on every report (epoch, step,
    metrics, progress, its time) beside what stays (state, conditions, pod counts, attempt)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    since = "2026-01-01T00:00:00Z"
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": since}
        for kind, reason, message in (
            ("Created", "PodsCreated", f"{workers} pods created for attempt 0"),
            ("Running", "AllWorkersRunning", f"{workers}/{workers} workers running"),
        )
    ]
    return {
        "state": "Running",
        "message": f"{workers}/{workers} workers running",
        "conditions": conditions,
        "observedGeneration": 1,
        "currentEpoch": write // 10,
        "totalEpochs": 100_000,
        "step": write,
        "progress": f"{min(write // 1000, 99)}%",
        "metrics": {"loss": round(1.0 / (1 + write), 6), "accuracy": round(write / (write + 1.0), 6)},
        "lastProgressTime": stamp,
        "workers": {"pending": 0, "active": workers, "succeeded": 0, "failed": 0},
        "attempt": 0,
        "attemptStartTime": since,
        "startTime": since,
        "restartCount": 0,
        "replicas": workers,
    }


def apply_crd(client: KubeClient, crd: JsonDict) -> None:
    client.patch(CRDS, None, crd["metadata"]["name"], crd, patch_type="apply", field_manager="bench")
    wait_established(client, crd["metadata"]["name"])


def create_jobs(client: KubeClient, resource: Resource, spec: JsonDict, count: int) -> list[str]:
    names = [f"job-{index}" for index in range(count)]
    for name in names:
        body = {
            "apiVersion": resource.api_version,
            "kind": contract.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec,
        }
        client.create(resource, NAMESPACE, body)
    return names


def patch_round(client: KubeClient, resource: Resource, names: list[str], writes: int, first: int) -> None:
    """`writes` status merge patches, spread over the jobs, from as many threads as there are jobs."""

    def write(index: int) -> None:
        name = names[index % len(names)]
        status = running_status(first + index, workers=4)
        client.patch(resource, NAMESPACE, name, {"status": status}, subresource="status")

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="status-cost") as pool:
        list(pool.map(write, range(writes)))


def per_write_micros(
    cpu_before: Mapping[str, float], cpu_after: Mapping[str, float], writes: int
) -> JsonDict:
    """Each component's CPU microseconds per write between two samples."""
    return {
        name: round(1e6 * (cpu_after[name] - cpu_before[name]) / writes)
        for name in sorted(cpu_after)
        if name in cpu_before
    }


def summarize(rounds: Iterable[tuple[str, JsonDict]]) -> JsonDict:
    """Medians per variant of each component's microseconds per write, and each variant's API server
    median over the rule-free one's."""
    by_variant: dict[str, list[JsonDict]] = {}
    for variant, micros in rounds:
        by_variant.setdefault(variant, []).append(micros)
    medians = {
        variant: {name: statistics.median(m[name] for m in runs) for name in runs[0]}
        for variant, runs in by_variant.items()
    }
    summary: JsonDict = {"median_cpu_micros_per_write": medians}
    rule_free = medians.get("no_rules", {}).get("kube-apiserver")
    if rule_free:
        summary["apiserver_ratio_to_no_rules"] = {
            variant: round(micros["kube-apiserver"] / rule_free, 3) for variant, micros in medians.items()
        }
    return summary


def spec_from(path: Path | None) -> JsonDict:
    """The spec of the TrainingJob in `path` (an example), or the bench's own minimal spec."""
    if path is None:
        spec: JsonDict = cluster.job_manifest("x", 4, 1)["spec"]
        return spec
    for document in yaml.safe_load_all(path.read_text()):
        if isinstance(document, dict) and document.get("kind") == contract.KIND:
            found: JsonDict = document["spec"]
            return found
    raise ToolError(f"{path} holds no {contract.KIND}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser("bench.statuscost", "BENCH_STATUS", __doc__.split("\n")[0], dev_dir="bench-status")
    parser.setting("--jobs", int, 20, "jobs of each variant")
    parser.setting("--writes", int, 2000, "status writes per round")
    parser.setting("--rounds", int, 3, "rounds of each variant, alternating")
    parser.add_argument("--spec-from", type=Path, help="a manifest whose TrainingJob spec the jobs take")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    dev_dir: Path = args.dev_dir.resolve()
    harness = HarnessCluster("bench-status", dev_dir, say)
    result: JsonDict = {}

    def run() -> int:
        spec = spec_from(args.spec_from)
        client = harness.start(NAMESPACE)
        crd = client.get(CRDS, None, f"{contract.PLURAL}.{contract.GROUP}")
        served = {key: crd[key] for key in ("apiVersion", "kind", "metadata", "spec")}
        for variant in VARIANTS.values():
            if variant.group != contract.GROUP:
                apply_crd(client, with_rules(served, variant))
        names = {
            name: create_jobs(client, variant.resource, spec, args.jobs) for name, variant in VARIANTS.items()
        }
        pids = {
            name: pid
            for name, pid in procfs.component_pids(dev_dir).items()
            if name in ("kube-apiserver", "etcd")
        }
        if "kube-apiserver" not in pids:
            raise ToolError("the bench cluster's API server process was not found")
        result.update(rules=count_rules(crd), jobs=args.jobs, writes_per_round=args.writes)
        result["load_average_before"] = quiet.load_average()
        rounds: list[tuple[str, JsonDict]] = []
        order = list(VARIANTS)
        written = 0
        for number in range(args.rounds):
            for label in order[number % len(order) :] + order[: number % len(order)]:
                before = procfs.component_cpu(pids)
                began = time.monotonic()
                patch_round(client, VARIANTS[label].resource, names[label], args.writes, written)
                took = time.monotonic() - began
                micros = per_write_micros(before, procfs.component_cpu(pids), args.writes)
                written += args.writes
                rate = args.writes / took
                say(f"round {number + 1} {label}: {micros} CPU us per write, {rate:.0f} writes/s")
                rounds.append((label, micros))
        result.update(summarize(rounds), load_average_after=quiet.load_average(), cores=os.cpu_count())
        print(json.dumps(result, indent=2), flush=True)
        return 0

    return run_to_end(run, harness.stop, say)


if __name__ == "__main__":
    sys.exit(main())
