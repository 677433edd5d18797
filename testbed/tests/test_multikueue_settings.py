"""MultiKueue's worker cluster as the testbed sets it up (testbed/addons/multikueue.py), without a
cluster: where it lives, the Secret and the MultiKueueCluster the manager's Kueue reads, Kueue's
configuration naming the TrainingJob for MultiKueue's generic adapter, and `up --with multikueue`
bringing the manager's Kueue first."""

from __future__ import annotations

import base64
from pathlib import Path

from testbed.addons import kueue, multikueue
from testbed.addons.optional import parse_with


def test_a_worker_cluster_lives_under_its_managers_directory(tmp_path: Path) -> None:
    assert multikueue.worker_dir(tmp_path) == tmp_path / "multikueue" / "worker1"
    assert multikueue.worker_dirs(tmp_path) == []
    (tmp_path / "multikueue" / "worker2").mkdir(parents=True)
    (tmp_path / "multikueue" / "worker1").mkdir()
    assert multikueue.worker_dirs(tmp_path) == [
        tmp_path / "multikueue" / "worker1",
        tmp_path / "multikueue" / "worker2",
    ]


def test_the_workers_kubeconfig_is_in_a_secret_of_kueues_namespace_under_the_key_kueue_reads() -> None:
    secret = multikueue.kubeconfig_secret('{"kind": "Config"}', "worker2")
    assert secret["metadata"]["name"] == "worker2-kubeconfig"
    assert secret["metadata"]["namespace"] == kueue.NAMESPACE == "kueue-system"
    assert base64.b64decode(secret["data"]["kubeconfig"]) == b'{"kind": "Config"}'


def test_every_kueue_here_dispatches_trainingjobs_through_the_generic_adapter(tmp_path: Path) -> None:
    settings = kueue.configuration(webhook_port=1, health_port=2, metrics_port=3, cert_dir=tmp_path)
    assert settings["multiKueue"] == {"externalFrameworks": [{"name": "TrainingJob.v1.ml.example.com"}]}


def test_the_managers_multikueuecluster_reads_the_workers_secret() -> None:
    cluster = multikueue.multikueue_cluster("worker2")
    assert (cluster["apiVersion"], cluster["kind"], cluster["metadata"]["name"]) == (
        "kueue.x-k8s.io/v1beta2",
        "MultiKueueCluster",
        "worker2",
    )
    assert cluster["spec"] == {
        "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "worker2-kubeconfig"}}
    }


def test_with_multikueue_brings_the_managers_kueue_before_it() -> None:
    assert parse_with("multikueue") == ["kueue", "multikueue"]
    assert parse_with("multikueue,kueue") == ["kueue", "multikueue"]
    assert parse_with("kueue,coscheduling,multikueue") == ["kueue", "coscheduling", "multikueue"]
