"""Where the client's API calls go: kubeconfig or in-cluster credentials, and the default namespace.

The official `kubernetes` package reads the credentials (client certificates, tokens, exec plugins,
token refresh); `controller.runtime.client.KubeClient` sends raw JSON over its connection pool, as everywhere
else in the project. The order is kubectl's: an explicit kubeconfig, else $KUBECONFIG (one file or a
list), else ~/.kube/config, else the pod's service account when running inside a cluster (a
notebook server). The default namespace is the context's, else the pod's, else "default".

Retries are short compared to the operator's: a person waits for the answer, so a cluster that is
down is reported after a few quick attempts rather than after a minute.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import kubernetes
import yaml

from controller.runtime.client import KubeClient
from trainingjob_client.errors import ConfigError

IN_CLUSTER_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_KUBECONFIG: Final = "~/.kube/config"
USER_AGENT: Final = "trainingjob-client"
# A person waits: a few quick retries of 5xx/429/connection errors, a connect timeout of 5 s.
MAX_ATTEMPTS: Final = 3
MAX_ELAPSED: Final = 10.0
REQUEST_TIMEOUT: Final = (5.0, 60.0)
QPS: Final = 20.0
BURST: Final = 30


@dataclass(frozen=True)
class Connection:
    kube: KubeClient
    namespace: str
    source: str


def kubeconfig_paths(kubeconfig: str | os.PathLike[str] | None) -> str | None:
    """The kubeconfig to read (a path or a $KUBECONFIG list), or None for in-cluster credentials."""
    if kubeconfig is not None:
        return os.fspath(kubeconfig)
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    if os.path.exists(default) or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return default
    return None


def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    namespace: str | None = None,
) -> Connection:
    """A KubeClient and the namespace to use; ConfigError with one line when neither can be had."""
    paths = kubeconfig_paths(kubeconfig)
    configuration = kubernetes.client.Configuration()
    if paths is None:
        source = "the in-cluster service account"
        try:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except kubernetes.config.ConfigException as error:
            raise ConfigError(f"cannot use {source}: {_one_line(error)}") from None
        chosen = namespace or _in_cluster_namespace()
    else:
        source = f"kubeconfig {paths}"
        _check_readable(paths, source)
        try:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=paths, context=context, client_configuration=configuration, persist_config=False
            )
            chosen = namespace or _context_namespace(paths, context) or _in_cluster_namespace()
        except (kubernetes.config.ConfigException, yaml.YAMLError, ValueError, TypeError, KeyError) as error:
            raise ConfigError(f"cannot use {source}: {_one_line(error)}") from None
        except OSError as error:
            raise ConfigError(f"cannot read {source}: {error.strerror or error}") from None
    api_client = kubernetes.client.ApiClient(configuration)
    api_client.user_agent = USER_AGENT
    kube = KubeClient(
        api_client, QPS, BURST, max_attempts=MAX_ATTEMPTS, max_elapsed=MAX_ELAPSED, timeout=REQUEST_TIMEOUT
    )
    return Connection(kube, chosen, source)


def _check_readable(paths: str, source: str) -> None:
    """A single named file must exist and be readable (the library would say "no configuration found")."""
    files = [path for path in paths.split(os.pathsep) if path]
    if len(files) != 1:
        return
    try:
        with open(os.path.expanduser(files[0]), "rb"):
            pass
    except OSError as error:
        raise ConfigError(f"cannot read {source}: {error.strerror or error}") from None


def _context_namespace(paths: str, context: str | None) -> str | None:
    contexts, active = kubernetes.config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=paths
    )
    chosen: Any = active
    if context is not None:
        chosen = next((entry for entry in contexts or [] if entry.get("name") == context), None)
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


def _in_cluster_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
