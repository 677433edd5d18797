"""The Go-built binaries from Python: the control plane's directory, and optional components by name.

Why: hack/kube-bins.sh owns building and caching (see testbed/addons/README.md); the dev cluster and the tests
only need "the directory of the control plane" or "the path of helm", built on first use. Its
progress lines go to this process's stderr as they come (a cold build takes minutes), and a failed
build is one ToolError naming the component; the script has printed the end of its log already.

    from testbed.cluster.kube_bins import component_binary
    helm = component_binary("helm")   # builds helm once, then returns the cached binary at once
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from testbed import images
from testbed.common import REPO, ToolError, process_start_time, still_running

SCRIPT: Final = REPO / "hack" / "kube-bins.sh"
# A background build of one of the real node's images (testbed/images) rather than of a Go component.
IMAGE_PREFIX: Final = "image:"
# BackgroundBuilds' loop ($0 is SCRIPT): each build in turn, a failed one leaving the rest to go on
# (the test that needs it fails naming it). An image is built by the machine's python3 from the
# repository's root, as hack/dev-cluster.sh builds them.
BUILD_LOOP: Final = """for component; do
  case $component in
    image:*) python3 -m testbed.images ensure "${component#image:}" || true ;;
    *) "$0" ensure "$component" || true ;;
  esac
done"""


def cache_base() -> Path:
    """The project's cache directory under the home directory (as hack/kube-bins.sh computes it)."""
    explicit = os.environ.get("TJ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainingjob-operator"


def ensure(component: str | None = None) -> Path:
    """The cache directory of the control plane (no `component`) or of one optional component,
    building it first unless it is cached."""
    what = component or "the control plane"
    command = [str(SCRIPT), "ensure", *([component] if component else [])]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ToolError(f"building {what} failed (see the messages above)")
    return Path(result.stdout.strip().splitlines()[-1])


def component_binary(component: str) -> Path:
    """The path of an optional component's binary (e.g. "helm"), built on first use. Each component's
    cache directory holds its binary under the component's name."""
    return ensure(component) / component


def image_build(name: str) -> str:
    """The name BackgroundBuilds and is_cached know image `name` by (`image:trainer-mpi`)."""
    return IMAGE_PREFIX + name


def is_cached(component: str) -> bool:
    """Whether an optional component, or an image (`image:NAME`), is built already (`ensure` would
    return at once)."""
    if component.startswith(IMAGE_PREFIX):
        return images.describe(component.removeprefix(IMAGE_PREFIX)).built
    result = subprocess.run([str(SCRIPT), "dir", component], stdout=subprocess.PIPE, text=True, check=False)
    return result.returncode == 0 and (Path(result.stdout.strip()) / "VERSIONS").is_file()


def uncached(components: list[str]) -> list[str]:
    """Those of `components` (and images, `image:NAME`) not built yet, in their order; the images'
    keys are computed once for all (a trainer's reads the virtualenv: about a second each)."""
    memo: dict[str, images.Image] = {}

    def built(component: str) -> bool:
        if component.startswith(IMAGE_PREFIX):
            return images.describe(component.removeprefix(IMAGE_PREFIX), memo=memo).built
        return is_cached(component)

    return [component for component in components if not built(component)]


def buildable_here(component: str) -> bool:
    """Whether a background build of it can succeed: an image needs root (debootstrap, chroot,
    buildah) and, for a trainer, its framework in the virtualenv."""
    if not component.startswith(IMAGE_PREFIX):
        return True
    return os.geteuid() == 0 and images.unavailable(component.removeprefix(IMAGE_PREFIX)) is None


class BackgroundBuilds:
    """Optional components built one after the other in a background process at the lowest CPU
    priority, while something else (a test session) runs: a cold machine builds them on the CPU the
    tests leave idle instead of in front of the first test that needs each. Whoever needs one calls
    `ensure` as before, which waits on the component's build lock while the background builds it.
    The real node's images go in the same line (`image:NAME`, `python3 -m testbed.images ensure
    NAME`; the image cache has a lock per image too), where they can be built here.
    `stop` ends the builds still running (their half-built directories are removed)."""

    def __init__(self, components: list[str], log: Path) -> None:
        self.components = uncached([component for component in components if buildable_here(component)])
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if not self.components:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as output:
            # Same session as the caller (process_group, not a new session): with the kernel's
            # autogroup scheduling a new session would compete as an equal, and nice would not count.
            self.process = subprocess.Popen(
                ["nice", "-n", "19", "bash", "-c", BUILD_LOOP, str(SCRIPT), *self.components],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                process_group=0,
            )
        record = {"pid": self.process.pid, "start_time": process_start_time(self.process.pid)}
        self.pid_file.write_text(json.dumps(record) + "\n")

    @property
    def pid_file(self) -> Path:
        """Where the builds' process group is recorded while they run, for `stop_left_behind`."""
        return self.log.with_suffix(".pid")

    @classmethod
    def stop_left_behind(cls, log: Path, timeout: float = 30.0) -> bool:
        """Stops the builds that a BackgroundBuilds logging to `log` started and could not stop (its
        process was killed: a test run's worker ended by an interrupted run); whether any ran."""
        builds = cls([], log)
        try:
            record = json.loads(builds.pid_file.read_text())
        except (OSError, ValueError):
            return False
        builds.pid_file.unlink(missing_ok=True)
        if not still_running(record):
            return False
        _stop_group(int(record["pid"]), timeout)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        _stop_group(process.pid, timeout, reap=process.poll)
        process.wait()
        self.pid_file.unlink(missing_ok=True)


def _stop_group(group: int, timeout: float, reap: Callable[[], int | None] | None = None) -> None:
    """Ends a process group of builds: SIGTERM (they remove their half-built directories on it),
    waits for every process of the group (the loop's shell first ends, the script and go after it;
    `reap` collects the leader when it is our child), then kills what is left."""
    signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while (reap is not None and reap() is None) or signal_group(group, 0):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    signal_group(group, signal.SIGKILL)


def signal_group(group: int, signum: int) -> bool:
    """Sends `signum` to a process group; whether any process of it was there."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    return True
