"""The Helm chart (deploy/helm/trainingjob-operator) in tests: running helm, and comparing its output
with the kustomize install.

Why: the chart and deploy/'s kustomize tree describe the same install twice, so a change to one side
must fail a test until the other follows. `compare` says how a chart rendering differs from a kustomize
rendering once what Helm adds on purpose is set aside: its bookkeeping labels (release, chart, version,
managed-by, also in selectors), the annotation that keeps the CRD on uninstall, and the Namespace,
which a chart leaves to `kubectl create namespace` (deploy/README.md). The operator's arguments are
compared by meaning, parsed with the operator's own flag parser: the chart spells every flag out (its
values document them), kustomize only the ones that differ from the operator's defaults.

`Helm` runs the built helm binary with its cache, config and data directories inside a directory of
the test's, so tests never read or write the user's Helm set-up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from controller import cli
from tests.cluster import REPO

Manifest = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name

CHART: Final = REPO / "deploy" / "helm" / "trainingjob-operator"
RELEASE: Final = "trainingjob-operator"
NAMESPACE: Final = "trainingjob-system"
# The chart's values that select what each kustomize overlay adds (deploy/overlays/<name>).
OPTIONS: Final[Mapping[str, Manifest]] = {
    "monitoring": {"monitoring": {"enabled": True}},
    # The kustomize component's API server rule as shipped: no address (0.0.0.0/32) until `make deploy`
    # fills it in (the chart needs one, or looks it up in a cluster: tests/unit/test_network_policy.py).
    "network-policy": {
        "networkPolicy": {"enabled": True, "apiServer": {"addresses": ["0.0.0.0/32"], "ports": [6443]}}
    },
    "single-namespace": {"watchNamespace": "ml-training"},
}
# Labels Helm charts add to every object (and the chart to its selectors), absent from deploy/.
HELM_LABELS: Final = frozenset(
    {
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/version",
        "helm.sh/chart",
    }
)
HELM_ANNOTATIONS: Final = frozenset({"helm.sh/resource-policy"})
# Objects only the kustomize install has: the chart installs into a namespace that exists.
KUSTOMIZE_ONLY_KINDS: Final = frozenset({"Namespace"})


class HelmError(AssertionError):
    """helm exited non-zero; the message holds the command and its stderr."""

    def __init__(self, args: tuple[str, ...], stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)}: {stderr.strip()}")
        self.stderr = stderr


@dataclass(frozen=True)
class Helm:
    """The built helm, with its state under `home` and optionally a cluster's kubeconfig."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def attempt(
        self, *args: str, values: Manifest | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Runs helm; `values` go in as a values file on stdin (`-f -`)."""
        command = [str(self.binary), *args, *(["-f", "-"] if values is not None else [])]
        return subprocess.run(
            command,
            input=json.dumps(values) if values is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.environment(),
        )

    def run(self, *args: str, values: Manifest | None = None, timeout: float = 300) -> str:
        result = self.attempt(*args, values=values, timeout=timeout)
        if result.returncode != 0:
            raise HelmError(args, result.stderr)
        return result.stdout

    def template(
        self,
        values: Manifest | None = None,
        *,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        chart: Path = CHART,
    ) -> list[Manifest]:
        """`helm template`: the objects `helm install` would create, in order."""
        text = self.run("template", release, str(chart), "--namespace", namespace, values=values or {})
        return load_all(text)


def load_all(text: str) -> list[Manifest]:
    """The documents of a YAML stream; with libyaml when PyYAML has it (the CRD alone is 0.5 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


# ----------------------------------------------------------------------------------- comparison


def key(obj: Manifest) -> Key:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def without_helm_labels(value: Any) -> Any:
    """`value` with Helm's labels removed from every label map and selector in it."""
    if isinstance(value, list):
        return [without_helm_labels(item) for item in value]
    if not isinstance(value, dict):
        return value
    result = {}
    for name, item in value.items():
        if name in ("labels", "matchLabels", "selector") and _is_string_map(item):
            result[name] = {label: text for label, text in item.items() if label not in HELM_LABELS}
        else:
            result[name] = without_helm_labels(item)
    return result


def _is_string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())


def expanded(arg: str, env: Mapping[str, str]) -> str:
    """`arg` with `$(VAR)` references to `env` replaced, as the kubelet does (unknown ones stay)."""
    return re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), match.group(0)), arg)


def operator_settings(container: Manifest) -> Manifest:
    """What the operator makes of the container's arguments: every flag's value, defaults included,
    with `$(VAR)` references expanded from the container's env."""
    env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
    args = [expanded(arg, env) for arg in container["args"]]
    return dict(vars(cli.parser().parse(args, environ={})))


def normalised(obj: Manifest) -> Manifest:
    """`obj` as compared: without Helm's labels and annotations, the operator's args by meaning."""
    result: Manifest = without_helm_labels(json.loads(json.dumps(obj)))
    metadata = result["metadata"]
    annotations = {k: v for k, v in metadata.pop("annotations", {}).items() if k not in HELM_ANNOTATIONS}
    if annotations:
        metadata["annotations"] = annotations
    if result["kind"] == "Deployment":
        for container in result["spec"]["template"]["spec"]["containers"]:
            container["args"] = operator_settings(container)
    return result


def compare(chart: Iterable[Manifest], kustomize: Iterable[Manifest]) -> list[str]:
    """How the chart's objects differ from the kustomize install's, one line per difference."""
    ours = {key(obj): normalised(obj) for obj in chart}
    theirs = {key(obj): normalised(obj) for obj in kustomize if obj["kind"] not in KUSTOMIZE_ONLY_KINDS}
    problems = [f"only in the kustomize install: {k}" for k in sorted(theirs.keys() - ours.keys())]
    problems += [f"only in the chart: {k}" for k in sorted(ours.keys() - theirs.keys())]
    for shared in sorted(ours.keys() & theirs.keys()):
        problems += [f"{shared}: {line}" for line in differences(ours[shared], theirs[shared])]
    return problems


def differences(chart: Any, kustomize: Any, path: str = "") -> list[str]:
    """The paths at which two JSON values differ, with both sides' values (shortened)."""
    if isinstance(chart, dict) and isinstance(kustomize, dict):
        found: list[str] = []
        for name in sorted(chart.keys() | kustomize.keys(), key=str):
            found += differences(chart.get(name), kustomize.get(name), f"{path}.{name}")
        return found
    if isinstance(chart, list) and isinstance(kustomize, list) and len(chart) == len(kustomize):
        found = []
        for index, (left, right) in enumerate(zip(chart, kustomize, strict=True)):
            found += differences(left, right, f"{path}[{index}]")
        return found
    if chart == kustomize:
        return []
    return [f"{path or '<root>'}: chart {_short(chart)} != kustomize {_short(kustomize)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def one(objects: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    matches = [obj for obj in objects if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def operator_container(objects: Iterable[Manifest]) -> Manifest:
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def merged(*layers: Mapping[str, Any]) -> Manifest:
    """Values layered like Helm's -f files: later maps win, nested maps merge."""
    result: Manifest = {}
    for layer in layers:
        for name, value in layer.items():
            if isinstance(value, Mapping) and isinstance(result.get(name), dict):
                result[name] = merged(result[name], value)
            else:
                result[name] = json.loads(json.dumps(value))
    return result


def default_values() -> Manifest:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert isinstance(values, dict)
    return values


__all__ = [
    "CHART",
    "NAMESPACE",
    "OPTIONS",
    "RELEASE",
    "Helm",
    "HelmError",
    "compare",
    "default_values",
    "expanded",
    "load_all",
    "merged",
    "normalised",
    "one",
    "operator_container",
    "operator_settings",
]
