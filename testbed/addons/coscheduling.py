"""The scheduler-plugins scheduler as the dev cluster's second scheduler, with the coscheduling plugin.

Why: gang scheduling is only proven when a real coscheduling plugin binds a PodGroup's pods all or
nothing. The scheduler is scheduler-plugins' build of kube-scheduler (hack/kube-bins.sh component
`scheduler-plugins`), set up the way that project's "as a second scheduler" chart does: one profile
named `scheduler-plugins-scheduler` (pods opt in with spec.schedulerName; the kube-scheduler keeps
every other pod), Coscheduling enabled at every extension point and PrioritySort disabled, because
Coscheduling sorts the queue itself (by priority, then by PodGroup). The PodGroup CRD comes from
the same module version.

What differs from that chart: the process runs on 127.0.0.1 with the cluster's admin credentials
(the chart's ServiceAccount and RBAC are not applied), the scheduler-plugins controller that fills
in PodGroup status (phase, counts) is not run (the plugin does not read status), and Permit waits
10 s for a gang's missing members (the chart's value; the plugin's default is 60 s), so a gang that
cannot fit releases what it reserved quickly in tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from testbed.cluster.state import KUBECONFIG

NAME: Final = "coscheduling"
BUILD: Final = "scheduler-plugins"
SCHEDULER_NAME: Final = "scheduler-plugins-scheduler"
PERMIT_WAITING_SECONDS: Final = 10
CRD_FILES: Final = ("manifests/coscheduling/crd.yaml",)


def scheduler_configuration() -> dict[str, Any]:
    """The KubeSchedulerConfiguration (JSON is YAML, which the scheduler reads). The client settings
    live here: with --config the scheduler ignores its deprecated --kubeconfig and --kube-api-* flags."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        # The kube-scheduler's rate (testbed/cluster/components.py): gangs of hundreds of pods.
        "clientConnection": {"kubeconfig": str(KUBECONFIG), "qps": 500, "burst": 1000},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "PrioritySort"}],
                    }
                },
                "pluginConfig": [
                    {
                        "name": "Coscheduling",
                        "args": {"permitWaitingTimeSeconds": PERMIT_WAITING_SECONDS},
                    }
                ],
            }
        ],
    }


def scheduler_args(port: int, config: Path) -> list[str]:
    kubeconfig = str(KUBECONFIG)
    return [
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--v=1",
    ]
