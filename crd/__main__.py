"""`python -m crd`: print, write or check the generated CRD manifest and API reference.

python -m crd yaml    print the CustomResourceDefinition YAML
python -m crd docs    print the markdown API reference (docs/api.md)
python -m crd write   rewrite crd/trainingjobs.ml.example.com.yaml and docs/api.md
python -m crd check   exit 1 if either committed file differs from crd/schema.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crd.render import CRD_FILE_NAME, api_docs, crd_yaml

PACKAGE_DIR = Path(__file__).resolve().parent
CRD_FILE = PACKAGE_DIR / CRD_FILE_NAME
DOCS_FILE = PACKAGE_DIR.parent / "docs" / "api.md"


def _artifacts() -> dict[Path, str]:
    return {CRD_FILE: crd_yaml(), DOCS_FILE: api_docs()}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crd", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("command", choices=["yaml", "docs", "write", "check"])
    args = parser.parse_args(argv)
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
