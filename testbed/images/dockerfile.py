"""What the project's Dockerfile builds from: its base image names and the files its COPY lines copy.

Why: the operator image is built from the Dockerfile users build with Docker and cached by a key over
everything that build reads. That set is read from the Dockerfile itself (never kept by hand here):
the FROM names that are not earlier stages (the base image, built locally under that name), and the
sources of every COPY/ADD without `--from`, as the build context holds them, that is without what
`.dockerignore` leaves out (Docker's rules: `**`, `*`, `?`, `!` exceptions, the last matching pattern
wins, a directory's exclusion covers what is inside it). The FROM lines name their images by digest
(`name:tag@sha256:...`); the local base can only answer to the name and tag, so the build gets the
Dockerfile with the digests dropped (`without_digests`), its one difference from the file users build.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword in upper case and the rest of its (joined) line."""

    keyword: str
    arguments: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions: comments and blank lines dropped, `\\` continuations joined."""
    found: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        if line:
            keyword, _, arguments = line.partition(" ")
            found.append(Instruction(keyword.upper(), arguments.strip()))
    if pending.strip():
        keyword, _, arguments = pending.strip().partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip()))
    return found


def _split_flags(arguments: str) -> tuple[dict[str, str], str]:
    """Leading `--name=value` flags and the rest."""
    flags: dict[str, str] = {}
    rest = arguments
    while match := re.match(r"--([a-z-]+)(?:=(\S*))?\s+", rest):
        flags[match.group(1)] = match.group(2) or ""
        rest = rest[match.end() :]
    return flags, rest


def base_images(text: str) -> tuple[str, ...]:
    """The images the FROM lines name that are not earlier stages, in order, without repeats."""
    stages: set[str] = set()
    bases: list[str] = []
    for instruction in instructions(text):
        if instruction.keyword != "FROM":
            continue
        _, rest = _split_flags(instruction.arguments + " ")
        words = rest.split()
        image = words[0]
        if image.lower() not in stages and image not in bases and image != "scratch":
            bases.append(image)
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
    return tuple(bases)


DIGEST: Final = re.compile(r"@sha256:[0-9a-f]{64}")
_FROM_IMAGE: Final = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)", re.IGNORECASE | re.MULTILINE)


def without_digest(reference: str) -> str:
    """`name:tag@sha256:...` -> `name:tag` (a reference without a digest unchanged)."""
    return DIGEST.sub("", reference)


def digest(reference: str) -> str | None:
    """The `sha256:...` digest a reference pins, if any."""
    match = DIGEST.search(reference)
    return match.group(0)[1:] if match else None


def without_digests(text: str) -> str:
    """The Dockerfile with every FROM image's digest dropped (the rest unchanged, line for line)."""
    return _FROM_IMAGE.sub(lambda match: match.group(1) + without_digest(match.group(2)), text)


def copied_sources(text: str) -> tuple[str, ...]:
    """The context paths (or patterns) every COPY and ADD without `--from` copies, in order."""
    sources: list[str] = []
    for instruction in instructions(text):
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        flags, rest = _split_flags(instruction.arguments + " ")
        if "from" in flags:
            continue
        rest = rest.strip()
        words = [str(word) for word in json.loads(rest)] if rest.startswith("[") else rest.split()
        sources += [word for word in words[:-1] if word not in sources]
    return tuple(sources)


# ----------------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (already cleaned) as a regular expression over a relative path."""
    out = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out += "(?:.*/)?"
            index += 3
        elif pattern.startswith("**", index):
            out += ".*"
            index += 2
        else:
            char = pattern[index]
            out += "[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char)
            index += 1
    return re.compile(out + r"\Z")


def ignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore lines as (is an exception, regex): comments and blank lines dropped, leading and
    trailing slashes removed."""
    patterns: list[tuple[bool, re.Pattern[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        cleaned = re.sub(r"/+", "/", line.lstrip("!").strip()).strip("/")
        if cleaned.startswith("./"):
            cleaned = cleaned[2:]
        if cleaned:
            patterns.append((exception, _pattern_regex(cleaned)))
    return patterns


def is_ignored(patterns: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """Whether the context leaves out `path` (relative, with `/`): the last pattern matching the
    path or one of its parent directories decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    ignored = False
    for exception, regex in patterns:
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not exception
    return ignored


def context_files(context: Path, dockerfile_text: str, dockerignore_text: str) -> list[str]:
    """The files (relative paths, sorted) that the COPY/ADD lines copy from `context`, without those
    .dockerignore leaves out. A source that matches nothing is an error, as in a build."""
    patterns = ignore_patterns(dockerignore_text)
    files: set[str] = set()
    for source in copied_sources(dockerfile_text):
        cleaned = source.strip("/").removeprefix("./") or "."
        matches = sorted(context.glob(cleaned)) if any(c in cleaned for c in "*?[") else [context / cleaned]
        matches = [path for path in matches if path.exists()]
        if not matches:
            raise FileNotFoundError(f"the Dockerfile copies {source!r}, which is not in {context}")
        for match in matches:
            candidates = sorted(match.rglob("*")) if match.is_dir() else [match]
            for path in candidates:
                relative = path.relative_to(context).as_posix()
                if (path.is_file() or path.is_symlink()) and not is_ignored(patterns, relative):
                    files.add(relative)
    return sorted(files)
