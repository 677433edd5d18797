"""The testbed's one front door: tests/ and conftest.py import only the names in `testbed.__all__`.

Why: the testbed (testbed/) is a package of its own with a small API; its modules are its own to
change. A test that reached past the API (`from testbed.node import nodeconfig`) would tie the suite to
an internal again, as tests/e2e was tied to fifteen of hack/'s. This reads every import of the suite
(its syntax tree, not text), as tests/unit/test_module_sizes.py reads the modules' sizes. The testbed's
own tests (testbed/tests/) test its internals and are not held to it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = [REPO / "conftest.py", *sorted((REPO / "tests").rglob("*.py"))]


def api() -> list[str]:
    """`testbed.__all__`, read from testbed/__init__.py (this module does not import the testbed)."""
    for node in ast.parse((REPO / "testbed" / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            return [str(ast.literal_eval(element)) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError("testbed/__init__.py has no __all__")


def imports_of_testbed(path: Path) -> list[tuple[int, str, list[str]]]:
    """Each import of the testbed in `path`: its line, the module imported from, the names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "testbed" or node.module.startswith("testbed."):
                found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "testbed" or alias.name.startswith("testbed."):
                    found.append((node.lineno, alias.name, []))
    return found


def test_the_suite_imports_the_testbed_only_through_its_api() -> None:
    allowed = set(api())
    outside = []
    for path in SUITE:
        for line, module, names in imports_of_testbed(path):
            where = f"{path.relative_to(REPO)}:{line}"
            if module != "testbed" or not names:
                outside.append(f"{where} imports {module} (only `from testbed import NAME` is the API)")
            outside += [
                f"{where} imports testbed.{name}, not in __all__" for name in names if name not in allowed
            ]
    assert outside == []


def test_the_suite_does_import_the_testbed() -> None:
    """The check above reads real imports: conftest.py and the e2e helpers use the API."""
    assert imports_of_testbed(REPO / "conftest.py")
    assert sum(len(imports_of_testbed(path)) for path in SUITE) > 50


def test_an_import_past_the_api_is_found(tmp_path: Path) -> None:
    module = tmp_path / "test_reaching_in.py"
    module.write_text(
        "from testbed import Cluster\nfrom testbed.node import nodeconfig\nimport testbed.common\n"
        "def f():\n    from testbed import nodeconfig\n"
    )
    assert imports_of_testbed(module) == [
        (1, "testbed", ["Cluster"]),
        (2, "testbed.node", ["nodeconfig"]),
        (3, "testbed.common", []),
        (5, "testbed", ["nodeconfig"]),
    ]


def test_the_testbeds_readme_describes_every_name_of_the_api() -> None:
    readme = (REPO / "testbed" / "README.md").read_text(encoding="utf-8")
    assert [name for name in api() if f"`{name}`" not in readme] == []


def test_the_api_imports_with_the_standard_library_alone_and_has_every_name() -> None:
    """hack/dev-cluster.sh runs `python3 -m testbed.cluster`, which imports the package first, before
    any dependency is installed: without site-packages (-S), in isolated mode (-I), it still imports,
    and each name of `__all__` is there."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); import testbed; "
        "print(','.join(name for name in testbed.__all__ if hasattr(testbed, name)))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(",") == api()
