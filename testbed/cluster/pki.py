"""A fresh PKI and admin kubeconfig per dev cluster, made with openssl.

Why: the API server serves TLS and authenticates clients by certificate, like any real cluster, so
the operator's client, kubectl and the components talk to it the way they would in production. The
same holds between the API server and the kubelet API (`kubectl logs`, `exec`): the real node's kubelet
serves a certificate of the cluster's CA (testbed/node/realnode.py), and the API server presents
its own client certificate, which RBAC lets use the kubelet API (`KUBELET_CLIENT_BINDING`). The CA
is new for every cluster; nothing outlives `down`.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from pathlib import Path
from typing import Any, Final

from testbed.common import ToolError
from testbed.node.nodeconfig import API_SERVICE_IP, NODE_IP

# Loopback, the `kubernetes` Service's address and names (pods use them in-cluster), and the real node's
# address, where the node and its pods reach the API server through a relay (testbed/node/apiforward.py).
APISERVER_SANS = (
    f"subjectAltName=IP:127.0.0.1,IP:{API_SERVICE_IP},IP:{NODE_IP},DNS:localhost,DNS:kubernetes,"
    "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
)
# Who the API server is when it calls a kubelet (--kubelet-client-certificate), as kubeadm names it.
KUBELET_CLIENT_USER: Final = "kube-apiserver-kubelet-client"
# That user may use the kubelet API of every node: the built-in ClusterRole for it (nodes/proxy, stats,
# log, metrics), which a kubelet's webhook authorisation asks the API server about.
KUBELET_CLIENT_BINDING: Final[dict[str, Any]] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": KUBELET_CLIENT_USER},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:kubelet-api-admin",
    },
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT_USER}],
}


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """A CA per cluster, a serving certificate for 127.0.0.1, an admin client certificate, the
    service-account token signing key pair, and the API server's client certificate for calling the
    kubelet API."""
    pki.mkdir(parents=True)
    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt"),
        *("-days", "3650", "-subj", "/CN=trainingjob-dev-ca"),
        cwd=pki,
    )
    issue(pki, "apiserver", "/CN=kube-apiserver", f"{APISERVER_SANS}\nextendedKeyUsage=serverAuth,clientAuth")
    issue(pki, "admin", "/O=system:masters/CN=dev-admin", "extendedKeyUsage=clientAuth")
    issue(pki, "apiserver-kubelet-client", f"/CN={KUBELET_CLIENT_USER}", "extendedKeyUsage=clientAuth")
    openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def issue(pki: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate signed by the cluster's CA, with `extensions` (an openssl extfile)."""
    (pki / f"{name}.ext").write_text(extensions + "\n")
    openssl(
        *("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr"),
        *("-subj", subject),
        cwd=pki,
    )
    openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-out", f"{name}.crt", "-days", "365", "-extfile", f"{name}.ext"),
        cwd=pki,
    )


def serving_certificate(directory: Path, name: str, address: str = "127.0.0.1") -> Path:
    """A CA of its own in `directory` (for a day) and a serving certificate `<name>.crt` with its key
    for `address`, signed by it: what a webhook server the API server calls presents. Returns the
    directory (its `ca.crt` is the caBundle)."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt"),
        *("-days", "1", "-subj", f"/CN={name}-ca"),
        cwd=directory,
    )
    issue(directory, name, f"/CN={address}", f"subjectAltName=IP:{address}\nextendedKeyUsage=serverAuth")
    return directory


def kubeconfig_text(server: str, pki: Path, user: str = "admin") -> str:
    """A kubeconfig for `server` with the client certificate `<user>.crt` of `pki` (the admin's by
    default)."""

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "trainingjob-dev",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "dev-admin",
                "user": {
                    "client-certificate-data": b64(f"{user}.crt"),
                    "client-key-data": b64(f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "trainingjob-dev", "context": {"cluster": "trainingjob-dev", "user": "dev-admin"}}
        ],
        "current-context": "trainingjob-dev",
    }
    return json.dumps(config, indent=2)


def admin_ssl_context(pki: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def self_signed_context() -> ssl.SSLContext:
    """For the health checks of components that serve a certificate they generated in memory."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
