"""A `KubeClient` for a cluster named the way kubectl would: an explicit kubeconfig, the pod's service
account when running in a cluster, else $KUBECONFIG or ~/.kube/config.

The official client reads the credentials (tokens, client certificates, exec plugins, token refresh);
this module only chooses where from and sets what the runtime needs on top (pool size, user agent).
"""

from __future__ import annotations

import os

import kubernetes

from controller.runtime.client import KubeClient
from controller.runtime.transport import DEFAULT_POOL_SIZE, RestMetrics


def from_kubeconfig(
    path: str | None = None,
    context: str | None = None,
    qps: float = 20.0,
    burst: int = 30,
    *,
    user_agent: str,
    pool_size: int = DEFAULT_POOL_SIZE,
    metrics: RestMetrics | None = None,
    fast_http_client: bool = True,
) -> KubeClient:
    """Explicit kubeconfig path, else in-cluster service account, else $KUBECONFIG / ~/.kube/config.

    qps/burst default to controller-runtime's 20/30. `pool_size` must cover every worker thread plus
    every open watch (each pins a connection) plus a few for leader election and events. `user_agent`
    names the program to the API server (audit logs, and the field manager of its writes).
    `fast_http_client` False sends every request through urllib3 (see `transport.Connection`).
    """
    configuration = kubernetes.client.Configuration()
    if path is not None:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        default = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=default, context=context, client_configuration=configuration, persist_config=False
        )
    configuration.connection_pool_maxsize = pool_size
    api_client = kubernetes.client.ApiClient(configuration)
    api_client.user_agent = user_agent
    return KubeClient(api_client, qps, burst, metrics, fast_http_client=fast_http_client)
