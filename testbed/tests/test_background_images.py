"""The real node's images built in the background (BackgroundBuilds' `image:NAME` entries), cold.

Why: `make test` builds only the images the real node's first tests use before the session; the
others are built in the background while the tests run, and a test's `ensure` (a fixture's, the
node's import) meets the background's build on the image's cache lock instead of building it twice.
Proven here with the two small images (pause, busybox: a fraction of a second each) in a scratch
cache (TJ_CACHE_DIR), never the real one's gigabytes. Root only, as every image build.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from testbed.cluster.kube_bins import BackgroundBuilds, image_build, is_cached, uncached
from testbed.common import wait_until
from testbed.images import cache, ensure

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="building the real node's images needs root")


@pytest.fixture
def scratch_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty image cache of the test's own; the log the background builds write."""
    for tool in ("gcc", "busybox"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (`make node-tools`)")
    monkeypatch.setenv("TJ_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "background-builds.log"


def half_built(name: str) -> list[str]:
    root = cache.cache_root() / name
    return [path.name for path in root.iterdir() if path.name.startswith(".build-")] if root.is_dir() else []


def test_uncached_images_are_built_in_the_background_into_the_cache_in_the_order_given(
    scratch_cache: Path,
) -> None:
    log = scratch_cache
    assert uncached(["image:busybox", "image:pause"]) == ["image:busybox", "image:pause"]
    builds = BackgroundBuilds([image_build("busybox"), image_build("pause")], log)
    assert builds.components == ["image:busybox", "image:pause"]  # neither is cached in this cache
    builds.start()
    try:
        assert builds.process is not None
        assert builds.process.wait(timeout=300) == 0
    finally:
        builds.stop()
    text = log.read_text()
    assert text.index("busybox: cold build") < text.index("pause: cold build"), text
    assert is_cached("image:busybox")
    assert is_cached("image:pause")
    assert uncached(["image:busybox", "image:pause"]) == []
    # What a fixture's ensure then gets is the background's build, not a second one.
    image = ensure("pause")
    assert image.archive.parent == cache.build_dir("pause", image.key)
    kept = sorted(
        path.name for path in (cache.cache_root() / "pause").iterdir() if not path.name.startswith(".")
    )
    assert kept == sorted([image.key, "build.log"])
    assert BackgroundBuilds([image_build("pause")], log).components == []  # cached: nothing to build


def test_a_background_image_build_waits_for_the_images_lock_and_stops_on_request(scratch_cache: Path) -> None:
    """A test's ensure holds the image's lock: the background waits for it (and would find the image
    built); stopped meanwhile, it ends at once and leaves nothing half-built."""
    log = scratch_cache
    with cache.locked("pause", on_wait=lambda: None):
        builds = BackgroundBuilds([image_build("pause")], log)
        builds.start()
        try:
            wait_until(
                "the background build to wait for the lock",
                lambda: "pause: another build holds its lock; waiting" in log.read_text(),
                timeout=60,
            )
            assert builds.process is not None
            assert builds.process.poll() is None
        finally:
            builds.stop(timeout=20)
    assert "cold build" not in log.read_text()
    assert not is_cached("image:pause")
    assert half_built("pause") == []
