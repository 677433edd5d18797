"""The informer transforms keep what the controller reads and nothing it would miss.

The pod transform drops the spec (most of a Pod's size) and the job's configuration annotation; these
tests prove the planner decides the same with transformed pods in every phase of a job's life, so the
memory saving cannot change behaviour.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import replace

from controller.planner import Plan, plan
from controller.runtime import fastjson
from controller.runtime.delivery import compact
from controller.watches import node_readiness, pod_essentials
from tests.unit.lifecycle_world import World, make_node, world


def planned_with_transformed_pods(scene: World) -> tuple[Plan, Plan]:
    observed = scene.observed()
    transformed = replace(observed, pods=[pod_essentials(copy.deepcopy(pod)) for pod in observed.pods])
    return plan(observed, scene.settings), plan(transformed, scene.settings)


def assert_same_decisions(scene: World) -> None:
    raw, reduced = planned_with_transformed_pods(scene)
    assert reduced.status == raw.status
    assert [obj["metadata"]["name"] for obj in reduced.creates] == [
        obj["metadata"]["name"] for obj in raw.creates
    ]
    assert reduced.deletes == raw.deletes
    assert reduced.events == raw.events
    assert reduced.requeue_after == raw.requeue_after


def test_pod_essentials_keep_metadata_node_and_status_only() -> None:
    scene = world()
    scene.step()
    scene.bind(0)
    pod = scene.pod(0)
    original = copy.deepcopy(pod)
    reduced = pod_essentials(pod)
    assert reduced["metadata"] == original["metadata"]
    assert pod == original  # the event's own object is left as it was
    assert reduced["status"] == pod["status"]
    assert reduced["spec"] == {"nodeName": pod["spec"]["nodeName"]}
    assert len(repr(reduced)) < len(repr(pod)) / 3


def test_the_planner_decides_the_same_on_transformed_pods_through_a_jobs_life() -> None:
    scene = world({"failurePolicy.restartBackoff.initialDelaySeconds": 1})
    scene.step()
    assert_same_decisions(scene)
    scene.bind(0, 1)
    assert_same_decisions(scene)
    scene.start(0, 1)
    scene.step()
    assert_same_decisions(scene)
    scene.report(0, epoch=1, totalEpochs=4, metrics={"loss": 0.5}, checkpoint="/checkpoints/epoch-1")
    assert_same_decisions(scene)
    scene.exit(1, code=137, reason="OOMKilled")
    assert_same_decisions(scene)
    scene.step()
    assert_same_decisions(scene)


def test_lost_node_and_unschedulable_pods_are_judged_the_same() -> None:
    scene = world()
    scene.step()
    scene.unschedulable(0)
    scene.bind(1)
    assert_same_decisions(scene)
    scene.start(1)
    scene.set_node_ready("node-1", None)
    assert_same_decisions(scene)


def test_node_readiness_keeps_the_ready_condition() -> None:
    node = make_node("gpu-node-1", ready=None)
    node["status"]["capacity"] = {"nvidia.com/gpu": "8"}
    node["status"]["images"] = [{"names": ["big"], "sizeBytes": 1}]
    reduced = node_readiness(node)
    assert reduced["status"]["conditions"][0]["status"] == "Unknown"
    assert "images" not in reduced["status"]


def test_decoded_and_compacted_objects_share_keys_and_short_strings_and_keep_values() -> None:
    text = json.dumps(
        {
            "metadata": {"labels": {"training-job": "bert"}},
            "status": {"phase": "Running"},
            "message": "x" * 200,
            "items": [{"type": "Ready", "status": "True"}],
            "count": 3,
        }
    )
    first, second = compact(fastjson.loads(text)), compact(fastjson.loads(text))
    assert first == json.loads(text)
    first_keys = {id(key) for key in first["metadata"]["labels"]} | {id(key) for key in first["status"]}
    second_keys = {id(key) for key in second["metadata"]["labels"]} | {id(key) for key in second["status"]}
    assert first_keys == second_keys
    assert first["status"]["phase"] is second["status"]["phase"]
    assert first["items"][0]["status"] is second["items"][0]["status"]
    assert first["message"] is not second["message"]  # long strings are left alone


def test_compact_changes_the_object_in_place() -> None:
    decoded = fastjson.loads(b'{"status": {"conditions": [{"type": "Ready", "status": "True"}]}}')
    status, condition = decoded["status"], decoded["status"]["conditions"][0]
    compacted = compact(decoded)
    assert compacted is decoded
    assert compacted["status"] is status
    assert compacted["status"]["conditions"][0] is condition
    assert condition["status"] is sys.intern("True")
