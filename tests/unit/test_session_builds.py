"""The session's background builds (conftest.py): which optional components the selected tests need,
in the order they run, and which modules wait until last on a machine that has not built them.

Why apart from the testbed's tests of the builds themselves (testbed/tests/test_kube_bins.py): the
fixtures and the markers that name the components are the suite's, in conftest.py.
"""

from __future__ import annotations

from conftest import builds_in_order_of_need, components_needed, later_when_uncached


def test_the_session_builds_what_its_tests_need_once_in_the_order_they_run() -> None:
    tests = [
        ("namespace",),
        ("kueue", "cluster"),
        ("helm",),
        ("kueue",),
        ("kubeflow_operator",),
        ("coscheduling",),
        ("volcano", "cluster"),
    ]
    assert builds_in_order_of_need([components_needed(fixtures) for fixtures in tests]) == [
        "kueue",
        "helm",
        "training-operator",
        "scheduler-plugins",
        "volcano",
    ]
    assert builds_in_order_of_need([components_needed(("cluster",)), components_needed(("real_node",))]) == []


def test_a_test_that_installs_a_component_midway_names_it_in_its_marker() -> None:
    """tests/e2e/test_discovery_e2e.py installs Kueue while the operator runs: no fixture says so."""
    assert components_needed(("namespace",), ("kueue",)) == ("kueue",)
    assert components_needed(("kueue",), ("kueue", "scheduler-plugins", "kueue")) == (
        "kueue",
        "scheduler-plugins",
    )


def test_modules_that_need_an_uncached_component_run_last_whole_and_in_their_order() -> None:
    needs = [
        ("tests/e2e/test_a.py", ()),
        ("tests/e2e/test_kueue.py", ()),  # its module needs Kueue: it goes with it
        ("tests/e2e/test_kueue.py", ("kueue",)),
        ("tests/e2e/test_helm.py", ("helm",)),
        ("tests/e2e/test_b.py", ()),
        ("tests/e2e/test_coscheduling.py", ("scheduler-plugins",)),
        ("tests/unit/test_c.py", ()),
    ]
    assert later_when_uncached(needs, {"kueue", "scheduler-plugins"}) == [0, 3, 4, 6, 1, 2, 5]
    assert later_when_uncached(needs, set()) == list(range(len(needs)))
    assert components_needed(("namespace", "kueue", "coscheduling")) == ("scheduler-plugins", "kueue")
