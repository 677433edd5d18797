"""What topology-aware scheduling (spec.scheduling.topology, Kueue's TAS) costs the operator.

Why: with TAS the operator reads Kueue's topologyAssignment and writes each pod's domain into its node
selector as it builds the gang, instead of letting Kueue ungate pods one by one. That work is pure (no
request is added: the pods are created once, as without TAS), so it is measured without a cluster:
for gangs of several sizes, the time to decode an assignment with one domain per pod (the worst case:
one pod per node) and to build every pod of the admitted gang, with the topology and without it, and
what it adds to each pod's size. Each figure is the fastest of `--rounds` runs, the two cases taking
turns, so that other work on a busy machine weighs as little as it can. `python -m
testbed.harness.bench.tascost`; one JSON object on stdout. Results in docs/bench.md, "Topology-aware
gangs".
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from builders.placement import Placement
from builders.pods import build_pod
from controller.planner.kueue import slot_node_selectors
from crd import contract
from crd.defaults import with_defaults
from crd.spec import TrainingJob, parse

RACK = "topology.example.com/rack"
HOST = "kubernetes.io/hostname"
JsonDict = dict[str, Any]


def job(workers: int, *, topology: bool) -> TrainingJob:
    scheduling: JsonDict = {"topology": {"level": RACK}} if topology else {}
    manifest = {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "bench", "namespace": "bench", "uid": "0" * 8},
        "spec": {
            "model": "bert-large",
            "dataset": "wikitext",
            "numWorkers": workers,
            "gpusPerWorker": 8,
            "scheduling": scheduling,
        },
    }
    return parse(with_defaults(manifest))


def assignment(workers: int) -> JsonDict:
    """Kueue's assignment of `workers` pods, one per node, in two racks (v1beta2's slices)."""
    half = workers // 2
    return {
        "levels": [RACK, HOST],
        "slices": [
            {
                "domainCount": count,
                "valuesPerLevel": [
                    {"universal": f"rack-{index}"},
                    {
                        "individual": {
                            "prefix": f"rack-{index}-node-",
                            "roots": [str(n) for n in range(count)],
                        }
                    },
                ],
                "podCounts": {"universal": 1},
            }
            for index, count in enumerate((half, workers - half))
            if count
        ],
    }


def gang(workers: int, *, topology: bool) -> Callable[[], list[JsonDict]]:
    """Builds every pod of the admitted gang; with the topology, the assignment decoded first and the
    pods given their domain and the pod-set annotation, as the operator does."""
    built = job(workers, topology=topology)
    flavor = {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
    raw = assignment(workers)

    def run() -> list[JsonDict]:
        slots = slot_node_selectors(raw) if topology else ()
        annotations = {contract.PODSET_REQUIRED_TOPOLOGY_ANNOTATION: RACK} if topology else {}
        placement = Placement(flavor, (), {}, annotations, slots)
        return [
            build_pod(built, slot, attempt=0, resume_from=None, placement=placement)
            for slot in range(workers)
        ]

    return run


def fastest(runs: list[Callable[[], list[JsonDict]]], rounds: int) -> list[float]:
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for index, run in enumerate(runs):
            start = time.perf_counter()
            run()
            best[index] = min(best[index], time.perf_counter() - start)
    return best


def measure(workers: int, rounds: int) -> JsonDict:
    plain, tas = gang(workers, topology=False), gang(workers, topology=True)
    plain_seconds, tas_seconds = fastest([plain, tas], rounds)
    decode = fastest([lambda: [dict(s) for s in slot_node_selectors(assignment(workers))]], rounds)[0]
    plain_bytes = sum(len(json.dumps(pod)) for pod in plain()) / workers
    tas_bytes = sum(len(json.dumps(pod)) for pod in tas()) / workers
    return {
        "workers": workers,
        "build_ms": round(plain_seconds * 1000, 2),
        "build_with_topology_ms": round(tas_seconds * 1000, 2),
        "decode_assignment_ms": round(decode * 1000, 3),
        "pod_bytes": round(plain_bytes),
        "pod_bytes_with_topology": round(tas_bytes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,64,512", help="gang sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(size) for size in args.workers.split(",") if size]
    print(json.dumps({"gangs": [measure(size, args.rounds) for size in sizes]}, indent=2))


if __name__ == "__main__":
    main()
