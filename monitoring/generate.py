"""Writes the monitoring component's PrometheusRule from monitoring/alerts.yaml.

Why: the alerting rules must exist twice, as a plain Prometheus rules file (for `promtool`, and for
Prometheus servers that are not run by the Prometheus Operator) and as a PrometheusRule object in
deploy/. Kustomize cannot read files outside its directory, so instead of copying the rules by hand
this module renders the object from the rules file; `make generate-monitoring` runs it and a test
fails when the committed object differs from what it renders.

    python -m monitoring.generate           # rewrite the PrometheusRule
    python -m monitoring.generate --check   # exit 1 when it is out of date
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
HEADER: Final = (
    "# Generated from monitoring/alerts.yaml by `make generate-monitoring`; do not edit by hand.\n"
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
            "labels": {"app.kubernetes.io/name": "trainingjob-operator"},
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the PrometheusRule is out of date")
    args = parser.parse_args(argv)
    text = render()
    current = PROMETHEUS_RULE.read_text(encoding="utf-8") if PROMETHEUS_RULE.exists() else ""
    if args.check:
        if current != text:
            print(f"{PROMETHEUS_RULE.relative_to(REPO)} is out of date: run `make generate-monitoring`")
            return 1
        return 0
    if current != text:
        PROMETHEUS_RULE.write_text(text, encoding="utf-8")
        print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
