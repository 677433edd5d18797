"""What the previous version wrote, this one still reads: the labels, annotations and finalizers it put
on objects, and every field of its CRD, with the same type and default.

Why: an upgrade (docs/upgrade.md) leaves the previous version's objects in place, and the new operator
takes them over as they are; an upgrade test (tests/e2e/test_upgrade_real_node.py) proves it for one
pair of versions on the real node, these checks hold every change against the pinned previous version
(testbed/images/previous.py) at once. A renamed label, annotation or finalizer needs a migration of
the old objects (docs/upgrade.md lists them); a field removed, retyped or given another default is not
a change within v1 (docs/api.md, "Changing the API within v1").
"""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from crd import contract
from crd.render import CRD_FILE_NAME, type_name, walk
from crd.schema import custom_resource_definition, open_api_schema_of
from testbed import PREVIOUS_OPERATOR_COMMIT
from tests.cluster import REPO

JsonDict = dict[str, Any]
WRITTEN_SUFFIXES = ("_LABEL", "_ANNOTATION", "_FINALIZER")


def previous_file(path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "show", f"{PREVIOUS_OPERATOR_COMMIT}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def written_names(namespace: dict[str, Any]) -> dict[str, str]:
    """The contract's label, annotation and finalizer names, by constant."""
    return {
        name: value
        for name, value in namespace.items()
        if name.endswith(WRITTEN_SUFFIXES) and isinstance(value, str)
    }


def fields(crd: JsonDict) -> dict[str, tuple[str, object]]:
    """Every field of the CRD's schema: its type and its default."""
    return {
        path: (type_name(node), node.get("default")) for path, node, _ in walk(open_api_schema_of(crd), "")
    }


def test_the_previous_versions_labels_annotations_and_finalizers_are_still_read() -> None:
    previous: dict[str, Any] = {}
    exec(compile(previous_file("crd/contract.py"), "previous contract.py", "exec"), previous)  # noqa: S102
    current = set(written_names(vars(contract)).values())
    gone = {name: value for name, value in written_names(previous).items() if value not in current}
    assert gone == {}, "renamed or dropped: migrate the objects that carry them (docs/upgrade.md)"


def test_every_field_of_the_previous_crd_is_kept_with_its_type_and_default() -> None:
    (previous_crd,) = [doc for doc in yaml.safe_load_all(previous_file(f"crd/{CRD_FILE_NAME}")) if doc]
    before, now = fields(previous_crd), fields(custom_resource_definition())
    assert len(before) > 100
    changed = {path: (was, now.get(path)) for path, was in before.items() if now.get(path) != was}
    assert changed == {}, "not a change within v1 (docs/api.md, 'Changing the API within v1')"
