"""Start-up checks of what the operator's guarantees rest on but it does not install itself.

Why: the trainers' Role (builders/shared.py) allows `patch` on every pod of their namespace, and only
the ValidatingAdmissionPolicy in crd/ narrows that to the progress annotation of the trainer's own
pod. An operator started without the policy would hand every trainer a way to relabel or annotate any
pod, silently. So it refuses to start, in one line that says what to apply. Where it cannot tell (no
right to read the policy, the API server not answering yet) it says so in the log and starts: the
check must never be what keeps a working installation down.
"""

from __future__ import annotations

import logging
from typing import Final

from controller.resources import ADMISSION_POLICIES, ADMISSION_POLICY_BINDINGS
from controller.runtime.client import KubeClient
from controller.runtime.errors import Forbidden, KubeError, NotFound
from crd import contract

logger = logging.getLogger(__name__)

POLICY_OBJECTS: Final = (ADMISSION_POLICIES, ADMISSION_POLICY_BINDINGS)


def missing_trainer_policy(client: KubeClient) -> str | None:
    """Why the operator must not start (the policy or its binding is not installed), else None."""
    missing = []
    for resource in POLICY_OBJECTS:
        try:
            client.get(resource, None, contract.TRAINER_POLICY)
        except NotFound:
            missing.append(f"{resource.kind} {contract.TRAINER_POLICY}")
        except Forbidden:
            logger.warning(
                "cannot check that the trainers' admission policy is installed: not allowed to get %s",
                resource.plural,
            )
            return None
        except KubeError as error:
            logger.warning("cannot check that the trainers' admission policy is installed: %s", error)
            return None
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} not installed: without it trainers could patch any pod of their "
        "namespace; apply crd/ (kubectl apply --server-side -k crd/), which make deploy and the Helm chart do"
    )
