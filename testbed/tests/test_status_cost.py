"""The status-write cost measurement (testbed/harness/bench/statuscost.py): its rule-free CRD is the real one
without rules, its status is one the CRD accepts as it is, and its summary reads the rounds right."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crd import contract
from crd.immutability import IMMUTABLE_FIELDS
from testbed.common import REPO, ToolError
from testbed.harness.bench import statuscost
from tests.unit.crd_schema_checks import ROOT, schema_error_paths, unknown_field_paths

CRD = yaml.safe_load((REPO / "crd" / "trainingjobs.ml.example.com.yaml").read_text())


def test_each_variant_is_the_crd_under_its_own_group_with_only_the_rules_it_keeps() -> None:
    total = statuscost.count_rules(CRD)
    assert total > 50
    rule_free = statuscost.VARIANTS["no_rules"]
    copied = statuscost.with_rules(CRD, rule_free)
    assert statuscost.count_rules(copied) == 0
    assert copied["metadata"] == {"name": f"{contract.PLURAL}.rule-free.{contract.GROUP}"}
    assert copied["spec"]["group"] == rule_free.group == rule_free.resource.group
    assert copied["spec"]["names"] == CRD["spec"]["names"]
    assert statuscost.count_rules(CRD) == total  # the original is left as it was
    properties = copied["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert set(properties) == set(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"])

    assert "oldSelf" not in yaml.safe_dump(CRD)  # immutability is the admission policy's
    before = statuscost.with_rules(CRD, statuscost.VARIANTS["immutability_as_transition_rules"])
    assert statuscost.count_rules(before) == total + len(IMMUTABLE_FIELDS)
    spec_rules = before["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    transition = [rule for rule in spec_rules["x-kubernetes-validations"] if "oldSelf" in rule["rule"]]
    assert [rule["message"] for rule in transition] == [f"{f.name} is immutable" for f in IMMUTABLE_FIELDS]
    assert statuscost.with_rules(CRD, statuscost.VARIANTS["as_shipped"])["spec"] == CRD["spec"]


def test_the_status_written_is_one_the_crd_accepts_whole() -> None:
    job = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": "job-0"},
        "spec": statuscost.spec_from(None),
        "status": statuscost.running_status(12345, workers=4),
    }
    assert schema_error_paths(job) == []
    assert list(unknown_field_paths(job, ROOT)) == []  # nothing the API server would prune


def test_an_example_gives_its_spec_and_a_manifest_without_a_trainingjob_is_refused(tmp_path: Path) -> None:
    example = REPO / "examples" / "trainingjob-elastic.yaml"
    assert statuscost.spec_from(example)["elastic"]["minWorkers"] == 2
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ToolError, match="holds no TrainingJob"):
        statuscost.spec_from(other)


def test_the_summary_takes_medians_per_variant_and_the_api_servers_ratio() -> None:
    before, after = {"kube-apiserver": 10.0, "etcd": 5.0}, {"kube-apiserver": 10.5, "etcd": 5.1}
    assert statuscost.per_write_micros(before, after, 1000) == {"etcd": 100, "kube-apiserver": 500}
    rounds = [
        ("all_rules", {"kube-apiserver": 500, "etcd": 100}),
        ("no_rules", {"kube-apiserver": 400, "etcd": 90}),
        ("no_rules", {"kube-apiserver": 420, "etcd": 110}),
        ("all_rules", {"kube-apiserver": 560, "etcd": 120}),
        ("all_rules", {"kube-apiserver": 520, "etcd": 80}),
        ("no_rules", {"kube-apiserver": 380, "etcd": 100}),
    ]
    summary = statuscost.summarize(rounds)
    assert summary["median_cpu_micros_per_write"] == {
        "all_rules": {"kube-apiserver": 520, "etcd": 100},
        "no_rules": {"kube-apiserver": 400, "etcd": 100},
    }
    assert summary["apiserver_ratio_to_no_rules"] == {"all_rules": 1.3, "no_rules": 1.0}
