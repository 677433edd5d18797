"""API resources by group, version and plural, and Kubernetes' own resources the runtime and the
operator read and write.

A `Resource` is all a raw-JSON client needs to build REST paths; the operator's own resources (the
TrainingJob, the gang schedulers' PodGroups) and the catalogue of what it creates live in
controller/resources.py.
"""

from __future__ import annotations

from typing import Final, NamedTuple
from urllib.parse import quote

# API groups of Kubernetes' own kinds without the reserved .k8s.io suffix ("" is the core group).
_BUILT_IN_GROUPS: Final = frozenset({"", "apps", "batch", "policy", "autoscaling", "extensions"})


class Resource(NamedTuple):
    """One API resource: enough to build its REST paths."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def built_in(self) -> bool:
        """Whether this is one of Kubernetes' own kinds, whose compiled-in schema bounds how deeply its
        objects nest. A custom resource's schema may let a user nest a value without bound, so its
        answers are checked before they are decoded (boundedjson.py)."""
        return self.group in _BUILT_IN_GROUPS or self.group.endswith(".k8s.io")

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """REST path; a namespaced resource without a namespace addresses all namespaces (list/watch)."""
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.plural} is cluster-scoped; got namespace {namespace!r}")
        if name is not None and self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} is namespaced; a name needs a namespace")
        if subresource is not None and name is None:
            raise ValueError("a subresource needs a name")
        parts = ["/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"]
        if namespace is not None:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
        if subresource is not None:
            parts.append(_segment(subresource))
        return "/".join(parts)


def _segment(value: str) -> str:
    if not value:
        raise ValueError("empty path segment")
    return quote(value, safe="")


PODS: Final = Resource("", "v1", "pods", "Pod")
SERVICES: Final = Resource("", "v1", "services", "Service")
CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
EVENTS: Final = Resource("", "v1", "events", "Event")
SERVICEACCOUNTS: Final = Resource("", "v1", "serviceaccounts", "ServiceAccount")
PVCS: Final = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")
ROLES: Final = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS: Final = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
PRIORITYCLASSES: Final = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)
CRDS: Final = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)
# Reviews the API server answers without storing anything (a metrics endpoint's authentication and
# authorization: controller/runtime/authfilter.py).
TOKENREVIEWS: Final = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
SUBJECTACCESSREVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
