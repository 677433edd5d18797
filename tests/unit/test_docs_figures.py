"""The figures the docs state about the code, computed again from the code, so that none can go stale:
docs/schema.md's rule count, sizes, depth and bounds (from crd/), and the fuzz run's settings that
README and docs/fuzz.md name (from the Makefile and tests/fuzz/).

A size may be "about" right: it fails here when it is more than TOLERANCE off (a share in percent, more
than a point or two). A count or a setting must be exact.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any, Final

import pytest

from controller import manager
from controller.runtime import boundedjson, events
from crd import contract, kube_openapi, kube_schemas
from crd.contract import Condition, State
from crd.defaults import subschema
from crd.openapi import INT32_MAX
from crd.render import CRD_FILE_NAME, rules
from crd.schema import custom_resource_definition, open_api_schema
from tests.fuzz import judge
from tests.fuzz.harness import FuzzRun

REPO = Path(__file__).resolve().parents[2]
TOLERANCE: Final = 0.02
KIB: Final = 1024
ETCD_REQUEST_LIMIT: Final = 1.5 * 1024 * 1024
SCHEMA_DOC: Final = REPO / "docs" / "schema.md"
FUZZ_DOC: Final = REPO / "docs" / "fuzz.md"


def stated(text: str, pattern: str) -> str:
    """The one group of `pattern` in `text` (the figure a sentence states); fails if the sentence is gone."""
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} found {len(found)} times"
    return str(found[0])


def size_row(text: str, label: str) -> float:
    """The KiB a row of docs/schema.md's Size table states (`| <label> ... | about N KiB |`)."""
    return float(stated(text, rf"\| {re.escape(label)}[^|]* \| about ([\d.]+) KiB \|"))


def about(stated_value: float, actual: float) -> bool:
    return abs(stated_value - actual) <= TOLERANCE * actual


def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


# ------------------------------------------------------------------------------------- docs/schema.md


def test_schema_doc_counts_the_crds_rules() -> None:
    count = len(list(rules(open_api_schema(), "")))
    assert int(stated(SCHEMA_DOC.read_text(), r"the CRD's (\d+) CEL rules")) == count


def test_schema_doc_states_the_crds_sizes() -> None:
    text = SCHEMA_DOC.read_text()
    crd_bytes = compact(custom_resource_definition())
    sizes = {
        "the CustomResourceDefinition as JSON": crd_bytes,
        f"`crd/{CRD_FILE_NAME}`": (REPO / "crd" / CRD_FILE_NAME).stat().st_size,
        "`crd/kube_schemas.json`": kube_schemas.SCHEMAS_FILE.stat().st_size,
    }
    wrong = {
        label: (size_row(text, label), round(actual / KIB, 1))
        for label, actual in sizes.items()
        if not about(size_row(text, label), actual / KIB)
    }
    assert not wrong, f"stated KiB, actual KiB: {wrong}"
    share = float(stated(text, r"The CRD is about (\d+)% of the 1\.5 MiB etcd accepts"))
    assert abs(share - 100 * crd_bytes / ETCD_REQUEST_LIMIT) <= 1, crd_bytes


def test_schema_doc_states_the_generated_share() -> None:
    spec = open_api_schema()["properties"]["spec"]["properties"]
    generated = (
        spec["podTemplate"],
        spec["scheduling"]["properties"]["affinity"],
        spec["env"]["items"]["properties"]["valueFrom"],
    )
    share = 100 * sum(compact(part) for part in generated) / compact(custom_resource_definition())
    stated_share = float(stated(SCHEMA_DOC.read_text(), r"The generated part is about (\d+)% of it"))
    assert abs(stated_share - share) <= 2, share


def test_schema_doc_names_the_kubernetes_version_the_schemas_came_from() -> None:
    version = kube_schemas.generated_from()["kubernetesVersion"]
    assert (
        stated(SCHEMA_DOC.read_text(), r"together with the Kubernetes version it came\nfrom \((v[\d.]+),")
        == version
    )


def depth(path: str) -> int:
    return path.count(".") + path.count("[]") + path.count("{}")


def spec_paths(node: dict[str, Any], path: str) -> list[str]:
    paths = [path]
    for name, child in node.get("properties", {}).items():
        paths += spec_paths(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        paths += spec_paths(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        paths += spec_paths(node["additionalProperties"], f"{path}{{}}")
    return paths


def test_schema_and_limits_docs_state_the_deepest_field() -> None:
    paths = spec_paths(open_api_schema()["properties"]["spec"], "spec")
    deepest = max(depth(path) for path in paths)
    text = SCHEMA_DOC.read_text()
    assert int(stated(text, r"nests at most (\d+) levels below `spec`")) == deepest
    assert depth(stated(text, r"The deepest\npath is `([^`]+)`")) == deepest
    limits = (REPO / "docs" / "limits.md").read_text()
    assert int(stated(limits, r"than (\d+) levels below `spec`")) == deepest


def test_schema_doc_states_the_description_depth() -> None:
    words = {"two": 2, "three": 3, "four": 4, "five": 5}
    word = stated(SCHEMA_DOC.read_text(), r"kept in full down to (\w+) levels below each type")
    assert words[word] == kube_openapi.FULL_DESCRIPTION_DEPTH


def bounds_table(text: str) -> dict[str, str]:
    section = text[text.index("## Bounds") : text.index("## Nothing is free-form")]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return {what.strip(): bound.strip() for what, bound in rows[1:]}


def test_schema_doc_states_the_generated_bounds() -> None:
    k = kube_openapi
    length, items, properties = k.MAX_LENGTH, k.MAX_ITEMS, k.MAX_PROPERTIES
    assert length["Container.name"] == length["Volume.name"]
    assert length["EnvVar.value"] == length["Container.command"] == length["Container.args"]
    assert items["PodSpec.containers"] == items["PodSpec.initContainers"]
    assert items["Container.command"] == items["Container.args"]
    assert items["values"] == items["items"]
    assert properties["limits"] == properties["requests"]
    table = bounds_table(SCHEMA_DOC.read_text())
    expected = {
        "strings (default)": f"{k.DEFAULT_MAX_LENGTH} characters",
        "names (`name`)": (
            f"{length['name']}; container and volume names {length['Container.name']}, "
            f"port names {length['ContainerPort.name']}, env names {length['EnvVar.name']}"
        ),
        "env values, a container's `command` and `args` items": f"{length['EnvVar.value']} characters",
        "`volumeMounts[].mountPath`": f"{length['VolumeMount.mountPath']} characters",
        "label values": f"{length['labels']} characters; annotation values {length['annotations']}",
        "int-or-string values": (
            f"{k.INT_OR_STRING_MAX_LENGTH} characters; quantities {k.QUANTITY_MAX_LENGTH}"
        ),
        "lists (default)": f"{k.DEFAULT_MAX_ITEMS} items",
        "`containers`, `initContainers`": f"{items['PodSpec.containers']} each",
        "`imagePullSecrets`": f"{items['PodSpec.imagePullSecrets']}",
        "a container's `env`": (
            f"{items['Container.env']}; `envFrom` {items['Container.envFrom']}, `ports` "
            f"{items['Container.ports']}, `volumeMounts` {items['Container.volumeMounts']}, `command` "
            f"and `args` {items['Container.command']}"
        ),
        "`values` (selector values), `items` (ConfigMap/Secret keys)": f"{items['values']}",
        "maps (default: labels, annotations, nodeSelector, ...)": (
            f"{k.DEFAULT_MAX_PROPERTIES} keys; resource `limits`/`requests` {properties['limits']}"
        ),
    }
    integers = table.pop("integers (and the integer form of int-or-string)")
    assert integers.startswith(f"at most {INT32_MAX}, Kubernetes' int32"), integers
    assert table == expected


# ------------------------------------------------------------------------------- the fuzz run's settings


def make_default(variable: str) -> int:
    return int(stated((REPO / "Makefile").read_text(), rf"(?m)^{variable} \?= (\d+)$"))


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_fuzz_docs_state_the_runs_settings() -> None:
    text = FUZZ_DOC.read_text()
    examples, seed = (make_default(name) for name in ("FUZZ_EXAMPLES", "FUZZ_SEED"))
    line = stated(text, r"make fuzz +# ([\d,]+ manifests, seed \d+)")
    assert line == f"{examples:,} manifests, seed {seed}"
    readme = (REPO / "README.md").read_text()
    assert number(stated(readme, r"\| `make fuzz` \| ([\d,]+) generated bad TrainingJobs")) == examples
    sample = stated(text, r"runs a fixed-seed sample of the same test: (\d+) manifests")
    test_fuzz = (REPO / "tests" / "fuzz" / "test_fuzz.py").read_text()
    assert f'os.environ.get("FUZZ_EXAMPLES", "{sample}")' in test_fuzz


def test_fuzz_doc_states_the_harness_bounds() -> None:
    text = FUZZ_DOC.read_text()
    defaults = inspect.signature(FuzzRun).parameters
    assert int(stated(text, r"created in batches of (\d+)")) == defaults["batch_size"].default
    assert float(stated(text, r"within (\d+) s, a state")) == defaults["deadline"].default
    per_job, per_pod = re.findall(r"stay within (\d+) per job plus (\d+) per pod", text)[0]
    assert (int(per_job), int(per_pod)) == (judge.WRITES_PER_JOB, judge.WRITES_PER_POD)


@pytest.mark.parametrize("doc", ["schema.md", "fuzz.md"])
def test_the_docs_checked_here_say_so(doc: str) -> None:
    """A reader who changes a figure finds where it is checked (and so edits both)."""
    assert "tests/unit/test_docs_figures.py" in (REPO / "docs" / doc).read_text()


# --------------------------------------------------------------------------------- README's Events


def test_readme_states_how_events_are_folded() -> None:
    text = " ".join((REPO / "README.md").read_text().split())
    window = int(stated(text, r"the same Event again within (\d+) minutes raises its count"))
    similar = int(stated(text, r"from the (\d+)th different message of one reason within \d+ minutes"))
    again = int(stated(text, r"different message of one reason within (\d+) minutes on"))
    assert window * 60 == again * 60 == events.DEFAULT_WINDOW_SECONDS
    assert similar == manager.EVENT_MAX_SIMILAR


# ------------------------------------------------------------------------ the progress helper's files


def test_the_docs_name_and_count_the_progress_helpers_files() -> None:
    """examples/training/README.md says how many files to copy, docs/progress.md names the modules."""
    modules = sorted(path.stem for path in (REPO / "trainer" / "trainingjob_progress").glob("*.py"))
    words = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
    readme = " ".join((REPO / "examples" / "training" / "README.md").read_text().split())
    assert words[stated(readme, r"\(all (\w+) files of it\)")] == len(modules)
    progress = " ".join((REPO / "docs" / "progress.md").read_text().split())
    listed = stated(progress, r"and the modules it imports and the supervisor's \(([^:]+):")
    assert sorted(name.strip("` ") for name in listed.split(",")) == [m for m in modules if m != "__init__"]


# ------------------------------------------------------------------------ README's states and conditions


def test_readme_lists_every_state_and_condition() -> None:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Status") :]
    start = section.index("| state |")
    table = section[start : section.index("\n\n", start)]
    states = [line.split(" | ")[0].strip("| ") for line in table.splitlines()[2:] if line.startswith("| ")]
    assert states == [state.value for state in State]
    listed = stated(" ".join(section.split()), r"Conditions follow the API conventions: ([^.]+)\.")
    assert re.split(r", | and ", listed) == [condition.value for condition in Condition]


# ------------------------------------------------------------------------------------ docs/limits.md


def test_limits_doc_states_the_bounds_the_code_has() -> None:
    text = " ".join((REPO / "docs" / "limits.md").read_text().split())
    assert int(stated(text, r"Any value nested deeper than (\d+) levels")) == boundedjson.DEFAULT_MAX_DEPTH
    assert (
        int(stated(text, r"`metadata\.name` is a DNS-1035 label of at most (\d+)")) == contract.MAX_JOB_NAME
    )
    backoff = subschema("spec")["properties"]["failurePolicy"]["properties"]["restartBackoff"]
    multiplier = stated(text, r"`failurePolicy\.restartBackoff\.multiplier` is at most (\d+)")
    assert int(multiplier) == backoff["properties"]["multiplier"]["maximum"]


def test_readme_states_the_soak_and_chaos_runs_settings() -> None:
    readme = (REPO / "README.md").read_text()
    soak = re.search(r"\| `make soak` \| (\d+) jobs churning [^|]* for (\d+) minutes", readme)
    assert soak, "README's make soak row"
    assert (int(soak[1]), int(soak[2]) * 60) == (make_default("SOAK_JOBS"), make_default("SOAK_SECONDS"))
    chaos = re.search(
        r"\| `make chaos` \| (\d+) jobs, two replicas, (\d+) kills of the leader, (\d+) API", readme
    )
    assert chaos, "README's make chaos row"
    settings = ("CHAOS_JOBS", "CHAOS_LEADER_KILLS", "CHAOS_APISERVER_RESTARTS")
    assert tuple(int(value) for value in chaos.groups()) == tuple(make_default(name) for name in settings)
