"""Volcano's scheduler and its queue controller on the dev cluster: their command lines and settings.

Why: gang scheduling and queue capacity with Volcano are only proven when the real Volcano scheduler
binds a PodGroup's pods all or none and holds a PodGroup whose queue has no room (hack/kube-bins.sh
component `volcano`, with its CRDs from the same module). Volcano's install runs three Deployments;
here two processes on 127.0.0.1 with the cluster's admin kubeconfig:

- the scheduler (`volcano`, the scheduler name pods ask for) with the actions and plugins of
  Volcano's default configuration (enqueue, allocate, backfill; gang, priority, conformance, drf,
  predicates, proportion, nodeorder, binpack): `proportion` keeps a Queue within its `capability`,
  `gang` binds a PodGroup's minMember pods together or none. It creates the `default` Queue itself;
- the controller manager with only its queue controller (`volcano-controllers`): it keeps each
  Queue's status (its state Open or Closed, the count of PodGroups by phase) and opens and closes
  queues on the bus Commands `vcctl queue operate` creates. Its job, job-flow and job-template
  controllers (Volcano's own Job kinds), its PodGroup controller (PodGroups for pods that name none)
  and its garbage collector have nothing to do for TrainingJobs, which make their own PodGroups.

Volcano's admission webhooks are not run (nor built): the PodGroup webhook only fills in a missing
`queue`, and the operator always writes one; the others concern Volcano's Jobs, Queues' validation and
pods of Volcano's own resource groups.

Every listener on 127.0.0.1: each binary's health check (`--healthz-address`, plain HTTP, enabled
with `--enable-healthz`); the scheduler's metrics server (`--listen-address`) is off by default
(`--enable-metrics=false`), and is given 127.0.0.1 all the same. Leader election off, and the
scheduler's cache dumper (which writes to /tmp on a signal) off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from testbed.cluster.state import KUBECONFIG

NAME: Final = "volcano"
BUILD: Final = "volcano"
# The second process of the component: the controller manager with the queue controller.
CONTROLLERS: Final = "volcano-controllers"
SCHEDULER_BINARY: Final = "scheduler"
CONTROLLERS_BINARY: Final = "controller-manager"
SCHEDULER_NAME: Final = "volcano"
CRD_DIR: Final = "config/crd/volcano/bases"
DEFAULT_QUEUE: Final = "default"

# Volcano's default scheduler configuration (its scheduler's built-in one), as a file.
SCHEDULER_CONF: Final = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""


def scheduler_args(*, healthz_port: int, metrics_port: int, conf: Path) -> list[str]:
    return [
        f"--kubeconfig={KUBECONFIG}",
        f"--scheduler-conf={conf}",
        f"--scheduler-name={SCHEDULER_NAME}",
        f"--default-queue={DEFAULT_QUEUE}",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{healthz_port}",
        "--enable-metrics=false",
        f"--listen-address=127.0.0.1:{metrics_port}",
        "--leader-elect=false",
        "--cache-dumper=false",
        "--schedule-period=1s",
        # The kube-scheduler's rate (testbed/cluster/components.py): gangs of hundreds of pods.
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        "--v=2",
    ]


def controllers_args(*, healthz_port: int) -> list[str]:
    return [
        f"--kubeconfig={KUBECONFIG}",
        "--controllers=queue-controller",
        f"--scheduler-name={SCHEDULER_NAME}",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{healthz_port}",
        "--leader-elect=false",
        "--v=2",
    ]


def health_url(state: dict[str, Any], process: str) -> str:
    """The health check of `process` (`volcano` or `volcano-controllers`), on the port `status` shows."""
    return f"http://127.0.0.1:{state['ports'][process]}/healthz"
