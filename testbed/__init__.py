"""The test bed: a real Kubernetes control plane on 127.0.0.1 with fake GPU nodes and one real node,
the real node's container images, the optional components built from Go modules, and the programs
that drive the operator on it (demo, bench, chaos, soak). See testbed/README.md.

Not the product: nothing here is installed with the operator or shipped in its image. The programs
run as modules from the repository (`python -m testbed.cluster` through hack/dev-cluster.sh,
`python -m testbed.images`, `python -m testbed.harness.bench`, ...).

This module is the testbed's one API: the names in `__all__` are what tests/ and conftest.py may
import (tests/unit/test_testbed_api.py reads their imports and holds them to it); everything else is
the testbed's own. Standard library only, like the control plane, so importing it costs nothing
before `python3 -m testbed.cluster` runs.
"""

from testbed.addons.mlflow import MLFLOW
from testbed.addons.multikueue import multikueue_cluster
from testbed.addons.multikueue import start_worker as start_worker_cluster
from testbed.addons.multikueue import stop_worker as stop_worker_cluster
from testbed.addons.multikueue import worker_lost_timeout as kueue_worker_lost_timeout
from testbed.addons.optional import BUILDS_BY_NAME as BUILDS
from testbed.cluster.handle import Cluster, throwaway_cluster
from testbed.cluster.kube_bins import BackgroundBuilds, component_binary, image_build, is_cached, uncached
from testbed.cluster.kubectl import Kubectl, KubectlError, WaitTimeout, wait_for
from testbed.cluster.kwok import (
    add_disruption_condition,
    end_pod,
    fake_node,
    lose_node,
    patch_pod_status,
    restore_node,
)
from testbed.cluster.pki import serving_certificate
from testbed.cluster.podstatus import now_rfc3339
from testbed.common import free_port, http_get, http_ok, listening_addresses, pid_running
from testbed.images import NAMES as IMAGE_NAMES
from testbed.images import Image
from testbed.images import ensure as ensure_image
from testbed.images.previous import PREVIOUS_COMMIT as PREVIOUS_OPERATOR_COMMIT
from testbed.images.trainer import trainer_image
from testbed.node.nodeimages import FIRST_IMAGES as FIRST_NODE_IMAGES
from testbed.node.nodeimages import IMAGES as NODE_IMAGES
from testbed.node.placement import (
    NETWORK_POLICIES,
    PYTHON_IMAGE,
    REAL_NODE,
    REGISTRY,
    claim_directory,
    container_states,
    is_ready,
    pod_on_node,
    pod_processes,
    terminated,
)

__all__ = [
    "BUILDS",
    "FIRST_NODE_IMAGES",
    "IMAGE_NAMES",
    "MLFLOW",
    "NETWORK_POLICIES",
    "NODE_IMAGES",
    "PREVIOUS_OPERATOR_COMMIT",
    "PYTHON_IMAGE",
    "REAL_NODE",
    "REGISTRY",
    "BackgroundBuilds",
    "Cluster",
    "Image",
    "Kubectl",
    "KubectlError",
    "WaitTimeout",
    "add_disruption_condition",
    "claim_directory",
    "component_binary",
    "container_states",
    "end_pod",
    "ensure_image",
    "fake_node",
    "free_port",
    "http_get",
    "http_ok",
    "image_build",
    "is_cached",
    "is_ready",
    "kueue_worker_lost_timeout",
    "listening_addresses",
    "lose_node",
    "multikueue_cluster",
    "now_rfc3339",
    "patch_pod_status",
    "pid_running",
    "pod_on_node",
    "pod_processes",
    "restore_node",
    "serving_certificate",
    "start_worker_cluster",
    "stop_worker_cluster",
    "terminated",
    "throwaway_cluster",
    "trainer_image",
    "uncached",
    "wait_for",
]
