"""How a progress report reaches the Kubernetes API: one PATCH of this pod's progress annotation.

Split out of the Reporter so that the HTTP side (the pod's URL, the rotating service-account token,
the CA bundle, no proxies, short timeouts, errors turned into one warning each) sits apart from the
report's content and the background sender. Also where the pod's environment is read: the rank (only
rank 0 reports) and the in-cluster API address.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from .base import MAX_RESPONSE_BYTES, OnceLogger
from .report import annotation_patch


def rank(environ: Mapping[str, str]) -> int:
    """This process's global rank: RANK (the operator sets it for a pod's first process, torchrun and the
    reference trainer for each process they start), else the operator's arithmetic from the replica
    index and LOCAL_RANK, else 0 for a plain single process."""
    if environ.get("RANK", "").strip():
        return int(environ["RANK"])
    index = int(environ.get("TRAININGJOB_REPLICA_INDEX", "").strip() or 0)
    local = int(environ.get("LOCAL_RANK", "").strip() or 0)
    processes = int(environ.get("LOCAL_WORLD_SIZE", "").strip() or 1)
    return index * processes + local


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def in_cluster_url(environ: Mapping[str, str]) -> str | None:
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 service address
    return f"https://{host}:{port}"


def pod_url(api_url: str, namespace: str, pod_name: str) -> str:
    quote = urllib.parse.quote
    return f"{api_url.rstrip('/')}/api/v1/namespaces/{quote(namespace, safe='')}/pods/" + quote(
        pod_name, safe=""
    )


class PodPatcher:
    """Sends one report as a merge patch of the annotation; True when the API accepted it.

    token_path is re-read before every request because projected service-account tokens rotate;
    ca_path verifies the API server's certificate for https URLs.
    """

    def __init__(
        self,
        *,
        url: str,
        annotation: str,
        token_path: str | None,
        ca_path: str | None,
        timeout: float,
        once: OnceLogger,
    ) -> None:
        self.url = url
        self.annotation = annotation
        self._token_path = token_path
        self._ca_path = ca_path
        self._timeout = timeout
        self._once = once

    def send(self, report: Mapping[str, Any]) -> bool:
        try:
            body = annotation_patch(self.annotation, report)
            request = urllib.request.Request(self.url, data=body, method="PATCH")  # noqa: S310 - the API's http(s) URL
            request.add_header("Content-Type", "application/merge-patch+json")
            request.add_header("Accept", "application/json")
            token = read_text(self._token_path) if self._token_path else None
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            elif self._token_path:
                self._once.warning(
                    "token", "no service-account token at %s: reporting unauthenticated", self._token_path
                )
            with self._opener().open(request, timeout=self._timeout) as response:
                response.read(MAX_RESPONSE_BYTES)
            return True
        except urllib.error.HTTPError as error:
            detail = status_message(error)
            self._once.warning(
                f"http:{error.code}:{detail}",
                "progress report refused by the Kubernetes API (HTTP %d): %s; dropped",
                error.code,
                detail,
            )
        except Exception as error:
            reason = getattr(error, "reason", error)
            self._once.warning(
                f"transport:{type(reason).__name__}:{reason}",
                "progress report could not reach the Kubernetes API (%s): %s; dropped",
                type(reason).__name__,
                reason,
            )
        return False

    def _opener(self) -> urllib.request.OpenerDirector:
        # No proxies: HTTPS_PROXY in a training image must not reroute calls to the in-cluster API.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self.url.startswith("https://"):
            # Re-created for every request, like the token: ca.crt can be rotated too.
            context = ssl.create_default_context(cafile=self._ca_path)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        return urllib.request.build_opener(*handlers)


def status_message(error: urllib.error.HTTPError) -> str:
    """The message of a metav1.Status answer, else the HTTP reason."""
    try:
        status = json.loads(error.read(MAX_RESPONSE_BYTES) or b"{}")
    except (OSError, ValueError):
        status = {}
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or error.reason)[:300]
