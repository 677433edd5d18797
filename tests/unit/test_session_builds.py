"""The session's background builds (conftest.py): which optional components and real node images the
selected tests need, in the order they run, and which modules wait until last on a machine that has
not built them.

Why apart from the testbed's tests of the builds themselves (testbed/tests/test_kube_bins.py): the
fixtures and the markers that name the components are the suite's, in conftest.py.
"""

from __future__ import annotations

from conftest import (
    builds_in_order_of_need,
    components_needed,
    cpu_bound_last,
    images_to_import,
    later_when_uncached,
)
from testbed import FIRST_NODE_IMAGES


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


def test_the_images_beyond_the_nodes_first_ones_are_built_in_the_background_in_order_of_need() -> None:
    """`make test` builds the real node's first images before the session (FIRST_NODE_IMAGES); the
    others a test names, by its `images` marker or by a fixture (MLflow's server), are built while
    the tests run, in the same line as the Go components."""
    assert FIRST_NODE_IMAGES == ("pause", "busybox", "base", "operator", "trainer-torch")
    tests = [
        components_needed(("real_node",)),
        components_needed(("real_node",), images=("base", "operator", "trainer-torch")),
        components_needed(("real_node", "kueue"), images=("trainer-tensorflow", "trainer-jax")),
        components_needed(("real_node",), images=("trainer-mpi",)),
        components_needed(("real_node", "mlflow_server")),
        components_needed(("real_node", "registry"), images=("operator-previous", "operator")),
        components_needed(("real_node",), images=("trainer-xgboost", "trainer-paddle", "trainer-jax")),
    ]
    assert tests[:2] == [(), ()]
    assert tests[2] == ("kueue", "image:trainer-tensorflow", "image:trainer-jax")
    assert builds_in_order_of_need(tests) == [
        "kueue",
        "image:trainer-tensorflow",
        "image:trainer-jax",
        "image:trainer-mpi",
        "image:mlflow",
        "registry",
        "image:operator-previous",
        "image:trainer-xgboost",
        "image:trainer-paddle",
    ]
    assert components_needed((), ("kueue",), ("trainer-mpi", "trainer-mpi")) == ("kueue", "image:trainer-mpi")


def test_real_node_modules_that_need_an_uncached_image_run_after_the_others_of_the_group() -> None:
    """The real node's tests run one after another in one worker, in the collected order: a module
    whose image is still being built goes after those that have theirs, as for a Go component."""
    needs = [
        ("testbed/tests/test_real_node.py", ()),
        ("tests/e2e/test_frameworks_real_node.py", ("image:trainer-tensorflow", "image:trainer-jax")),
        (
            "tests/e2e/test_frameworks_real_node.py",
            ("kueue", "image:trainer-tensorflow", "image:trainer-jax"),
        ),
        ("tests/e2e/test_mlflow_real_node.py", ("image:mlflow",)),
        ("tests/e2e/test_mpi_real_node.py", ("image:trainer-mpi",)),
        ("tests/e2e/test_real_node_pods.py", ()),
        ("tests/e2e/test_upgrade_real_node.py", ("registry", "image:operator-previous")),
    ]
    assert later_when_uncached(needs, {"image:trainer-mpi", "image:mlflow"}) == [0, 1, 2, 5, 6, 3, 4]
    assert later_when_uncached(needs, {"image:trainer-jax"}) == [0, 3, 4, 5, 6, 1, 2]


def test_a_real_node_test_gets_the_node_images_it_names_imported_once_per_session() -> None:
    """What the node holds itself is imported by `up --with real-node --images`; MLflow's and the
    previous operator's images are their fixtures' (a Deployment's, a registry push's)."""
    assert images_to_import(("trainer-tensorflow", "trainer-jax"), set()) == (
        "trainer-tensorflow",
        "trainer-jax",
    )
    assert images_to_import(("trainer-tensorflow", "trainer-jax"), {"trainer-jax"}) == ("trainer-tensorflow",)
    assert images_to_import(("mlflow", "operator-previous", "operator", "trainer-torch"), set()) == ()
    assert images_to_import(("trainer-mpi", "trainer-mpi"), set()) == ("trainer-mpi",)


def test_cpu_bound_tests_run_after_all_others_each_part_in_its_order() -> None:
    assert cpu_bound_last([True, False, False, True, False]) == [1, 2, 4, 0, 3]
    assert cpu_bound_last([False, False]) == [0, 1]
