"""The job's two Services: stable DNS names for every worker, and a name that always means rank 0.

Both are headless (no cluster IP, no kube-proxy in the path) and publish not-ready addresses, so a
name resolves to the pod IP as soon as the pod has one, before any readiness: workers start their
rendezvous while rank 0 is still starting, and must be able to resolve it.
- <job>-headless selects every pod; as the pods' subdomain it gives each one the DNS name
  <job>-<role>-<i>.<job>-headless (TF_CONFIG uses these).
- <job>-master selects the pod in slot 0 only (worker 0, or a TensorFlow job's chief); MASTER_ADDR,
  JAX_COORDINATOR_ADDRESS and an elastic job's
  PET_RDZV_ENDPOINT (worker 0's agent hosts torchrun's rendezvous store) name it, and
  it resolves straight to rank 0's pod IP (a ClusterIP would add kube-proxy NAT and wait for
  readiness, and the rendezvous port is not a load-balanced service).
"""

from __future__ import annotations

from typing import Any

from builders.meta import object_meta, selector_labels
from builders.names import headless_service_name, master_service_name
from crd import contract
from crd.spec import TrainingJob


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}


def _headless(
    job: TrainingJob, name: str, selector: dict[str, str], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": ports,
        },
    }


def build_headless_service(job: TrainingJob) -> dict[str, Any]:
    port = job.spec.networking.master_port
    return _headless(
        job, headless_service_name(job), selector_labels(job), [_port(contract.DIST_PORT_NAME, port)]
    )


def build_master_service(job: TrainingJob) -> dict[str, Any]:
    spec = job.spec
    ports = [_port(contract.DIST_PORT_NAME, spec.networking.master_port)]
    if spec.monitoring.enabled:
        ports.append(_port(contract.METRICS_PORT_NAME, spec.monitoring.metrics_port))
    if spec.elastic is not None:
        ports.append(_port(contract.RDZV_PORT_NAME, spec.elastic.rendezvous.port))
    return _headless(job, master_service_name(job), master_selector(job), ports)


def master_selector(job: TrainingJob) -> dict[str, str]:
    """The pod in slot 0. A job of workers only selects replica index 0 as it always did (so its Service
    keeps selecting pods made before the replica-type label existed); with TensorFlow roles, index 0 of
    several roles exists, and the role of slot 0 (the chief, else the workers) is named too."""
    selector = {**selector_labels(job), contract.REPLICA_INDEX_LABEL: "0"}
    replicas = job.spec.replicas
    if replicas.has_roles:
        selector[contract.REPLICA_TYPE_LABEL] = str(replicas.at(0).type)
    return selector
