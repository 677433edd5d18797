"""How the helper reaches the Kubernetes API: a progress report is one PATCH of this pod's annotation.

Split out of the Reporter so that the HTTP side (the pod's URL, the rotating service-account token,
the CA bundle, no proxies, short timeouts, errors turned into one warning each) sits apart from the
report's content and the background sender. Also where the pod's environment is read: the rank (only
rank 0 reports) and the in-cluster API address. The supervisor of in-place restarts (supervise) sends
its run reports and watches its TrainingJob through the same `open_api`, so both talk to the API alike.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .base import API_URL_ENV, CA_FILE_ENV, MAX_RESPONSE_BYTES, TOKEN_FILE_ENV, OnceLogger
from .report import annotation_patch

MERGE_PATCH: Final = "application/merge-patch+json"


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


@dataclass(frozen=True)
class ApiAccess:
    """Where the API is and with which credentials a process of this pod calls it."""

    url: str
    token_path: str | None
    ca_path: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], service_account_dir: str) -> ApiAccess | None:
        """The in-cluster API (KUBERNETES_SERVICE_HOST/PORT) with the service account's token and CA,
        unless TRAININGJOB_PROGRESS_API_URL, _TOKEN_FILE and _CA_FILE name others; None outside a
        cluster. A plain http:// URL (tests, `kubectl proxy`) has no CA."""
        url = environ.get(API_URL_ENV, "").strip() or in_cluster_url(environ)
        if not url:
            return None
        token_path = environ.get(TOKEN_FILE_ENV, "").strip() or f"{service_account_dir}/token"
        ca_path = (
            None
            if url.startswith("http://")
            else environ.get(CA_FILE_ENV, "").strip() or f"{service_account_dir}/ca.crt"
        )
        return cls(url=url, token_path=token_path, ca_path=ca_path)


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
            with open_api(
                self.url,
                method="PATCH",
                body=body,
                content_type=MERGE_PATCH,
                token_path=self._token_path,
                ca_path=self._ca_path,
                timeout=self._timeout,
                once=self._once,
            ) as response:
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


def open_api(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str | None = None,
    token_path: str | None,
    ca_path: str | None,
    timeout: float,
    once: OnceLogger,
) -> http.client.HTTPResponse:
    """Sends one request to the API and returns the open response (a context manager; read it, or
    read a watch's lines from it). Raises urllib.error.HTTPError for an answer >= 400 and OSError
    (URLError, timeouts) when the API cannot be reached.

    token_path is re-read for every request (projected service-account tokens rotate), as is ca_path,
    which verifies an https API. `timeout` bounds the connection and every read.
    """
    request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 - the API's http(s) URL
    if content_type:
        request.add_header("Content-Type", content_type)
    request.add_header("Accept", "application/json")
    token = read_text(token_path) if token_path else None
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    elif token_path:
        once.warning("token", "no service-account token at %s: calling the API unauthenticated", token_path)
    # No proxies: HTTPS_PROXY in a training image must not reroute calls to the in-cluster API.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https://"):
        # Re-created for every request, like the token: ca.crt can be rotated too.
        context = ssl.create_default_context(cafile=ca_path)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    response: http.client.HTTPResponse = urllib.request.build_opener(*handlers).open(request, timeout=timeout)
    return response


def status_message(error: urllib.error.HTTPError) -> str:
    """The message of a metav1.Status answer, else the HTTP reason."""
    try:
        status = json.loads(error.read(MAX_RESPONSE_BYTES) or b"{}")
    except (OSError, ValueError):
        status = {}
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or error.reason)[:300]
