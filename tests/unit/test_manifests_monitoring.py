"""Checks of monitoring/ without Prometheus running: `promtool check rules` and `promtool test rules`,
the PrometheusRule generated from monitoring/alerts.yaml is up to date, and every metric the alerts
and the dashboard name is one that controller/metrics.py publishes.

Split out of tests/unit/test_manifests.py.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest
import trainingjob_progress as tp
import yaml
from prometheus_client import CollectorRegistry

from controller.metrics import Metrics
from crd import contract
from monitoring import generate
from tests.cluster import REPO
from tests.e2e.operator_identity import NAMESPACE
from tests.unit.manifests_support import (
    ALERT_TESTS,
    ALERTS,
    DASHBOARD,
    Manifest,
    one,
    rendered,
)

# ----------------------------------------------------------------------------------- monitoring

PROMQL_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
     "offset", "inf", "nan", "atan2"}
)  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a tokenizer, not a parser; promtool checks syntax)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        word = match.group(0)
        if word.lower() in PROMQL_KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue
        names.add(word)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{job=~"$job", x="by (y)"}[$__rate_interval]))', {"a_bucket"}),
        ("b > 0 and on (namespace, training_job) c{state='Running'}", {"b", "c"}),
        ("x unless x offset 10m", {"x"}),
        ("absent(up_metric) or vector(1) * 2e3", {"up_metric"}),
        ("sum without (pod) (m1) / ignoring (code) group_left (q) m2", {"m1", "m2"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


@functools.cache
def published_metric_names() -> frozenset[str]:
    """Every series name the operator's registry exposes (controller/metrics.py), collectors included."""
    metrics = Metrics()
    metrics.track_jobs(list)
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return frozenset(names)


def test_published_metric_names_include_the_known_ones() -> None:
    names = published_metric_names()
    assert {
        "trainingjob_jobs",
        "trainingjob_failed_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "rest_client_requests_total",
        "trainingjob_gpu_utilization_percent",
    } <= names
    assert not any(name.endswith("_created") for name in names)


def alert_rules() -> list[Manifest]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in rules["groups"] for rule in group["rules"]]


def dashboard() -> Manifest:
    value = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


def dashboard_panels() -> list[Manifest]:
    panels: list[Manifest] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return [panel for panel in panels if panel["type"] != "row"]


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"panel {panel['id']} ({panel['title']}) {target['refId']}", target["expr"])
        for panel in dashboard_panels()
        for target in panel["targets"]
    ]


def label_values_selectors() -> list[str]:
    selectors = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert found, f"variable {variable['name']}: unexpected query {query}"
        selectors.append(found.group(1))
    return selectors


def test_alerts_and_dashboard_name_only_published_metrics() -> None:
    known = published_metric_names()
    unknown = [
        f"{where}: {name}"
        for where, expr in [
            *((f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()),
            *dashboard_exprs(),
            *(("templating", selector) for selector in label_values_selectors()),
        ]
        for name in sorted(promql_metric_names(expr))
        if name not in known
    ]
    assert not unknown, "metrics controller/metrics.py does not publish:\n" + "\n".join(unknown)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: `make promtool` installs it (Debian package prometheus)")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> None:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_promtool_checks_the_alerting_rules() -> None:
    run_promtool("check", "rules", str(ALERTS))


def test_alerts_behave_as_their_unit_tests_say(tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    run_promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    cases = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    tested = {case["alertname"] for test in cases for case in test.get("alert_rule_test", [])}
    untested = {rule["alert"] for rule in alert_rules()} - tested
    assert not untested, f"alerts without a promtool test: {sorted(untested)}"


def test_alerts_cover_the_seed_and_the_operator() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert "trainingjob_failed_total" in alerts["TrainingJobFailed"]["expr"]
    assert 'state=~"Pending' in alerts["TrainingJobsPendingTooLong"]["expr"]
    assert 'reason="stall"' in alerts["TrainingJobStalled"]["expr"]
    assert "leader_election_master_status" in alerts["TrainingJobOperatorNoLeader"]["expr"]
    assert "leader_election_master_status" in alerts["TrainingJobOperatorDown"]["expr"]
    errors = alerts["TrainingJobOperatorReconcileErrors"]["expr"]
    assert "controller_runtime_reconcile_errors_total" in errors
    assert "workqueue_depth" in alerts["TrainingJobOperatorWorkqueueGrowing"]["expr"]
    assert "trainingjob_gpu_utilization_percent" in alerts["TrainingJobLowGPUUtilization"]["expr"]
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"].get("summary"), name
        assert rule["annotations"].get("description"), name


def test_the_gpu_alert_and_panel_say_where_their_data_comes_from() -> None:
    """The GPU utilisation series is the operator's, made from the key rank 0 reports: the alert, the
    panel, the helper and docs/progress.md name the same metric and key as the operator's code."""
    key, series = contract.GPU_UTILIZATION_METRIC, "trainingjob_gpu_utilization_percent"
    assert key == tp.GPU_UTILIZATION
    assert f'GPU_UTILIZATION ("{key}", percent)' in (tp.Reporter.report.__doc__ or "")
    registry = CollectorRegistry()
    job = {"metadata": {"namespace": "ml", "name": "j"}, "status": {"metrics": {key: 61.5}}}
    Metrics(registry, process_metrics=False).track_jobs(lambda: [job])
    assert registry.get_sample_value(series, {"namespace": "ml", "training_job": "j"}) == 61.5
    alert = next(rule for rule in alert_rules() if rule["alert"] == "TrainingJobLowGPUUtilization")
    [panel] = [panel for panel in dashboard_panels() if series in json.dumps(panel.get("targets"))]
    for text in (alert["annotations"]["description"], panel["description"]):
        assert series in text
        assert key in text
        assert "docs/progress.md" in text
    assert "DCGM" in panel["description"]
    progress_doc = (REPO / "docs" / "progress.md").read_text(encoding="utf-8")
    for needle in (f"`{key}`", f"`{series}", "TrainingJobLowGPUUtilization", "DCGM_FI_DEV_GPU_UTIL"):
        assert needle in progress_doc, needle


def test_dashboard_expressions_are_valid_promql(tmp_path: Path) -> None:
    """promtool checks each panel query, as a recording rule, once Grafana's variables are substituted."""
    rules = [
        {"record": f"dashboard:panel_{index}", "expr": re.sub(r"\$__\w+", "5m", expr)}
        for index, (_, expr) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    run_promtool("check", "rules", str(path))


def test_dashboard_has_datasource_templating_and_the_required_panels() -> None:
    board = dashboard()
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == datasource, variable["name"]
    panels = dashboard_panels()
    ids = [panel["id"] for panel in board["panels"]] + [p["id"] for p in panels if p not in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == datasource, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"] == datasource for target in panel["targets"]), panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
    exprs = " ".join(expr for _, expr in dashboard_exprs())
    for needed in (
        "trainingjob_jobs",
        "trainingjob_progress_percent",
        "trainingjob_restarts_total",
        "histogram_quantile(0.5, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "sum by (code) (rate(rest_client_requests_total",
    ):
        assert needed in exprs, f"no panel shows {needed}"


def test_prometheusrule_is_generated_from_the_rules_file() -> None:
    assert set(generate.outputs()) == {generate.PROMETHEUS_RULE, generate.CHART_ALERTS}
    for path, text in generate.outputs().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} is out of date: run `make generate-monitoring`"
        )
    rule = one(rendered("deploy/overlays/monitoring"), "PrometheusRule")
    assert rule["spec"] == {"groups": yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]}
    assert rule["metadata"]["namespace"] == NAMESPACE
