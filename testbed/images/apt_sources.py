"""The Debian mirror the base image is bootstrapped from, read from the machine's apt configuration.

Why: debootstrap needs a mirror URL, and the repository must not name any host. The machine already
knows which mirror it may reach (its apt sources), so the mirror is read from there each time: the
classic one-line format (`/etc/apt/sources.list`, `sources.list.d/*.list`) and Debian's deb822 format
(`sources.list.d/*.sources`). Files with other suffixes (`*.disabled`, backups) are ignored, as apt
ignores them. Parsing is pure; `machine_mirror()` is the one function that reads files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from testbed.common import ToolError

APT_DIR: Final = Path("/etc/apt")
# Schemes debootstrap can fetch from.
FETCHABLE: Final = ("http://", "https://", "file:/")


@dataclass(frozen=True)
class AptSource:
    """One source: `types` (deb, deb-src), a URI, its suites and components."""

    types: tuple[str, ...]
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    enabled: bool = True


def parse_one_line(text: str) -> list[AptSource]:
    """Sources in the one-line format: `deb [option=value ...] URI SUITE COMPONENT...` per line."""
    sources: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # options such as [arch=amd64 signed-by=...]
        words = line.split()
        if len(words) < 3 or words[0] not in ("deb", "deb-src"):
            continue
        sources.append(AptSource((words[0],), words[1], (words[2],), tuple(words[3:])))
    return sources


def _stanzas(text: str) -> list[dict[str, str]]:
    """deb822 paragraphs as {lower-case field: value}; continuation lines are joined with spaces."""
    stanzas: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    last = ""
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                stanzas.append(fields)
            fields, last = {}, ""
        elif raw[0] in " \t" and last:
            fields[last] += " " + raw.strip()
        elif ":" in raw:
            name, value = raw.split(":", 1)
            last = name.strip().lower()
            fields[last] = value.strip()
    return stanzas


def parse_deb822(text: str) -> list[AptSource]:
    """Sources in the deb822 format (`Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`);
    a stanza with several URIs gives one source per URI."""
    sources: list[AptSource] = []
    for fields in _stanzas(text):
        enabled = fields.get("enabled", "yes").lower() not in ("no", "false", "0")
        for uri in fields.get("uris", "").split():
            sources.append(
                AptSource(
                    tuple(fields.get("types", "").split()),
                    uri,
                    tuple(fields.get("suites", "").split()),
                    tuple(fields.get("components", "").split()),
                    enabled,
                )
            )
    return sources


def mirror_for(sources: list[AptSource], suite: str, component: str = "main") -> str:
    """The URI of the first enabled binary source that carries `suite` with `component` and that
    debootstrap can fetch from (http, https, file)."""
    for source in sources:
        if (
            source.enabled
            and "deb" in source.types
            and suite in source.suites
            and component in source.components
            and source.uri.startswith(FETCHABLE)
        ):
            return source.uri.rstrip("/")
    raise ToolError(
        f"no apt source for Debian {suite} ({component}) in {APT_DIR}/sources.list or "
        f"{APT_DIR}/sources.list.d/: the base image is bootstrapped from the mirror apt uses"
    )


def read_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    """Every source apt reads: sources.list, then sources.list.d/*.list and *.sources by name."""
    sources: list[AptSource] = []
    main = apt_dir / "sources.list"
    if main.is_file():
        sources += parse_one_line(main.read_text(encoding="utf-8", errors="replace"))
    parts = apt_dir / "sources.list.d"
    for path in sorted(parts.iterdir()) if parts.is_dir() else []:
        if path.suffix == ".list":
            sources += parse_one_line(path.read_text(encoding="utf-8", errors="replace"))
        elif path.suffix == ".sources":
            sources += parse_deb822(path.read_text(encoding="utf-8", errors="replace"))
    return sources


def machine_mirror(suite: str, apt_dir: Path = APT_DIR) -> str:
    """The mirror this machine's apt uses for `suite` (main)."""
    return mirror_for(read_sources(apt_dir), suite)
