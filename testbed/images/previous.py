"""The `operator-previous` image: the operator as the previous release built it, for the upgrade test.

Why: an upgrade is tested from a version that really ran before (tests/e2e/test_upgrade_real_node.py
deploys it, starts jobs under it, then deploys this tree over it). The previous version is one commit,
pinned here, and its image is built by the `operator` recipe itself from that commit's files
(`git archive` into the build's work directory: the commit's own Dockerfile, sources and lock), so the
image is what that commit's `make docker-build` gave. The key covers the commit and the base image's
key; the commit's content cannot change, so nothing else can.

PREVIOUS_COMMIT: the last commit before the work on in-place restarts and upgrades (issue 33) began,
the state whose suite passed on fresh clones (README, "make test"). Move it forward to the commit of a
release when one is cut; the commit must be in the clone's history (a shallow clone does not hold it).
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Mapping
from typing import Final

from testbed.common import ToolError
from testbed.images import operator
from testbed.images.keys import KeyInputs
from testbed.images.recipe import Build, Context, Recipe

PREVIOUS_COMMIT: Final = "ddc1562ff588eaa56bbcde5a6411e8e945160b73"
NAME: Final = "operator-previous"


def short_commit() -> str:
    return PREVIOUS_COMMIT[:7]


def reference() -> str:
    """The image's one reference: the operator's name, tagged with the commit (no registry host)."""
    return f"trainingjob-operator:previous-{short_commit()}"


def references(context: Context) -> tuple[str, ...]:
    return (reference(),)


def inputs(context: Context, keys: Mapping[str, str], into: KeyInputs) -> None:
    into.text("commit", PREVIOUS_COMMIT)


def export_commit(build: Build) -> Build:
    """The commit's files in the build's work directory (`git archive`), and the build as the
    `operator` recipe sees it: that directory as its repository."""
    source = build.work / "source"
    source.mkdir()
    archive = build.work / "source.tar"
    repo = build.context.repo
    found = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        raise ToolError(
            f"building image {NAME} needs commit {short_commit()} in {repo}'s history: a full clone has it "
            "(`git fetch --unshallow` for a shallow one)"
        )
    build.steps.run(
        f"git archive {short_commit()}",
        ["git", "-C", str(repo), "archive", "--format=tar", f"--output={archive}", PREVIOUS_COMMIT],
    )
    build.steps.run("unpack it", ["tar", "-xf", str(archive), "-C", str(source)])
    work = build.work / "operator"
    work.mkdir()
    return dataclasses.replace(build, context=dataclasses.replace(build.context, repo=source), work=work)


def build(build: Build) -> dict[str, object]:
    return operator.build(export_commit(build))


RECIPE: Final = Recipe(
    name=NAME,
    summary=f"the operator's Dockerfile at commit {PREVIOUS_COMMIT[:7]}, built as the operator image is",
    revision=1,
    references=references,
    inputs=inputs,
    build=build,
    depends=("base",),
    tools=(*operator.RECIPE.tools, ("git", "git")),
    needs_root=True,
)
