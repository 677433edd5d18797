"""Who may read the operator's /metrics on the local cluster: ServiceAccounts with and without the
shipped `trainingjob-operator-metrics-reader` ClusterRole, and their tokens, for the end-to-end tests
of the secure metrics endpoint (tests/e2e/test_metrics_auth_e2e.py, the real Prometheus scrapes).

Why apart: the tests that scrape the operator the way a platform team's Prometheus does (a
ServiceAccount's token, a ClusterRoleBinding to the reader role) need the same few objects; the
binding is cluster-scoped, so it is removed when the test ends (the namespace's deletion would not).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from testbed import Kubectl, wait_for

METRICS_READER: Final = "trainingjob-operator-metrics-reader"


def account_token(cluster: Kubectl, namespace: str, name: str, duration: str = "1h") -> str:
    """A token of the ServiceAccount `namespace/name` (created if missing), from the TokenRequest API."""
    if cluster.get_or_none("serviceaccount", name, "-n", namespace) is None:
        cluster.run("create", "serviceaccount", name, "-n", namespace)
    token = cluster.run("create", "token", name, "-n", namespace, f"--duration={duration}").strip()
    assert token, "kubectl create token printed no token"
    return token


def user_of(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@contextmanager
def metrics_reader(cluster: Kubectl, namespace: str, name: str = "scraper") -> Iterator[str]:
    """A token of `namespace/name` bound to the metrics-reader ClusterRole while the block runs."""
    binding = f"{namespace}-{name}-metrics-reader"
    token = account_token(cluster, namespace, name)
    cluster.run(
        "create",
        "clusterrolebinding",
        binding,
        f"--clusterrole={METRICS_READER}",
        f"--serviceaccount={namespace}:{name}",
    )
    try:
        yield token
    finally:
        cluster.run("delete", "clusterrolebinding", binding, "--ignore-not-found")


def token_file(token: str, directory: Path) -> Path:
    """The token in a file readable by its owner only, as a ServiceAccount token volume holds it."""
    path = directory / "metrics-token"
    path.write_text(token)
    path.chmod(0o600)
    return path


def refused_by_the_api_server(cluster: Kubectl, token: str) -> bool:
    """Whether a TokenReview of `token` says it is not authenticated (asked as the cluster's admin)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    answer = json.loads(cluster.run("create", "-o", "json", "-f", "-", stdin=json.dumps(review)))
    return not answer.get("status", {}).get("authenticated")


def revoked_token(cluster: Kubectl, namespace: str, name: str = "gone") -> str:
    """A token that was valid and no longer is: its ServiceAccount deleted (a TokenRequest cannot be
    shorter than 10 minutes, so this is the quick way to a token the API server refuses)."""
    token = account_token(cluster, namespace, name)
    assert not refused_by_the_api_server(cluster, token)
    cluster.run("delete", "serviceaccount", name, "-n", namespace, "--wait=true")
    wait_for(
        f"the token of the deleted ServiceAccount {name} refused",
        lambda: refused_by_the_api_server(cluster, token),
        timeout=60,
    )
    return token


def resigned(token: str, signing_key: Path, expires_in: int) -> str:
    """`token` with `exp` `expires_in` seconds from now (negative: in the past; `iat` and `nbf` ten
    minutes before it, or before now), signed again with the cluster's ServiceAccount signing key as
    the API server signed it. A TokenRequest cannot be shorter than 10 minutes: this is the quick way
    to an expired token that differs from an accepted one in its age alone."""
    header, claims, _ = token.split(".")
    payload = json.loads(_unb64(claims))
    now = int(time.time())
    issued = min(now, now + expires_in) - 600
    payload.update(exp=now + expires_in, iat=issued, nbf=issued)
    signed = f"{header}.{_b64(json.dumps(payload, separators=(',', ':')).encode())}"
    key = serialization.load_pem_private_key(signing_key.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signed}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
