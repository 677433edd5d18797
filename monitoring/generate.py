"""Writes the monitoring component's PrometheusRule, and the Helm chart's copy of the rules, from
monitoring/alerts.yaml.

Why: the alerting rules must exist as a plain Prometheus rules file (for `promtool`, and for Prometheus
servers that are not run by the Prometheus Operator) and as a PrometheusRule object in deploy/, for
kustomize and for the Helm chart. Neither kustomize nor Helm reads files outside its directory, so
instead of copying the rules by hand this module renders the kustomize object from the rules file and
copies the file into the chart (whose template builds the object); `make generate-monitoring` runs it
and a test fails when a committed output differs from what it renders.

    python -m monitoring.generate           # rewrite the outputs
    python -m monitoring.generate --check   # exit 1 when one is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

import yaml

REPO: Final = Path(__file__).resolve().parent.parent
ALERTS: Final = REPO / "monitoring" / "alerts.yaml"
PROMETHEUS_RULE: Final = REPO / "deploy" / "components" / "monitoring" / "prometheusrule.yaml"
CHART_ALERTS: Final = REPO / "deploy" / "helm" / "trainingjob-operator" / "files" / "alerts.yaml"
HEADER: Final = (
    "# Generated from monitoring/alerts.yaml by `make generate-monitoring`; do not edit by hand.\n"
)
CHART_HEADER: Final = (
    "# Copied from monitoring/alerts.yaml by `make generate-monitoring` for the Helm chart's\n"
    "# PrometheusRule (templates/prometheusrule.yaml); do not edit by hand.\n"
)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL expressions) as literal blocks, so they stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def load_rules(path: Path = ALERTS) -> dict[str, Any]:
    """The rules file as a dict with its `groups`."""
    rules = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        raise ValueError(f"{path} holds no rule groups")
    return rules


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object carrying `rules`' groups unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "trainingjob-operator",
            "namespace": "trainingjob-system",
            "labels": {
                "app.kubernetes.io/name": "trainingjob-operator",
                "app.kubernetes.io/part-of": "trainingjob-operator",
            },
        },
        "spec": {"groups": rules["groups"]},
    }


def render(path: Path = ALERTS) -> str:
    """The text of deploy/components/monitoring/prometheusrule.yaml."""
    body = yaml.dump(
        prometheus_rule(load_rules(path)),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=4096,
    )
    return HEADER + body


def chart_copy(path: Path = ALERTS) -> str:
    """The text of the Helm chart's files/alerts.yaml: the rules file as it is, under a header."""
    load_rules(path)
    return CHART_HEADER + path.read_text(encoding="utf-8")


def outputs() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    return {PROMETHEUS_RULE: render(), CHART_ALERTS: chart_copy()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when an output is out of date")
    args = parser.parse_args(argv)
    stale = [
        (path, text)
        for path, text in outputs().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    for path, text in stale:
        if args.check:
            print(f"{path.relative_to(REPO)} is out of date: run `make generate-monitoring`")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
