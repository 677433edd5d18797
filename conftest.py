"""Shared fixtures: one real local control plane per test process, one namespace per test.

Tests marked `cluster` get the control plane from hack/dev-cluster.sh: a running one is reused (and
left running); otherwise the session starts it and stops it at the end (unless TJ_KEEP_CLUSTER=1),
so a test run leaves no process behind. `make test` runs the suite in pytest-xdist workers, each with
a cluster of its own under `.dev/workers/` and the real node's tests in one of them
(tests/sessions.py); `pytest` alone runs it in one process on `.dev`'s cluster. The project's CRDs
are applied from crd/ and awaited until Established. Tests marked `components` get optional
components (helm) built from Go modules by hack/kube-bins.sh: minutes the first time on a machine,
then taken from the cache.

Tests that need Kueue or the coscheduling scheduler on the cluster ask for the `kueue` or
`coscheduling` fixture: the first such test of a session adds it to the session's cluster
(`hack/dev-cluster.sh up --with <name>`, a no-op when it runs already; built the first time), and
it stays for the rest of the session. Those tests are marked `components` too.

Tests that need the real node's container images (testbed/images: pause, busybox, base, operator,
trainer-torch) take the `node_images` fixture: each image is built on first use (minutes cold), then
taken from the cache under ~/.cache/trainingjob-operator/images. Building them needs root. Those
tests are marked `components`. The session's real node starts with the images its first tests use
(TJ_NODE_IMAGES: FIRST_NODE_IMAGES, what `make test` builds before the session); a test that needs
another names it in its `images` marker (or takes a fixture of FIXTURE_IMAGES), and a real-node test
gets the ones the node can hold imported before it runs (`up --with real-node --images ...`).

Once the tests are collected, the optional components and images the selected tests will need and
that are not cached yet are built in the background at the lowest CPU priority, in the order the
tests need them (testbed/cluster/kube_bins.py BackgroundBuilds; their progress in
.dev/background-builds.log): on a cold machine they use the CPU the cluster tests leave idle, and the
fixture of the first test that needs one waits for its build instead of starting it, and the modules
that need one run after all others. The session stops what still builds when it ends.
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import sessions

# Before anything imports the testbed (it reads TJ_DEV_DIR once): an xdist worker's own cluster dir.
sessions.use_worker_dir()
# TensorBoard without TensorFlow in every test process (its no-TensorFlow mode: the module
# tensorboard.compat.notf exists), before anything imports tensorboard: the tests read event files
# (and torch's SummaryWriter writes them) with TensorBoard's own stub, as in the torch trainer image,
# which has no TensorFlow. With TensorFlow loaded by TensorBoard, torch loading its own LLVM later in
# the same process aborts it ("LLVM ERROR: ... registered more than once").
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from crd import contract  # noqa: E402
from testbed import (  # noqa: E402
    BUILDS,
    FIRST_NODE_IMAGES,
    IMAGE_NAMES,
    MLFLOW,
    NETWORK_POLICIES,
    NODE_IMAGES,
    REAL_NODE,
    REGISTRY,
    BackgroundBuilds,
    Cluster,
    Image,
    Kubectl,
    component_binary,
    ensure_image,
    image_build,
    uncached,
    wait_for,
)
from tests.cluster import DEV, REPO, SESSION, require_optional  # noqa: E402

CRD_DIR = REPO / "crd"
# The images the session's real node starts with (`up --with real-node` reads it); the others are
# imported before the first test that needs them (`images_on_the_real_node`).
os.environ.setdefault("TJ_NODE_IMAGES", ",".join(FIRST_NODE_IMAGES))


def crd_files() -> list[Path]:
    return sorted(path for path in CRD_DIR.glob("*.yaml") if path.name != "kustomization.yaml")


def install_crds(kubectl: Kubectl) -> None:
    """crd/'s files: the CRDs (waited for until Established) and the trainers' admission policy."""
    for path in crd_files():
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(path))
        for name in kubectl.run("get", "-f", str(path), "-o", "name").split():
            if name.startswith("customresourcedefinition"):
                kubectl.run("wait", "--for=condition=Established", "--timeout=60s", name)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Kubectl]:
    """An admin kubectl for the session's control plane, with the project's CRDs Established."""
    if sessions.worker_dir(os.environ) is None:
        refused = sessions.claim_session(DEV)
        if refused:
            pytest.exit(refused, returncode=2)
    started_here = not SESSION.running()
    SESSION.up()
    kubectl = SESSION.kubectl
    try:
        install_crds(kubectl)
        yield kubectl
    finally:
        if started_here and os.environ.get("TJ_KEEP_CLUSTER") != "1":
            SESSION.down()


def running_components() -> list[str]:
    """The optional components the session's cluster runs (Kueue, the real node, the registry...), as
    its state records them; none when it does not run."""
    try:
        recorded = SESSION.state().get("optional") or []
    except FileNotFoundError:
        return []
    return [str(name) for name in recorded]


@pytest.fixture(autouse=True)
def session_components_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """What the session's cluster runs before a cluster test, it runs after it. The session fixtures
    add a component once (the real node, the registry on it, ...); a test that takes one away (make
    demo takes the real node off, and with it what runs on it; a test of `remove`) and puts back
    less, or fails midway, would otherwise leave every later test of its worker without it."""
    if "cluster" not in request.fixturenames:
        yield
        return
    before = running_components()
    yield
    missing = [name for name in before if name not in running_components()]
    if missing:
        SESSION.up(*missing)


def _namespace_name(node_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", node_name.lower()).strip("-")
    return f"t-{slug[:40].strip('-')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods are refused until then); deleted after."""
    name = _namespace_name(request.node.name)
    cluster.run("create", "namespace", name)
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: cluster.get_or_none("serviceaccount", "default", "-n", name),
        timeout=60,
    )
    try:
        yield name
    finally:
        release_tracked_pods(cluster, name)
        cluster.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def release_tracked_pods(cluster: Kubectl, namespace: str) -> None:
    """Takes the operator's tracking finalizer off the namespace's pods, as an admin does once no
    operator runs for them (docs/accounting.md): the test's operator is gone by now, and held pods
    would keep the namespace, and their nodes' GPUs, for the rest of the session."""
    listed = cluster.attempt("get", "pods", "-n", namespace, "-o", "json")
    if listed.returncode != 0:
        return
    for pod in json.loads(listed.stdout).get("items", []):
        finalizers = pod["metadata"].get("finalizers") or []
        if contract.TRACKING_FINALIZER in finalizers:
            position = finalizers.index(contract.TRACKING_FINALIZER)
            patch = [
                {
                    "op": "test",
                    "path": f"/metadata/finalizers/{position}",
                    "value": contract.TRACKING_FINALIZER,
                },
                {"op": "remove", "path": f"/metadata/finalizers/{position}"},
            ]
            cluster.attempt(
                "patch",
                "pod",
                pod["metadata"]["name"],
                "-n",
                namespace,
                "--type=json",
                "-p",
                json.dumps(patch),
            )


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    return cluster


@pytest.fixture(scope="session")
def kueue(cluster: Kubectl) -> Kubectl:
    """The session's cluster with Kueue running: its CRDs, its controller manager, its webhooks."""
    require_optional("kueue")
    return cluster


@pytest.fixture(scope="session")
def coscheduling(cluster: Kubectl) -> Kubectl:
    """The session's cluster with the PodGroup CRD and the scheduler-plugins scheduler running as
    `scheduler-plugins-scheduler` (the coscheduling plugin)."""
    require_optional("coscheduling")
    return cluster


@pytest.fixture(scope="session")
def volcano(cluster: Kubectl) -> Kubectl:
    """The session's cluster with Volcano's CRDs, its scheduler running as `volcano` and its queue
    controller (testbed/addons/volcano.py)."""
    require_optional("volcano")
    return cluster


@pytest.fixture(scope="session")
def real_node(cluster: Kubectl) -> Kubectl:
    """The session's cluster with its real node (kubelet, containerd, CNI, CoreDNS; testbed/cluster/
    realnode.py) running, added by the first test that asks for it. Where the machine cannot run one
    (no root, no cgroup v1 hierarchies, a missing tool), the test is skipped with the reason."""
    reasons = REAL_NODE.missing_prerequisites()
    if reasons:
        pytest.skip("the real node cannot run here: " + "; ".join(reasons))
    sessions.claim_real_node(say=lambda line: print(line, file=sys.stderr, flush=True), cluster_dir=DEV)
    require_optional("real-node")
    return cluster


# The real node's images this session imported after the node started (a module's tests share them).
_imported_images: set[str] = set()


@pytest.fixture(autouse=True)
def images_on_the_real_node(request: pytest.FixtureRequest) -> None:
    """The images a real-node test names (its `images` marker) in the node's containerd before it
    runs: the session's node started with FIRST_NODE_IMAGES, and the others were built meanwhile in
    the background (an `ensure` here waits for a build still running). Images the node does not hold
    itself (MLflow's, the previous operator's) are left to their fixtures."""
    if "real_node" not in request.fixturenames:
        return
    missing = images_to_import(images_marked(request.node), _imported_images)
    if not missing:
        return
    request.getfixturevalue("real_node")
    SESSION.up("real-node", images=missing)
    _imported_images.update(missing)


def images_marked(item: pytest.Item) -> tuple[str, ...]:
    """The images a test's `images` markers name, each once."""
    return tuple(dict.fromkeys(name for mark in item.iter_markers("images") for name in mark.args))


def images_to_import(marked: tuple[str, ...], imported: set[str]) -> tuple[str, ...]:
    """Of the images a real-node test names, those the node holds itself (NODE_IMAGES) that the
    session did not import yet, each once; the session's node started with FIRST_NODE_IMAGES."""
    wanted = (name for name in marked if name in NODE_IMAGES and name not in FIRST_NODE_IMAGES)
    return tuple(dict.fromkeys(name for name in wanted if name not in imported))


@pytest.fixture(scope="session")
def network_policies(real_node: Kubectl) -> Kubectl:
    """The session's cluster with NetworkPolicies enforced on its real node (kube-network-policies,
    testbed/node/netpolicies.py) and the API server's endpoint one hop off the node, added by the
    first test that asks for it. Skipped with the reason where the machine cannot run it."""
    reasons = NETWORK_POLICIES.missing_prerequisites()
    if reasons:
        pytest.skip("NetworkPolicies cannot be enforced here: " + "; ".join(reasons))
    require_optional(NETWORK_POLICIES.name)
    return real_node


@pytest.fixture(scope="session")
def registry(real_node: Kubectl) -> Kubectl:
    """The session's cluster with the image registry its real node pulls from (the CNCF distribution
    project's, testbed/node/registry.py: TLS from the cluster's CA, htpasswd), added by the first
    test that asks for it; tests push to it and pull with `testbed.REGISTRY`."""
    reasons = REGISTRY.missing_prerequisites()
    if reasons:
        pytest.skip("the registry cannot run here: " + "; ".join(reasons))
    require_optional(REGISTRY.name)
    return real_node


@pytest.fixture(scope="session")
def mlflow_server(real_node: Kubectl) -> Kubectl:
    """The session's cluster with MLflow's tracking server on its real node (testbed/addons/mlflow.py:
    SQLite, artifacts served on a claim; `testbed.MLFLOW` says where), added by the first test that
    asks for it; its image is built on first use (about 3.5 minutes cold, then cached)."""
    require_optional(MLFLOW.name)
    return real_node


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary built from Go modules (hack/kube-bins.sh ensure helm), built on first use."""
    return component_binary("helm")


@pytest.fixture(scope="session")
def kubeflow_operator() -> Path:
    """Kubeflow's training-operator binary (the bench's peer), built from Go modules on first use."""
    return component_binary(BUILDS["training-operator"])


@pytest.fixture(scope="session")
def node_images() -> Callable[[str], Image]:
    """The real node's images by name (testbed/images), each built on first use in the session (root
    only: debootstrap, chroot and buildah's mount namespace need it)."""
    if os.geteuid() != 0:
        pytest.skip("building the real node's images needs root (debootstrap, chroot, buildah)")
    built: dict[str, Image] = {}

    def image(name: str) -> Image:
        if name not in built:
            built[name] = ensure_image(name)
        return built[name]

    return image


# Fixtures that need something built or started, and the marker their tests get.
FIXTURE_MARKERS = {
    "cluster": pytest.mark.cluster,
    "helm": pytest.mark.components,
    "kubeflow_operator": pytest.mark.components,
    "kueue": pytest.mark.components,
    "coscheduling": pytest.mark.components,
    "volcano": pytest.mark.components,
    "node_images": pytest.mark.components,
    "real_node": pytest.mark.real_node,
    "network_policies": pytest.mark.components,
    "registry": pytest.mark.components,
    "mlflow_server": pytest.mark.components,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests using the cluster fixture are marked `cluster`, those using a built component (helm,
    kueue, coscheduling, the node images) `components`, those on the real node `real_node` and
    `components` (it is built too): `-m "not cluster and not components"` runs the unit tests alone
    (`make unit`). On a machine that has not built every optional component the selected tests need,
    the modules that need one run last (`later_when_uncached`). In parallel runs (`make test`) each
    cluster test gets its xdist group (tests/sessions.py): the real node's, or its module's; first,
    so that xdist files the test under it."""
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
                if fixture == "real_node":
                    item.add_marker(pytest.mark.components)
        if getattr(config.option, "loadgroup", False) and item.get_closest_marker("cluster"):
            module = item.nodeid.split("::")[0]
            marked = item.get_closest_marker("real_node") is not None
            item.add_marker(pytest.mark.xdist_group(sessions.group_of(module, _fixtures(item), marked)))
    needs = [(item.nodeid.split("::")[0], _components(item)) for item in items]
    wanted = {component for _, components in needs for component in components}
    uncached = {component for component in wanted if component in _uncached(wanted)}
    if uncached:
        items[:] = [items[index] for index in later_when_uncached(needs, uncached)]
    items[:] = [
        items[index] for index in cpu_bound_last([bool(i.get_closest_marker("cpu_bound")) for i in items])
    ]


def _uncached(components: set[str]) -> set[str]:
    """The components not cached: as the session's controller found them before its workers started
    (every worker must collect the same tests in the same order, whatever a build finishes meanwhile),
    else as the cache says now."""
    found = os.environ.get(sessions.UNCACHED)
    if found is not None:
        return set(filter(None, found.split(","))) | sessions.read_uncached(os.environ)
    return set(uncached(sorted(components)))


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a parallel run holds the session's cluster directory and tells its workers
    which components are not cached yet."""
    if sessions.worker_dir(os.environ) is not None or not config.getoption("numprocesses", None):
        return
    refused = sessions.claim_session(DEV)
    if refused:
        pytest.exit(refused, returncode=2)
    components = sorted(set(FIXTURE_BUILDS.values()) | set(BUILDS.values()))
    os.environ[sessions.UNCACHED] = ",".join(uncached(components))
    if os.geteuid() == 0:  # the images are built (and waited for) where they can be
        images = [image_build(name) for name in IMAGE_NAMES if name not in FIRST_NODE_IMAGES]
        sessions.publish_uncached(DEV / "uncached-images", lambda: uncached(images), os.environ)


def _fixtures(item: pytest.Item) -> tuple[str, ...]:
    return tuple(getattr(item, "fixturenames", ()))


def _components(item: pytest.Item) -> tuple[str, ...]:
    declared = tuple(component for mark in item.iter_markers("builds") for component in mark.args)
    return components_needed(_fixtures(item), declared, images_marked(item))


# Fixtures that need an optional component built, and the component (hack/kube-bins.sh ensure NAME).
FIXTURE_BUILDS = {
    "helm": "helm",
    "coscheduling": BUILDS["coscheduling"],
    "kueue": BUILDS["kueue"],
    "volcano": BUILDS["volcano"],
    "kubeflow_operator": BUILDS["training-operator"],
    "network_policies": BUILDS["network-policies"],
    "registry": BUILDS["registry"],
}
# Fixtures that need one of the real node's images beyond FIRST_NODE_IMAGES, and the image
# (testbed/images: MLflow's server's).
FIXTURE_IMAGES = {"mlflow_server": "mlflow"}
BACKGROUND_BUILDS = pytest.StashKey[BackgroundBuilds]()


def components_needed(
    fixtures: tuple[str, ...], declared: tuple[str, ...] = (), images: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The optional components a test needs built: its fixtures', then those its `builds` marker
    names (a test that installs one itself midway, through `require_optional`), then the images
    (`image:NAME`) its fixtures and its `images` marker name beyond FIRST_NODE_IMAGES (those are
    built before the session), each once."""
    from_fixtures = tuple(component for fixture, component in FIXTURE_BUILDS.items() if fixture in fixtures)
    named_images = [image for fixture, image in FIXTURE_IMAGES.items() if fixture in fixtures] + list(images)
    wanted = [
        *declared,
        *(image_build(image) for image in named_images if image not in FIRST_NODE_IMAGES),
    ]
    return from_fixtures + tuple(dict.fromkeys(c for c in wanted if c not in from_fixtures))


def builds_in_order_of_need(components_per_test: list[tuple[str, ...]]) -> list[str]:
    """The components the tests need, each once, in the order the tests run."""
    needed: list[str] = []
    for components in components_per_test:
        needed.extend(component for component in components if component not in needed)
    return needed


def later_when_uncached(needs: list[tuple[str, tuple[str, ...]]], uncached: set[str]) -> list[int]:
    """The order to run tests in, given each test's module and the components it needs: the modules
    none of whose tests needs an `uncached` component first, then the others, each group in its
    collected order and every module kept whole. On a cold machine the background builds then have
    the time all other modules take instead of making the first test that needs one wait."""
    waiting = {module for module, components in needs if uncached.intersection(components)}
    first = [index for index, (module, _) in enumerate(needs) if module not in waiting]
    return first + [index for index, (module, _) in enumerate(needs) if module in waiting]


def cpu_bound_last(cpu_bound: list[bool]) -> list[int]:
    """The order to run tests in: those marked `cpu_bound` (minutes of training on the CPU) after all
    others, each part in its order. In `make test` they are the last of the real node's group, which
    ends after the other workers: they then have the machine's cores to themselves instead of sharing
    them with every cluster starting up (the advanced example took 287 s there, first in its group)."""
    return [i for i, heavy in enumerate(cpu_bound) if not heavy] + [
        i for i, heavy in enumerate(cpu_bound) if heavy
    ]


def pytest_collection_finish(session: pytest.Session) -> None:
    # In a parallel run, the first worker builds for all (each collects every test).
    if session.config.option.collectonly or os.environ.get(sessions.WORKER, "gw0") != "gw0":
        return
    needed = builds_in_order_of_need([_components(item) for item in session.items])
    missing = _uncached(set(needed)) if needed else set()  # as the controller found: no keys again
    builds = BackgroundBuilds([c for c in needed if c in missing], DEV / "background-builds.log")
    session.config.stash[BACKGROUND_BUILDS] = builds
    builds.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    builds = session.config.stash.get(BACKGROUND_BUILDS, None)
    if builds is not None:
        builds.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller of a parallel run, once its workers are gone: what a worker could not stop is
    stopped. A run interrupted with Ctrl-C ends its workers after a few seconds, whatever their
    fixtures were tearing down (a cluster, the real node, background builds); each worker's
    directory is swept here, so that the interrupted run leaves nothing on the machine."""
    if sessions.worker_dir(os.environ) is not None or not config.getoption("numprocesses", None):
        return
    if os.environ.get("TJ_KEEP_CLUSTER") == "1":
        return
    for directory in sorted((DEV / "workers").glob("gw*")):
        BackgroundBuilds.stop_left_behind(directory / "background-builds.log")
        Cluster(directory).script("down", check=False, quiet=True)  # a no-op when its worker stopped it


__all__ = [
    "DEV",
    "cluster",
    "coscheduling",
    "helm",
    "install_crds",
    "kubectl",
    "kubeflow_operator",
    "kueue",
    "mlflow_server",
    "namespace",
    "network_policies",
    "node_images",
    "real_node",
    "registry",
    "volcano",
]
