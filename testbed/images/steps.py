"""Running the steps of an image build: logged, timed, named when they fail; no mount left behind.

Why: a cold build runs long external programs (debootstrap, buildah, gcc) whose output belongs in a
log, not on the terminal; the person waiting sees a progress line per step and one every 30 s, and a
failed step names itself, its exit status and its log, with the log's last lines. debootstrap mounts
/proc and /sys inside the root filesystem it builds (and leaves them when it fails), so before a build
directory is removed every mount under it is unmounted; a directory that still has one is never
removed, because removing files under a mounted /proc or /dev would reach the machine's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from testbed.common import Say, ToolError, tail

STILL_WORKING_EVERY: Final = 30.0
MOUNTINFO: Final = Path("/proc/self/mountinfo")


class Steps:
    """The steps of building image `name`, logged to `log`."""

    def __init__(self, name: str, log: Path, say: Say) -> None:
        self.name = name
        self.log = log
        self.say = say

    def run(
        self,
        what: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Runs `command` with its output appended to the log; ToolError naming `what` if it fails."""
        self.say(f"{self.name}: {what}")
        with self.log.open("ab") as log:
            log.write(f"\n===== {what}: {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                cwd=cwd,
            )
            last = time.monotonic()
            while process.poll() is None:
                time.sleep(0.2)
                if time.monotonic() - last >= STILL_WORKING_EVERY:
                    last = time.monotonic()
                    self.say(f"{self.name}: still working on {what} (log: {self.log})")
        if process.returncode != 0:
            self.fail(f"{what} (exit {process.returncode})")

    def output(self, what: str, command: Sequence[str]) -> str:
        """A short command's standard output; its error output goes to the log."""
        with self.log.open("ab") as log:
            log.write(f"\n===== {what}: {' '.join(command)}\n".encode())
            log.flush()
            result = subprocess.run(
                list(command), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, check=False
            )
        if result.returncode != 0:
            self.fail(f"{what} (exit {result.returncode})")
        return result.stdout.decode(errors="replace")

    def progress(self, what: str) -> Callable[[int], None]:
        """A callback for work done in this process (writing a layer): given the bytes done so far,
        it prints a line every STILL_WORKING_EVERY seconds."""
        last: list[float] = []

        def report(done: int) -> None:
            now = time.monotonic()
            if not last:
                last.append(now)
            elif now - last[0] >= STILL_WORKING_EVERY:
                last[0] = now
                self.say(f"{self.name}: still {what}, {done / 1e9:.1f} GB so far")

        return report

    def fail(self, what: str) -> None:
        """Raises the ToolError of a failed step, after printing the end of the log."""
        self.say(f"FAILED building {self.name}: {what}; last lines of {self.log}:")
        print(tail(self.log, 25), file=sys.stderr, flush=True)
        raise ToolError(f"building image {self.name} failed: {what} (log: {self.log})")


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes there."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(directory: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below `directory`, deepest first (as they must be unmounted)."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    root = os.path.realpath(directory)
    points = [Path(_unescape(line.split()[4])) for line in text.splitlines() if len(line.split()) > 4]
    inside = [point for point in points if str(point) == root or str(point).startswith(root + "/")]
    return sorted(set(inside), key=lambda point: len(point.parts), reverse=True)


def unmount_all(directory: Path) -> None:
    """Unmounts everything mounted under `directory`; ToolError naming what stays mounted."""
    for point in mounts_under(directory):
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    left = mounts_under(directory)
    if left:
        raise ToolError(f"still mounted under {directory}: {', '.join(map(str, left))}; unmount by hand")


def remove_tree(path: Path) -> None:
    """Removes a build directory, after unmounting anything under it (never with a mount inside);
    a file or symlink is simply removed."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        unmount_all(path)
        shutil.rmtree(path)
