"""The project's rules for changing the TrainingJob API within ml.example.com/v1, as docs/api.md says them.

Why here: docs/api.md is rendered from crd/ (crd/render.py), and these rules are about the schema that
crd/ holds, so they live beside it and are rendered with it; a change to crd/schema*.py is reviewed
against them. What they rest on is tested: a new optional field and a new field with a default applied
under running jobs (tests/e2e/test_schema_evolution_e2e.py); and every field of the previous version's
CRD, with its type and default, and every label, annotation and finalizer it wrote, still this
version's (tests/unit/test_upgrade_compat.py).
"""

from __future__ import annotations

from typing import Final

SECTION: Final = (
    "## Changing the API within v1",
    "",
    "`v1` is the one version served and stored, and it changes in place: `make deploy`, `make install` "
    "and `helm upgrade` apply the new CRD under the jobs that exist. So a change must keep every stored "
    "job valid and meaning what it meant, and must be one the previous operator survives (it may run "
    "beside the new CRD during a rollout, and after a rollback).",
    "",
    "**Allowed within v1**, with no new version and no conversion:",
    "",
    "- a new optional field, in spec or status: the API server keeps it in new writes and serves "
    "nothing for jobs that lack it; the operator ignores fields it does not know;",
    "- a new field with a default: the API server fills the default in when it reads a stored job, so "
    "every reader sees it, and a later write stores it without bumping `metadata.generation` (the spec "
    "did not change); the default must mean what jobs without the field already did;",
    "- a looser rule: a higher maximum, a lower minimum, a new enum value, a CEL rule dropped;",
    "- a new printer column, a new condition type or reason, a new Event reason;",
    "- a tighter rule (a new CEL rule, a lower maximum) only when every stored job already passes it: "
    "stored jobs are not checked again, but any later write of them is (an unchanged field passes "
    "through validation ratcheting, so a status write does not fail for it).",
    "",
    "**Not within v1**: removing or renaming a field, changing its type, its unit or its meaning, changing "
    "an existing default (stored jobs would change behaviour on the next read), making an optional field "
    "required, or splitting a field into others. Such a change is a new version (`v2`) served beside "
    "`v1`, a conversion webhook that converts both ways without loss (the CRD's "
    "`spec.conversion.strategy: Webhook`), the stored jobs rewritten in the new storage version, and "
    "only then `v1` no longer served.",
    "",
    "**What the operator writes** (labels, annotations, finalizers, status fields) follows the same "
    "rules: a version reads what the previous one wrote, and one that writes something differently "
    "migrates old objects at their next reconcile, idempotently (tests/unit/test_upgrade_compat.py "
    "holds what the operator writes and the CRD's fields against the previous version).",
    "",
)
