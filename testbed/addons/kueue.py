"""Kueue's controller manager on the dev cluster: its Configuration, its webhooks, its command line.

Why: queueing and quotas are only proven against the real Kueue (hack/kube-bins.sh component `kueue`,
with its CRDs and webhook manifests from the same module). Kueue's install runs the manager in a
Deployment behind a Service, with a certificate its own cert manager makes for the Service's DNS
name. Here the manager is a process on 127.0.0.1, so:

- its webhook server, health probes and metrics listen on 127.0.0.1 (free ports);
- internal cert management is off: the serving certificate comes from the cluster's CA (testbed/cluster/
  pki.py), for IP 127.0.0.1;
- the webhook configurations are generated from the module's config/components/webhook manifests,
  each Service reference turned into `https://127.0.0.1:<port><path>` with the cluster's CA as
  caBundle (the API server's client trusts nothing else), under the names Kueue's release gives them;
- only batch/job is integrated (`integrations.frameworks`): the TrainingJob is integrated by the
  operator creating Workloads itself, and no other job kind Kueue knows is installed here. Kueue
  answers the webhooks of the other integrations with a no-op, so theirs are left out of the
  configurations (SKIPPED_FRAMEWORK_WEBHOOKS): pods, Deployments and StatefulSets are not sent to Kueue
  at all, and a stopped Kueue blocks nothing but Kueue's own objects and batch Jobs;
- MultiKueue's generic adapter knows the TrainingJob (`multiKueue.externalFrameworks`), so this Kueue
  can dispatch TrainingJobs to worker clusters (testbed/addons/multikueue.py) and, as a worker's,
  run the copies a manager sends;
- `manageJobsWithoutQueueName` is off: only objects with the `kueue.x-k8s.io/queue-name` label are queued;
- the on-demand visibility API (VisibilityOnDemand) is off: its server binds 0.0.0.0:8082 and writes
  certificates under /visibility, neither of which it lets one change;
- Kueue v0.17 stores its API as kueue.x-k8s.io/v1beta2 (which the operator speaks) and still serves
  v1beta1 for some kinds through a conversion webhook at /convert of its webhook server (Kueue's
  release patches those CRDs, CONVERTED_CRDS, with it): here each is patched to
  `https://127.0.0.1:<port>/convert` with the cluster's CA, once the manager serves;
- the metrics server reads its certificate from the fixed path /etc/kueue/metrics/certs when
  internal cert management is off. The manager therefore runs in a private mount namespace whose /etc
  is a read-only overlay of a directory holding that certificate over the real /etc (`unshare`; with
  a user namespace too when not run as root). Nothing outside the process sees it.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Final

from testbed.cluster.state import KUBECONFIG
from testbed.common import in_private_mounts

NAME: Final = "kueue"
BUILD: Final = "kueue"
NAMESPACE: Final = "kueue-system"
GROUP: Final = "kueue.x-k8s.io"
CRD_DIR: Final = "config/components/crd/bases"
WEBHOOK_MANIFESTS: Final = "config/components/webhook/manifests.yaml"
# Kueue's frameworks enabled here, and the (API group, resource) of the kind each one manages.
FRAMEWORKS: Final = {"batch/job": ("batch", "jobs")}
# Kueue's release prefixes every object of its kustomization with "kueue-".
CONFIGURATION_NAMES: Final = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
METRICS_CERT_DIR: Final = "kueue/metrics/certs"  # under /etc, fixed in Kueue's main
# The CRDs whose versions Kueue's webhook converts (the webhook_in_* patches its release's CRD
# kustomization applies); the others' versions have the same schema and need no conversion.
CONVERTED_CRDS: Final = tuple(
    f"{plural}.{GROUP}"
    for plural in ("clusterqueues", "cohorts", "localqueues", "multikueueclusters", "workloads")
)
CONVERSION_PATH: Final = "/convert"
# The kinds MultiKueue's generic adapter dispatches to worker clusters (`kind.version.group`): the
# TrainingJob, which has no adapter of Kueue's own (testbed/addons/multikueue.py).
MULTIKUEUE_EXTERNAL_FRAMEWORKS: Final = ("TrainingJob.v1.ml.example.com",)


def configuration(
    *, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path
) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2; JSON is YAML, which it reads)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
        "multiKueue": {"externalFrameworks": [{"name": name} for name in MULTIKUEUE_EXTERNAL_FRAMEWORKS]},
    }


def kept(webhook: dict[str, Any]) -> bool:
    """A webhook for Kueue's own API, or for the kind of an enabled framework."""
    enabled = set(FRAMEWORKS.values())
    targets = [
        (group, resource.split("/")[0])
        for rule in webhook.get("rules", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
    ]
    return bool(targets) and all(
        group == GROUP or (group, resource) in enabled for group, resource in targets
    )


def webhook_configurations(
    manifests: list[dict[str, Any]], *, webhook_port: int, ca_bundle: bytes
) -> tuple[list[dict[str, Any]], list[str]]:
    """The module's webhook configurations pointed at the local manager, and the names of the webhooks
    left out (those of integrations that are off)."""
    configurations: list[dict[str, Any]] = []
    skipped: list[str] = []
    bundle = base64.b64encode(ca_bundle).decode()
    for manifest in manifests:
        kind = manifest["kind"]
        webhooks = []
        for webhook in manifest.get("webhooks", []):
            if not kept(webhook):
                skipped.append(webhook["name"])
                continue
            path = webhook["clientConfig"]["service"]["path"]
            url = f"https://127.0.0.1:{webhook_port}{path}"
            webhooks.append({**webhook, "clientConfig": {"url": url, "caBundle": bundle}})
        configurations.append(
            {
                "apiVersion": manifest["apiVersion"],
                "kind": kind,
                "metadata": {
                    "name": CONFIGURATION_NAMES[kind],
                    "labels": {
                        "app.kubernetes.io/name": "kueue",
                        "app.kubernetes.io/managed-by": "dev-cluster",
                    },
                },
                "webhooks": webhooks,
            }
        )
    return configurations, skipped


def conversion_patch(*, webhook_port: int, ca_bundle: bytes) -> dict[str, Any]:
    """The merge patch that sends a CRD's conversions to the local manager's webhook."""
    client = {
        "url": f"https://127.0.0.1:{webhook_port}{CONVERSION_PATH}",
        "caBundle": base64.b64encode(ca_bundle).decode(),
    }
    return {
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {"clientConfig": client, "conversionReviewVersions": ["v1"]},
            }
        }
    }


def private_etc_command(layer: Path, binary: Path, args: list[str]) -> tuple[Path, list[str]]:
    """`binary args` in a private mount namespace whose /etc shows `layer` over the real /etc."""
    script = 'mount -t overlay overlay -o "lowerdir=$1:/etc" /etc && shift && exec "$@"'
    unshare, *wrapped = in_private_mounts(script, str(layer), str(binary), *args)
    return Path(unshare), wrapped


def manager_args(config: Path) -> list[str]:
    return [f"--config={config}", f"--kubeconfig={KUBECONFIG}"]
