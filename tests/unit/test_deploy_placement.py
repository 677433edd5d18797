"""`make deploy`'s image and placement (IMG, IMAGE_PULL_SECRETS, NODE_SELECTOR, TOLERATE in
hack/deploy.sh), without a cluster: `hack/deploy.sh render` prints what `make deploy` would apply.

Why: platform teams run system components on tainted, labelled nodes, from an image in a registry of
their own that may ask for credentials, and the Helm chart offers that through its image,
imagePullSecrets, nodeSelector and tolerations values. The kustomize install offers the same through
its variables, so the two must render the same install (compared as tests/helmchart.py compares the
chart with the overlays), and a malformed variable must stop the script, naming it, before anything
is rendered or applied. tests/e2e/test_deploy_real_node.py deploys with them onto the real node.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Final

import pytest

from testbed import wait_for
from tests.cluster import REPO
from tests.e2e.operator_identity import project_kubectl
from tests.helmchart import OPTIONS, Helm, compare, load_all, one
from tests.unit import helm_support

chart = helm_support.chart

Manifest = dict[str, Any]

IMAGE: Final = "registry.example:5000/ml/trainingjob-operator:1.2.3"
# Each form TOLERATE takes, as `kubectl taint` writes a taint, and the toleration it stands for.
TOLERATE: Final = "dedicated=system:NoSchedule,ml.example.com/real-node:NoSchedule,spot=yes,gpu"
TOLERATIONS: Final = [
    {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"},
    {"key": "ml.example.com/real-node", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "spot", "operator": "Equal", "value": "yes"},
    {"key": "gpu", "operator": "Exists"},
]
NODE_SELECTOR: Final = "pool=system,topology.kubernetes.io/zone=zone-a"
SELECTED: Final = {"pool": "system", "topology.kubernetes.io/zone": "zone-a"}


def deploy_script(action: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECTL": str(project_kubectl()), **variables}
    return subprocess.run(
        [str(REPO / "hack" / "deploy.sh"), action],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def rendered(**variables: str) -> list[Manifest]:
    result = deploy_script("render", **variables)
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


@pytest.mark.parametrize("overlay", ["", "single-namespace"])
def test_placement_renders_what_the_charts_values_render(chart: Helm, overlay: str) -> None:
    ours = rendered(
        IMG=IMAGE,
        IMAGE_PULL_SECRETS="registry-credentials,mirror",
        NODE_SELECTOR=NODE_SELECTOR,
        TOLERATE=TOLERATE,
        OVERLAY=overlay,
    )
    repository, tag = IMAGE.rsplit(":", 1)
    values: Manifest = {
        "image": {"repository": repository, "tag": tag},
        "imagePullSecrets": [{"name": "registry-credentials"}, {"name": "mirror"}],
        "nodeSelector": SELECTED,
        "tolerations": TOLERATIONS,
        **(OPTIONS[overlay] if overlay else {}),
    }
    assert compare(chart.template(values), ours) == []
    pod = one(ours, "Deployment")["spec"]["template"]["spec"]
    # Added to the base's selector, as Helm merges the value into the chart's default.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", **SELECTED}
    assert pod["tolerations"] == TOLERATIONS
    assert pod["containers"][0]["image"] == IMAGE
    # hack/deploy.sh removes it once rendered; another test process may be rendering one meanwhile.
    wait_for(
        "no throwaway kustomization left behind", lambda: not list(REPO.glob(".dev-deploy.*")), timeout=30
    )


def test_without_the_variables_render_is_the_default_install() -> None:
    pod = one(rendered(), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in pod
    assert "imagePullSecrets" not in pod
    assert pod["containers"][0]["image"] == "trainingjob-operator:0.1.0"


def test_image_still_sets_the_image_and_img_wins() -> None:
    """IMAGE, the variable's name before IMG, still works; given both, IMG (kubebuilder's) is used."""
    pod = one(rendered(IMAGE=IMAGE), "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == IMAGE
    both = one(rendered(IMAGE="old/name:1", IMG=IMAGE), "Deployment")["spec"]["template"]["spec"]
    assert both["containers"][0]["image"] == IMAGE


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"NODE_SELECTOR": "pool"}, "NODE_SELECTOR: 'pool' is not a node label key=value"),
        ({"NODE_SELECTOR": "pool=system,,zone=a"}, "NODE_SELECTOR: '' is not a node label key=value"),
        ({"NODE_SELECTOR": "pool=sys tem"}, "NODE_SELECTOR: 'pool=sys tem'"),
        ({"NODE_SELECTOR": 'pool="x"'}, "NODE_SELECTOR: 'pool=\"x\"'"),
        ({"TOLERATE": "dedicated:NoRun"}, "TOLERATE: 'dedicated:NoRun' is not a taint key[=value][:Effect]"),
        ({"TOLERATE": "-dedicated"}, "TOLERATE: '-dedicated'"),
        ({"TOLERATE": "a=b=c"}, "TOLERATE: 'a=b=c'"),
        ({"IMAGE_PULL_SECRETS": "Registry_Credentials"}, "IMAGE_PULL_SECRETS: 'Registry_Credentials' is not"),
        ({"IMAGE_PULL_SECRETS": "a,,b"}, "IMAGE_PULL_SECRETS: '' is not a Secret's name"),
    ],
)
def test_a_malformed_variable_is_refused_naming_it(variables: dict[str, str], message: str) -> None:
    result = deploy_script("render", **variables)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert result.stdout == ""
