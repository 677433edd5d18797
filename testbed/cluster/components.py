"""The command lines of the dev cluster's components: pure functions of the ports and paths.

Why apart: every flag here is a decision with a reason (loopback only, etcd on tmpfs, the scheduler's
client rate for `make bench`, the controller manager's node grace period across API server
restarts), and reading them together, away from the start-up sequence, is how they are reviewed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from testbed.cluster.nodes import KWOK_NODE_LABEL
from testbed.cluster.state import KUBECONFIG, RUN
from testbed.node.nodeconfig import SERVICE_CIDR

STAGES: Final = Path(__file__).with_name("kwok-stages.yaml")
KWOK_CONFIG: Final = Path(__file__).with_name("kwok-config.yaml")
POD_CIDR: Final = "10.0.0.1/16"


@dataclass(frozen=True)
class Ports:
    """The cluster's ports on 127.0.0.1, chosen free at `up` and kept across restarts."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    def by_component(self) -> dict[str, int]:
        """As state.json records them."""
        return {
            "etcd": self.etcd,
            "etcd-peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok": self.kwok,
        }


def etcd_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.etcd}"


def etcd_args(ports: Ports, data_dir: Path) -> list[str]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        "--name=dev",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={etcd_url(ports)}",
        f"--advertise-client-urls={etcd_url(ports)}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=dev={peer}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def apiserver_args(ports: Ports, pki: Path) -> list[str]:
    return [
        f"--etcd-servers={etcd_url(ports)}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        # The API server's client to the kubelets (`kubectl logs`): it verifies the kubelet's serving
        # certificate with the cluster's CA, proves itself with its own client certificate, and reaches a
        # node at its InternalIP (the nodes' Hostname addresses resolve nowhere).
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={RUN / 'apiserver-certs'}",
        "--allow-privileged=true",
        "--profiling=false",
        "--enable-priority-and-fairness=true",
        "--max-requests-inflight=2000",
        "--max-mutating-requests-inflight=1000",
        "--v=1",
    ]


def _client_args(port: int) -> list[str]:
    """What the controller manager and the scheduler share: the admin kubeconfig, loopback, no election."""
    kubeconfig = str(KUBECONFIG)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
    ]


def controller_manager_args(ports: Ports, pki: Path) -> list[str]:
    return [
        *_client_args(ports.controller_manager),
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=false",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--concurrent-gc-syncs=40",
        # After an API server restart the controller manager's informers sit out client-go's
        # relist backoff (measured: about 40 s after it was back); with the default 50 s grace the
        # node lifecycle controller then marks every node NotReady for a moment, which gang-
        # restarts every running TrainingJob of everyone sharing the cluster.
        "--node-monitor-grace-period=2m",
        "--v=1",
    ]


def scheduler_args(ports: Ports) -> list[str]:
    return [
        *_client_args(ports.scheduler),
        # The default client QPS of 50 would make binding 2,000 pods take 40 s (make bench).
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        "--v=1",
    ]


def kwok_args(ports: Ports) -> list[str]:
    return [
        f"--kubeconfig={KUBECONFIG}",
        f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}=true",
        f"--config={STAGES}",
        f"--config={KWOK_CONFIG}",
        f"--cidr={POD_CIDR}",
        # Every fake node's InternalIP in its status (the node stage writes it): the address the API
        # server would dial for a kwok pod's logs, so that nothing but loopback is ever dialled (kwok's
        # nodes serve no logs: nothing answers there).
        "--node-ip=127.0.0.1",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{ports.kwok}",
    ]
