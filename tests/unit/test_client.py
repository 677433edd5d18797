"""The Python client (trainingjob_client) against a scripted API server over real HTTP: what it sends,
how it follows a job with a watch, and the one exception it raises for each kind of trouble."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from controller.runtime.client import KubeClient
from tests.unit import client_support
from tests.unit.client_support import MNIST, watches
from tests.unit.clientfakes import (
    ALL_JOBS,
    JOBS,
    NAMESPACE,
    UID,
    changed,
    job,
    kubeconfig_for,
    not_found,
)
from tests.unit.fakeapi import Drop, FakeApi, Reply, Stream, event, items_list, running, status
from trainingjob_client import (
    ApiNotInstalled,
    ClusterUnreachable,
    ConfigError,
    InvalidManifest,
    JobDeleted,
    JobExists,
    JobNotFound,
    JobRejected,
    JobWatch,
    PermissionDenied,
    TrainingJobClient,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = client_support.api
client = client_support.client


# ----------------------------------------------------------------------------------------- creating


def test_submit_creates_the_manifest_built_from_keyword_arguments(
    api: FakeApi, client: TrainingJobClient
) -> None:
    api.script("POST", JOBS, Reply(201, job()))
    created = client.submit(
        "mnist",
        model="cnn",
        dataset="mnist",
        num_workers=2,
        gpus_per_worker=0,
        epochs=3,
        learning_rate=0.01,
        env={"TRAIN_STEP_SECONDS": "0.1"},
        checkpoint=True,
        labels={"team": "a"},
        spec={"successPolicy": {"targetAccuracy": 0.9}, "env": [{"name": "KEEP", "value": "1"}]},
    )
    assert (created.name, created.namespace, created.uid) == ("mnist", NAMESPACE, UID)
    (request,) = api.requests("POST", JOBS)
    assert request.json() == {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "mnist", "namespace": NAMESPACE, "labels": {"team": "a"}},
        "spec": {
            "successPolicy": {"targetAccuracy": 0.9},
            "env": [{"name": "KEEP", "value": "1"}, {"name": "TRAIN_STEP_SECONDS", "value": "0.1"}],
            "model": "cnn",
            "dataset": "mnist",
            "numWorkers": 2,
            "gpusPerWorker": 0,
            "hyperparameters": {"epochs": 3, "learningRate": 0.01},
            "checkpoint": {"enabled": True},
        },
    }


def test_yaml_text_a_file_and_a_dict_create_the_same_job(
    api: FakeApi, client: TrainingJobClient, tmp_path: Path
) -> None:
    manifest = (
        "apiVersion: ml.example.com/v1\nkind: TrainingJob\nmetadata: {name: mnist}\n"
        "spec: {model: cnn, dataset: mnist, numWorkers: 2}\n"
    )
    path = tmp_path / "job.yaml"
    path.write_text(manifest)
    api.script("POST", JOBS, Reply(201, job()), Reply(201, job()), Reply(201, job()))
    client.create_from_yaml(manifest)
    client.create_from_file(path)
    client.create(
        {"metadata": {"name": "mnist"}, "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": 2}}
    )
    bodies = [request.json() for request in api.requests("POST", JOBS)]
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["metadata"] == {"name": "mnist", "namespace": NAMESPACE}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [b", "not valid YAML"),
        (
            "job.yaml",
            "the YAML is the text 'job.yaml', not a manifest (to read a file, use create_from_file)",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}",
            "not a TrainingJob: apiVersion 'v1', kind 'Pod'",
        ),
        ("kind: TrainingJob\nspec: {}", "the manifest has no metadata.name"),
        ("metadata: {name: a}\n---\nmetadata: {name: b}", "expected one TrainingJob document, found 2"),
    ],
)
def test_what_is_not_one_training_job_is_refused_before_any_request(
    api: FakeApi, client: TrainingJobClient, text: str, message: str
) -> None:
    with pytest.raises(InvalidManifest) as raised:
        client.create_from_yaml(text)
    assert message in str(raised.value)
    assert api.requests() == []


def test_a_missing_file_and_a_namespace_mismatch_are_refused(
    api: FakeApi, client: TrainingJobClient, tmp_path: Path
) -> None:
    with pytest.raises(InvalidManifest, match=r"cannot read .*missing.yaml: No such file or directory"):
        client.create_from_file(tmp_path / "missing.yaml")
    manifest = {"metadata": {"name": "a", "namespace": "other"}, "spec": {}}
    with pytest.raises(
        InvalidManifest, match="namespace 'other' does not match the requested namespace 'ns'"
    ):
        client.create(manifest, namespace=NAMESPACE)
    assert api.requests() == []


def test_admission_refusals_name_the_field_and_existing_jobs_are_said_so(
    api: FakeApi, client: TrainingJobClient
) -> None:
    refusal = status(
        422, "Invalid", 'TrainingJob.ml.example.com "mnist" is invalid: spec.numWorkers: Invalid value: 0'
    )
    api.script("POST", JOBS, Reply(422, refusal), Reply(409, status(409, "AlreadyExists", "exists")))
    with pytest.raises(JobRejected, match=r"spec\.numWorkers: Invalid value: 0"):
        client.submit("mnist", model="cnn", dataset="mnist", num_workers=0)
    with pytest.raises(JobExists, match='TrainingJob "mnist" already exists in namespace "ns"'):
        client.submit("mnist", model="cnn", dataset="mnist", num_workers=1)


# ------------------------------------------------------------------------------------ reading, errors


def test_a_missing_job_names_the_namespace_and_where_one_is(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(404, not_found("trainingjobs.ml.example.com", "mnist")))
    other = job()
    other["metadata"]["namespace"] = "team-b"
    api.script("GET", ALL_JOBS, Reply(200, items_list([other], "5")))
    with pytest.raises(JobNotFound) as raised:
        client.get("mnist")
    assert (
        str(raised.value)
        == 'TrainingJob "mnist" not found in namespace "ns" (there is one in namespace "team-b")'
    )
    (lookup,) = api.requests("GET", ALL_JOBS)
    assert lookup.query["fieldSelector"] == "metadata.name=mnist"


def test_a_missing_job_without_rights_to_look_elsewhere(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(404, not_found("trainingjobs.ml.example.com", "mnist")))
    api.script("GET", ALL_JOBS, Reply(403, status(403, "Forbidden", "cannot list at the cluster scope")))
    with pytest.raises(JobNotFound) as raised:
        client.get("mnist")
    assert str(raised.value) == 'TrainingJob "mnist" not found in namespace "ns"'


def test_a_cluster_without_the_crd_and_a_forbidden_request(api: FakeApi, client: TrainingJobClient) -> None:
    api.script(
        "GET", JOBS, Reply(404, status(404, "NotFound", "the server could not find the requested resource"))
    )
    with pytest.raises(ApiNotInstalled, match="is the CRD installed"):
        client.list()
    api.script("GET", MNIST, Reply(403, status(403, "Forbidden", 'user "bob" cannot get trainingjobs')))
    with pytest.raises(PermissionDenied, match='user "bob" cannot get trainingjobs'):
        client.get("mnist")


def test_a_cluster_that_is_down_is_one_sentence() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with running() as api:
        configuration = api.configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    import kubernetes  # noqa: PLC0415 - only this test builds its own configuration

    kube = KubeClient(
        kubernetes.client.ApiClient(configuration), qps=0, burst=0, max_attempts=2, backoff_initial=0.01
    )
    with pytest.raises(ClusterUnreachable) as raised:
        TrainingJobClient(NAMESPACE, kube=kube).get("mnist")
    assert (
        str(raised.value) == f"cannot reach the Kubernetes API server at 127.0.0.1:{port}: connection refused"
    )


def test_a_server_that_does_not_speak_tls_is_one_sentence(api: FakeApi) -> None:
    """An https:// address of a plain HTTP server (the fake API server)."""
    configuration = api.configuration()
    configuration.host = api.url.replace("http://", "https://")
    import kubernetes  # noqa: PLC0415 - only these tests build their own configuration

    kube = KubeClient(
        kubernetes.client.ApiClient(configuration), qps=0, burst=0, max_attempts=1, backoff_initial=0.01
    )
    with pytest.raises(ClusterUnreachable) as raised:
        TrainingJobClient(NAMESPACE, kube=kube).get("mnist")
    host = api.url.removeprefix("http://")
    assert str(raised.value) == f"cannot reach the Kubernetes API server at {host}: TLS handshake failed"


def test_list_suspend_resume_and_delete(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", JOBS, Reply(200, items_list([job("b"), job("a")], "7")))
    assert [j.name for j in client.list()] == ["a", "b"]
    api.script("PATCH", MNIST, Reply(200, job()), Reply(200, job()))
    client.suspend("mnist")
    client.resume("mnist")
    patches = api.requests("PATCH", MNIST)
    assert [p.json() for p in patches] == [{"spec": {"suspend": True}}, {"spec": {"suspend": False}}]
    assert {p.headers["Content-Type"] for p in patches} == {"application/merge-patch+json"}
    api.script(
        "DELETE", MNIST, Reply(200, job()), Reply(404, not_found("trainingjobs.ml.example.com", "mnist"))
    )
    api.script("GET", ALL_JOBS, Reply(200, items_list([], "8")))
    client.delete("mnist")
    with pytest.raises(JobNotFound):
        client.delete("mnist")
    assert api.requests("DELETE", MNIST)[0].json()["propagationPolicy"] == "Background"


def test_delete_and_wait_follows_the_job_until_it_is_gone(api: FakeApi, client: TrainingJobClient) -> None:
    current = job()
    api.script("GET", MNIST, Reply(200, current))
    api.script("DELETE", MNIST, Reply(200, current))
    api.script(
        "GET",
        JOBS,
        Stream((event("MODIFIED", changed(current, "11")), event("DELETED", changed(current, "12")))),
    )
    client.delete("mnist", wait=True)
    assert api.requests("DELETE", MNIST)[0].json()["propagationPolicy"] == "Foreground"


def test_a_configuration_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read kubeconfig .*nope: No such file or directory"):
        TrainingJobClient(kubeconfig=tmp_path / "nope")
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: gone\n")
    with pytest.raises(ConfigError, match=r"cannot use kubeconfig .*broken: "):
        TrainingJobClient(kubeconfig=broken)


def test_the_namespace_comes_from_the_kubeconfig_context(api: FakeApi, tmp_path: Path) -> None:
    path = kubeconfig_for(api, tmp_path / "kubeconfig", namespace="team-a")
    assert TrainingJobClient(kubeconfig=path).namespace == "team-a"
    assert TrainingJobClient("other", kubeconfig=path).namespace == "other"


# ------------------------------------------------------------------------------------------ watching


def test_watch_yields_the_job_then_each_status_change_until_it_finishes(
    api: FakeApi, client: TrainingJobClient
) -> None:
    current = job(state="Pending")
    running_ = changed(current, "11", state="Running")
    api.script("GET", MNIST, Reply(200, current))
    api.script(
        "GET",
        JOBS,
        Stream(
            (
                event("MODIFIED", changed(current, "11")),  # same status: nothing to show
                event("MODIFIED", running_),
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            )
        ),
        Stream((event("MODIFIED", changed(running_, "16", state="Completed", progress="100%")),)),
    )
    seen = [j.state for j in client.watch("mnist")]
    assert seen == ["Pending", "Running", "Completed"]
    first, second = watches(api)
    assert first["fieldSelector"] == "metadata.name=mnist"
    assert first["resourceVersion"] == "10"
    assert second["resourceVersion"] == "15"  # resumed after the server ended the watch, from the bookmark
    assert int(first["timeoutSeconds"]) > 0


def test_an_expired_watch_reads_the_job_again_and_goes_on(api: FakeApi, client: TrainingJobClient) -> None:
    current = job(state="Running")
    gone = {"type": "ERROR", "object": status(410, "Expired", "too old resource version: 10 (20)")}
    api.script("GET", MNIST, Reply(200, current), Reply(200, changed(current, "30", state="Restarting")))
    api.script(
        "GET", JOBS, Stream((gone,)), Stream((event("MODIFIED", changed(current, "31", state="Completed")),))
    )
    seen = [j.state for j in client.watch("mnist")]
    assert seen == ["Running", "Restarting", "Completed"]
    assert [w["resourceVersion"] for w in watches(api)] == ["10", "30"]


def test_a_deleted_job_ends_the_watch_with_job_deleted(api: FakeApi, client: TrainingJobClient) -> None:
    current = job(state="Running")
    api.script("GET", MNIST, Reply(200, current))
    api.script("GET", JOBS, Stream((event("DELETED", changed(current, "11")),)))
    with pytest.raises(
        JobDeleted, match='TrainingJob "mnist" in namespace "ns" was deleted while being watched'
    ):
        list(client.watch("mnist"))


def test_a_lost_connection_is_retried_then_reported(api: FakeApi, client: TrainingJobClient) -> None:
    current = job(state="Running")
    api.script("GET", MNIST, Reply(200, current))
    api.default("GET", JOBS, Drop())
    # A short backoff: no need to wait out the real one here.
    stream = JobWatch(client.kube, client.get("mnist").raw, reconnect_initial=0.001)
    with pytest.raises(ClusterUnreachable, match="cannot reach the Kubernetes API server"):
        list(stream)
    assert len(watches(api)) == 5


def test_close_from_another_thread_ends_a_quiet_watch(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")))
    api.script("GET", JOBS, Stream(stall=True))
    stream = client.watch("mnist")
    assert next(stream).state == "Running"

    def close_once_watching() -> None:
        api.wait_for_requests(1, "GET", JOBS)
        stream.close()

    closer = threading.Thread(target=close_once_watching)
    closer.start()
    assert list(stream) == []
    closer.join()
    assert stream.closed
