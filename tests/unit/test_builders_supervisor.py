"""builders/supervisor.py through build_pod: an InPlace job's trainer command runs under the in-place
restart's supervisor; every other pod is exactly what it was without the field."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from builders.pods import build_pod
from builders.supervisor import BOOTSTRAP, runs_supervisor, supervised_command
from crd import contract
from crd.spec import parse
from tests.unit.builders_support import EXAMPLES, defaulted

IN_PLACE = {"spec.failurePolicy.restartStrategy": "InPlace"}


def pods(changes: dict[str, Any]) -> list[dict[str, Any]]:
    job = parse(defaulted(changes))
    return [build_pod(job, slot, attempt=0, resume_from=None) for slot in range(job.spec.replicas.size)]


def without_the_field(manifest: dict[str, Any]) -> dict[str, Any]:
    policy = manifest["spec"].get("failurePolicy") or {}
    policy.pop("restartStrategy", None)
    return manifest


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_pods_of_a_job_without_the_field_are_those_of_recreate(name: str) -> None:
    """Recreate (the schema's default) changes nothing: with the field absent, or set to Recreate, every
    pod of every example is the same, byte for byte."""
    manifest = without_the_field(EXAMPLES[name])
    absent = parse(manifest)
    explicit = parse(
        {
            **manifest,
            "spec": {
                **manifest["spec"],
                "failurePolicy": {
                    **(manifest["spec"].get("failurePolicy") or {}),
                    "restartStrategy": "Recreate",
                },
            },
        }
    )
    for slot in range(absent.spec.replicas.size):
        built = build_pod(absent, slot, attempt=2, resume_from="/ckpt/3")
        assert built == build_pod(explicit, slot, attempt=2, resume_from="/ckpt/3")
        command = built["spec"]["containers"][0].get("command") or []
        assert BOOTSTRAP not in command


def test_an_in_place_job_runs_its_command_under_the_supervisor_and_nothing_else_changes() -> None:
    changes = {"spec.command": ["python3", "train.py"], "spec.args": ["--epochs", "3"]}
    recreate, in_place = pods(changes), pods({**changes, **IN_PLACE})
    for before, after in zip(recreate, in_place, strict=True):
        container = after["spec"]["containers"][0]
        assert container["command"] == ["python3", "-c", BOOTSTRAP, "--", "python3", "train.py"]
        assert container["args"] == ["--epochs", "3"]
        # Marked, for the operator's pod cache (which keeps no spec) to know it.
        assert after["metadata"]["annotations"].pop(contract.SUPERVISED_ANNOTATION) == "true"
        assert runs_supervisor(after) is False
        assert contract.SUPERVISED_ANNOTATION not in before["metadata"].get("annotations", {})
        container["command"] = before["spec"]["containers"][0]["command"]
        assert after == before


def test_the_bootstrap_runs_the_supervisor_module_from_the_mount_with_the_command_as_its_argv(
    tmp_path: Any,
) -> None:
    """What `python3 -c BOOTSTRAP -- cmd...` does, with a stand-in module at the mount's path replaced
    by a temporary folder: the module runs as __main__ with argv [its file, "--", cmd...]."""
    package = tmp_path / "trainingjob_progress"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "supervise.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    bootstrap = BOOTSTRAP.replace(repr(contract.CONFIG_MOUNT_PATH), repr(str(tmp_path)))
    command = supervised_command(("sleep", "1"))
    command[0], command[2] = sys.executable, bootstrap
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "__main__ ['--', 'sleep', '1']"


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.elastic": {"minWorkers": 1, "maxWorkers": 3}},
        {
            "spec.framework": "mpi",
            "spec.gpusPerWorker": 0,
            "spec.command": ["mpirun", "python3", "/etc/program/train.py"],
        },
    ],
    ids=["elastic", "mpi"],
)
def test_elastic_and_mpi_jobs_are_never_supervised(changes: dict[str, Any]) -> None:
    for pod in pods({**changes, **IN_PLACE}):
        assert BOOTSTRAP not in (pod["spec"]["containers"][0].get("command") or [])


def test_only_the_training_cluster_is_supervised_not_the_evaluator() -> None:
    job = parse(
        defaulted(
            {
                **IN_PLACE,
                "spec.framework": "tensorflow",
                "spec.tensorflow": {"chief": 1, "ps": 1, "evaluator": 1},
            }
        )
    )
    replicas = job.spec.replicas
    for slot in range(replicas.size):
        pod = build_pod(job, slot, attempt=0, resume_from=None)
        command = pod["spec"]["containers"][0]["command"]
        assert (BOOTSTRAP in command) == (slot in replicas.training), replicas.at(slot)
        assert runs_supervisor(pod) == (slot in replicas.training)
