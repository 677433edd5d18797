"""`python -m crd`: print, write or check the generated CRD manifest and API reference.

python -m crd yaml    print the CustomResourceDefinition YAML
python -m crd docs    print the markdown API reference (docs/api.md)
python -m crd write   rewrite crd/trainingjobs.ml.example.com.yaml, crd/immutable-spec-policy.yaml,
                      crd/escalation-policy.yaml, their copies in the Helm chart
                      (deploy/helm/trainingjob-operator/files/) and docs/api.md
python -m crd check   exit 1 if any of them differs from crd/schema.py
python -m crd kube-schemas [--kubectl K] [--kubeconfig F] [--check]
                      regenerate crd/kube_schemas.json (the core/v1 schemas the spec embeds) from a
                      running API server's /openapi/v3/api/v1; then run `write`. --check: exit 1 if
                      the committed file differs. A cluster that cannot be reached exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crd import escalation_policy, kube_schemas
from crd.immutability import POLICY_FILE_NAME, policy_yaml
from crd.render import CRD_FILE_NAME, api_docs, crd_yaml

PACKAGE_DIR = Path(__file__).resolve().parent
CRD_FILE = PACKAGE_DIR / CRD_FILE_NAME
DOCS_FILE = PACKAGE_DIR.parent / "docs" / "api.md"
# Helm reads no file outside a chart, so the chart carries a copy of the CRD (deploy/README.md).
CHART_FILES = PACKAGE_DIR.parent / "deploy" / "helm" / "trainingjob-operator" / "files"
CHART_CRD_FILE = CHART_FILES / CRD_FILE_NAME
POLICY_FILE = PACKAGE_DIR / POLICY_FILE_NAME
CHART_POLICY_FILE = CHART_FILES / POLICY_FILE_NAME
ESCALATION_POLICY_FILE = PACKAGE_DIR / escalation_policy.POLICY_FILE_NAME
CHART_ESCALATION_POLICY_FILE = CHART_FILES / escalation_policy.POLICY_FILE_NAME


def _artifacts() -> dict[Path, str]:
    crd, policy, escalation = crd_yaml(), policy_yaml(), escalation_policy.policy_yaml()
    return {
        CRD_FILE: crd,
        CHART_CRD_FILE: crd,
        POLICY_FILE: policy,
        CHART_POLICY_FILE: policy,
        ESCALATION_POLICY_FILE: escalation,
        CHART_ESCALATION_POLICY_FILE: escalation,
        DOCS_FILE: api_docs(),
    }


def _write() -> int:
    for path, text in _artifacts().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(PACKAGE_DIR.parent)}")
    return 0


def _check() -> int:
    stale = [
        path
        for path, text in _artifacts().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    for path in stale:
        print(
            f"{path.relative_to(PACKAGE_DIR.parent)} is out of date: run `python -m crd write`",
            file=sys.stderr,
        )
    return 1 if stale else 0


def _kube_schemas(kubectl: str, kubeconfig: str | None, check: bool) -> int:
    try:
        text = kube_schemas.regenerated(kubectl, kubeconfig)
    except (kube_schemas.FetchError, ValueError) as error:
        print(f"python -m crd kube-schemas: {error}", file=sys.stderr)
        return 2
    path = kube_schemas.SCHEMAS_FILE
    relative = path.relative_to(PACKAGE_DIR.parent)
    if check:
        if path.read_text(encoding="utf-8") != text:
            print(f"{relative} differs from what the cluster's OpenAPI generates", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {relative}; now run `python -m crd write`")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crd",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]) if __doc__ else None,
    )
    parser.add_argument("command", choices=["yaml", "docs", "write", "check", "kube-schemas"])
    parser.add_argument("--kubectl", default="kubectl", help="kube-schemas: the kubectl to ask")
    parser.add_argument("--kubeconfig", default=None, help="kube-schemas: its kubeconfig")
    parser.add_argument("--check", action="store_true", help="kube-schemas: compare, do not write")
    args = parser.parse_args(argv)
    if args.command == "kube-schemas":
        return _kube_schemas(args.kubectl, args.kubeconfig, args.check)
    if args.command == "yaml":
        sys.stdout.write(crd_yaml())
        return 0
    if args.command == "docs":
        sys.stdout.write(api_docs())
        return 0
    if args.command == "write":
        return _write()
    return _check()


if __name__ == "__main__":
    sys.exit(main())
