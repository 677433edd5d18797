"""The decisions behind the dev cluster's optional components, without a cluster: Kueue's Configuration
and webhook configurations, the second scheduler's configuration, `--with` parsing, the private /etc.

Their effect on the real components is testbed/tests/test_optional_components.py's subject.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from crd import contract
from testbed.addons import coscheduling, kueue, optional, volcano
from testbed.addons.optional import json_documents, parse_with
from testbed.cluster import kube_bins
from testbed.common import ToolError
from testbed.node import nodeimages, realnode

JsonDict = dict[str, Any]


def webhook(name: str, path: str, group: str, resources: list[str]) -> JsonDict:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": resources}
        ],
    }


MANIFESTS: list[JsonDict] = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            webhook("mjob.kb.io", "/mutate-batch-v1-job", "batch", ["jobs"]),
            webhook("mpod.kb.io", "/mutate--v1-pod", "", ["pods"]),
            webhook(
                "mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta1-workload", "kueue.x-k8s.io", ["workloads"]
            ),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            webhook(
                "vworkload.kb.io",
                "/validate-kueue-x-k8s-io-v1beta1-workload",
                "kueue.x-k8s.io",
                ["workloads", "workloads/status"],
            ),
            webhook(
                "vpytorchjob.kb.io", "/validate-kubeflow-org-v1-pytorchjob", "kubeflow.org", ["pytorchjobs"]
            ),
        ],
    },
]


def test_kueue_webhooks_point_at_the_local_manager_with_the_cluster_ca() -> None:
    configurations, skipped = kueue.webhook_configurations(MANIFESTS, webhook_port=9443, ca_bundle=b"CA PEM")

    assert [c["metadata"]["name"] for c in configurations] == [
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    ]
    mutating, validating = (c["webhooks"] for c in configurations)
    assert [w["name"] for w in mutating] == ["mjob.kb.io", "mworkload.kb.io"]
    assert [w["name"] for w in validating] == ["vworkload.kb.io"]
    assert skipped == ["mpod.kb.io", "vpytorchjob.kb.io"]
    job = mutating[0]
    assert job["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    # Everything else is upstream's.
    assert job["rules"] == MANIFESTS[0]["webhooks"][0]["rules"]
    assert job["failurePolicy"] == "Fail"
    # The input is left as it was.
    assert "service" in MANIFESTS[0]["webhooks"][0]["clientConfig"]


def test_only_kueue_and_its_enabled_frameworks_keep_their_webhooks() -> None:
    assert kueue.kept(webhook("x", "/x", "kueue.x-k8s.io", ["clusterqueues"]))
    assert kueue.kept(webhook("x", "/x", "batch", ["jobs"]))
    assert not kueue.kept(webhook("x", "/x", "batch", ["cronjobs"]))
    assert not kueue.kept(webhook("x", "/x", "apps", ["deployments"]))
    assert not kueue.kept({"name": "x", "rules": []})


def test_kueue_listens_on_loopback_and_manages_only_queued_batch_jobs(tmp_path: Path) -> None:
    settings = kueue.configuration(webhook_port=1, health_port=2, metrics_port=3, cert_dir=tmp_path)

    assert settings["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": str(tmp_path)}
    assert settings["health"] == {"healthProbeBindAddress": "127.0.0.1:2"}
    assert settings["metrics"] == {"bindAddress": "127.0.0.1:3"}
    assert settings["internalCertManagement"] == {"enable": False}
    assert settings["manageJobsWithoutQueueName"] is False
    assert settings["integrations"] == {"frameworks": ["batch/job"]}
    assert settings["featureGates"] == {"VisibilityOnDemand": False}
    assert settings["leaderElection"] == {"leaderElect": False}
    assert settings["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    json.dumps(settings)  # written as JSON


def test_kueue_converts_its_api_versions_through_the_local_webhook() -> None:
    patch = kueue.conversion_patch(webhook_port=9443, ca_bundle=b"CA PEM")

    conversion = patch["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/convert",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert conversion["webhook"]["conversionReviewVersions"] == ["v1"]
    assert "workloads.kueue.x-k8s.io" in kueue.CONVERTED_CRDS
    assert "resourceflavors.kueue.x-k8s.io" not in kueue.CONVERTED_CRDS


def test_the_second_scheduler_is_the_one_the_operator_names() -> None:
    settings = coscheduling.scheduler_configuration()

    (profile,) = settings["profiles"]
    assert profile["schedulerName"] == contract.COSCHEDULING_SCHEDULER_NAME
    assert profile["plugins"]["multiPoint"] == {
        "enabled": [{"name": "Coscheduling"}],
        "disabled": [{"name": "PrioritySort"}],
    }
    assert profile["pluginConfig"] == [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}]
    assert settings["leaderElection"] == {"leaderElect": False}
    args = coscheduling.scheduler_args(1234, Path("/x/config.json"))
    assert "--bind-address=127.0.0.1" in args
    assert "--secure-port=1234" in args
    assert "--config=/x/config.json" in args


def test_with_names_known_components_once() -> None:
    assert parse_with("") == []
    assert parse_with("kueue, coscheduling,kueue") == ["kueue", "coscheduling"]
    assert parse_with("volcano,kueue") == ["volcano", "kueue"]
    with pytest.raises(ToolError, match="unknown optional component 'yunikorn'; one of: coscheduling, kueue"):
        parse_with("kueue,yunikorn")


def test_volcano_listens_on_loopback_without_leader_election(tmp_path: Path) -> None:
    conf = tmp_path / "scheduler.conf"
    scheduler = volcano.scheduler_args(healthz_port=9001, metrics_port=9002, conf=conf)
    controllers = volcano.controllers_args(healthz_port=9003)
    for args in (scheduler, controllers):
        addresses = [arg.split("=", 1)[1] for arg in args if arg.split("=")[0].endswith("-address")]
        assert addresses
        assert all(address.startswith("127.0.0.1:") for address in addresses)
        assert "--leader-elect=false" in args
        assert "--scheduler-name=volcano" in args
    assert sorted(a for a in scheduler if a.split("=")[0].endswith("-address")) == [
        "--healthz-address=127.0.0.1:9001",
        "--listen-address=127.0.0.1:9002",
    ]
    assert f"--scheduler-conf={conf}" in scheduler
    assert "--controllers=queue-controller" in controllers
    assert "proportion" in volcano.SCHEDULER_CONF
    assert "gang" in volcano.SCHEDULER_CONF


def test_kueue_runs_with_a_private_etc(monkeypatch: pytest.MonkeyPatch) -> None:
    layer, binary = Path("/run/kueue/etc"), Path("/cache/kueue")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    _, as_root = kueue.private_etc_command(layer, binary, ["--config=c"])
    assert as_root[:3] == ["--mount", "--propagation", "private"]
    assert as_root[-4:] == ["sh", str(layer), str(binary), "--config=c"]
    assert 'lowerdir=$1:/etc" /etc' in as_root[as_root.index("-c") + 1]
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    _, as_user = kueue.private_etc_command(layer, binary, ["--config=c"])
    assert as_user[:2] == ["--user", "--map-root-user"]
    assert as_user[2:] == as_root


def test_kubectl_json_output_of_several_objects_is_split() -> None:
    assert json_documents('{"a": 1}\n{"b": {"c": 2}}\n') == [{"a": 1}, {"b": {"c": 2}}]
    assert json_documents("") == []


def test_the_real_nodes_images_build_while_the_go_builds_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each side waits until the other has started: built one after the other in either order, one
    would wait in vain; built meanwhile, both go on."""
    go_builds_started = threading.Event()
    images_started = threading.Event()
    ensured: list[str | None] = []

    def ensure(component: str | None = None) -> Path:
        go_builds_started.set()
        assert images_started.wait(timeout=30), "the Go builds ran before the images' build"
        ensured.append(component)
        return Path("/cache") / (component or "control-plane")

    def build_images(names: tuple[str, ...]) -> None:
        assert names == nodeimages.IMAGES
        images_started.set()
        assert go_builds_started.wait(timeout=30), "the images' build ran before the Go builds"

    monkeypatch.setattr(kube_bins, "ensure", ensure)
    monkeypatch.setattr(realnode, "build_images", build_images)
    monkeypatch.setattr(realnode, "require_prerequisites", lambda: None)
    built = optional.build(["kueue", "real-node"])
    assert ensured == [None, "kueue", *realnode.BUILDS]  # the control plane first
    assert built == {"kueue": Path("/cache/kueue"), "real-node": Path("/cache/kubelet")}


def test_images_this_tree_does_not_build_as_they_are_leave_the_nodes_store() -> None:
    """A trainer tagged with an older framework version goes, and so does one built under another
    key (before its new build is imported); what the tree builds stays."""
    held = {
        "docker.io/library/trainingjob-trainer:torch-2.9.1": "k1",
        "docker.io/library/trainingjob-trainer:torch-2.8.0": "k0",
        "docker.io/library/trainingjob-operator:latest": "k2",
        "docker.io/library/trainingjob-operator:0.1.0": "k2",
    }
    wanted = {
        "library/trainingjob-trainer:torch-2.9.1": "k1",
        "library/trainingjob-operator:latest": "k3",
        "library/trainingjob-operator:0.1.0": "k3",
    }
    assert nodeimages.stale_images(held, wanted) == [
        "docker.io/library/trainingjob-operator:0.1.0",
        "docker.io/library/trainingjob-operator:latest",
        "docker.io/library/trainingjob-trainer:torch-2.8.0",
    ]
    assert nodeimages.stale_images({}, wanted) == []
    assert nodeimages.stale_images({"docker.io/library/trainingjob-trainer:torch-2.9.1": "k1"}, wanted) == []


def test_an_image_id_whose_image_lost_every_name_leaves_the_store() -> None:
    listing = [
        ("docker.io/library/trainingjob-trainer:torch-2.15.0", "sha256:new"),
        ("sha256:1d", "sha256:new"),
        ("sha256:2d", "sha256:old"),
    ]
    assert nodeimages.orphaned_image_ids(listing) == ["sha256:2d"]
    assert nodeimages.orphaned_image_ids(listing[:2]) == []


def test_with_some_images_only_a_rebuilt_one_of_them_leaves_the_nodes_store() -> None:
    """`make demo` imports the torch trainer alone: the operator's and the other trainers' images a
    test session imported stay, whatever their keys; an older build of the torch trainer goes."""
    held = {
        "docker.io/library/trainingjob-trainer:torch-2.9.1": "k0",
        "docker.io/library/trainingjob-trainer:tensorflow-2.19.0": "k5",
        "docker.io/library/trainingjob-operator:latest": "k2",
    }
    wanted = {"library/trainingjob-trainer:torch-2.9.1": "k1"}
    assert nodeimages.stale_images(held, wanted, every_image=False) == [
        "docker.io/library/trainingjob-trainer:torch-2.9.1"
    ]
    assert len(nodeimages.stale_images(held, wanted)) == 3


def fake_venv(root: Path, *distributions: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").touch()
    for distribution in distributions:
        (root / "lib" / "python3.11" / "site-packages" / f"{distribution}.dist-info").mkdir(parents=True)
    return root


def test_the_nodes_images_always_include_its_own_and_all_leaves_out_a_missing_framework(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert nodeimages.selected_images("trainer-torch") == ("pause", "busybox", "trainer-torch")
    assert nodeimages.selected_images("busybox, operator,") == ("pause", "busybox", "operator")
    # A test session's node (make test builds these before the session; the others in the background).
    assert nodeimages.selected_images("first") == ("pause", "busybox", "base", "operator", "trainer-torch")
    with pytest.raises(ToolError, match="--images: no image torch; the images are: pause, busybox"):
        nodeimages.selected_images("torch")
    # make demo's virtualenv: torch without TensorFlow or JAX.
    monkeypatch.setenv("TJ_TRAINER_VENV", str(fake_venv(tmp_path / "venv", "torch-2.9.1", "PyYAML-6.0.2")))
    # trainer-mpi is trainer-torch plus Debian's packages: it needs nothing more from the virtualenv.
    assert nodeimages.selected_images("all") == (
        "pause",
        "busybox",
        "base",
        "operator",
        "trainer-torch",
        "trainer-mpi",
    )
    said = capsys.readouterr().err
    assert "without image trainer-tensorflow: tensorflow-cpu is not installed in" in said
    assert "without image trainer-jax: jax is not installed in" in said
    monkeypatch.setenv(
        "TJ_TRAINER_VENV",
        str(
            fake_venv(
                tmp_path / "dev",
                *(
                    "torch-2.9.1",
                    "tensorflow_cpu-2.19.0",
                    "jax-0.7.2",
                    "xgboost_cpu-3.2.0",
                    "paddlepaddle-3.3.1",
                ),
            )
        ),
    )
    assert nodeimages.selected_images("all") == nodeimages.IMAGES
