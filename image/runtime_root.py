"""The operator image's root filesystem, assembled in the Dockerfile's build stage for a FROM scratch stage.

Why: the base image (python:3.11-slim, or the dev cluster's Debian stand-in) is a whole Debian with a
shell, apt, dpkg, perl, pip, setuptools and wheel, none of which the operator runs, and each of which
is something to patch and something an intruder can use. The final stage copies only what this
script puts under ROOT: the virtualenv (which never held pip), the interpreter its `python` points at
and the symlinks on the way, the standard library less what only development needs (LEFT_OUT), and
the shared libraries that every ELF file among them loads, as `ldd` resolves them (plus libgcc_s,
which glibc loads at run time to unwind a thread). Then what a process expects to find: CA
certificates, /etc/passwd and /etc/group with the image's user, nsswitch.conf, os-release, an empty
/tmp, the dynamic loader's cache, and, for vulnerability scanners, one dpkg status file per Debian
package a copied file came from (the layout distroless images use). Paths keep their place, so the
same script serves both bases (/usr/local for python:3.11-slim, /usr for Debian's python3).

`--check PACKAGES` then runs the copied interpreter chrooted into ROOT and imports every module of
those packages: a library or module left out fails the build, not the operator at run time.

    python runtime_root.py VENV ROOT [--check controller,builders]

Standard library only: it runs with the base image's Python before anything else is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Final

# Top-level entries of the standard library that only development, packaging or an interactive
# session uses: installers and build tools (ensurepip carries pip's wheel), GUIs, the test suite.
LEFT_OUT: Final = frozenset(
    {
        "site-packages",
        "dist-packages",
        "ensurepip",
        "venv",
        "distutils",
        "lib2to3",
        "idlelib",
        "tkinter",
        "turtledemo",
        "turtle.py",
        "pydoc_data",
        "test",
        "curses",
        "sqlite3",
        "dbm",
        "crypt.py",
    }
)
# Build configuration (Makefile, the static library) for compiling extension modules.
LEFT_OUT_PREFIXES: Final = ("config-",)
# Extension modules of what LEFT_OUT leaves out, and the interpreter's own test modules.
LEFT_OUT_EXTENSIONS: Final = re.compile(
    r"(_tkinter|_test\w*|_ctypes_test|xxlimited\w*|xxsubtype|_xxtestfuzz"
    r"|_curses\w*|readline|_sqlite3|_dbm|_gdbm|_crypt|nis)\."
)
# Found beside libc and added although no ELF file names it: glibc opens it when a thread exits.
RUNTIME_LOADED: Final = ("libgcc_s.so.1",)
ETC_FILES: Final = ("/etc/nsswitch.conf", "/etc/os-release", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"
# The image's users: no passwords (x: shadow, which the image does not have), no login shell.
USERS: Final = (
    "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
)
GROUP: Final = "root:x:0:\nnonroot:x:65532:\n"
MAX_LINKS: Final = 40


def stdlib_kept(relative: str) -> bool:
    """Whether a path under the standard library's directory (relative, with `/`) goes into the image."""
    parts = relative.split("/")
    top = parts[0]
    if top in LEFT_OUT or top.startswith(LEFT_OUT_PREFIXES):
        return False
    if top == "__pycache__" and len(parts) > 1:
        module = parts[1].split(".", 1)[0]
        return module not in LEFT_OUT and f"{module}.py" not in LEFT_OUT
    if top == "lib-dynload" and len(parts) > 1:
        return not LEFT_OUT_EXTENSIONS.match(parts[1])
    return True


def parse_ldd(output: str) -> list[str]:
    """The libraries `ldd` resolved (the dynamic loader included, the kernel's vDSO not); ValueError
    naming a library that was not found."""
    found: list[str] = []
    for raw in output.splitlines():
        line = raw.strip()
        if "=>" in line:
            name, _, rest = line.partition("=>")
            target = rest.strip()
            if target.startswith("not found"):
                raise ValueError(f"{name.strip()} not found")
            path = target.rsplit(" (", 1)[0].strip()
            if path.startswith("/"):
                found.append(path)
        elif line.startswith("/"):
            found.append(line.rsplit(" (", 1)[0].strip())
    return found


def is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


class Root:
    """A root filesystem under `root`, filled from the one under `source` ("/" in the image build)."""

    def __init__(self, root: Path, source: Path = Path("/")) -> None:
        self.root = root
        self.source = source
        self.files: set[str] = set()  # the files and symlinks added (absolute), not the directories
        self.regular: set[str] = set()  # the regular files copied, where they are stored

    def _in(self, base: Path, path: str) -> Path:
        return base / path.lstrip("/")

    def add(self, path: str, depth: int = 0) -> str:
        """Copies `path` (absolute, in the source) with every symlink met on the way (as a symlink)
        and the directories above it; returns where its content is stored."""
        if depth > MAX_LINKS:
            raise ValueError(f"too many symbolic links resolving {path}")
        parts = PurePosixPath(os.path.normpath(path)).parts[1:]
        current = "/"
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            source, target = self._in(self.source, current), self._in(self.root, current)
            if source.is_symlink():
                link = os.readlink(source)
                if not os.path.lexists(target):
                    os.symlink(link, target)
                self.files.add(current)
                rest = parts[index + 1 :]
                resolved = os.path.normpath(os.path.join(os.path.dirname(current), link, *rest))
                return self.add(resolved, depth + 1)
            if source.is_dir():
                if not target.is_dir():
                    target.mkdir()
                    shutil.copystat(source, target)
            elif index == len(parts) - 1:
                if not target.exists():
                    shutil.copy2(source, target)
                self.files.add(current)
                self.regular.add(current)
            else:
                raise FileNotFoundError(f"{current} is not a directory (resolving {path})")
        return current

    def add_tree(self, path: str, keep: Callable[[str], bool] = lambda relative: True) -> None:
        """Copies a directory's content that `keep` accepts (given paths relative to it); symlinks stay
        symlinks, and one pointing outside the tree brings its target along."""
        stored = self.add(path)
        top = self._in(self.source, stored)
        for directory, subdirectories, files in os.walk(top):
            here = Path(directory)
            relative_dir = here.relative_to(top).as_posix()
            for name in list(subdirectories):
                relative = name if relative_dir == "." else f"{relative_dir}/{name}"
                if not keep(relative):
                    subdirectories.remove(name)
                elif (here / name).is_symlink():
                    subdirectories.remove(name)
                    self.add(os.path.join(stored, relative))
                else:
                    self.add(os.path.join(stored, relative))
            for name in files:
                relative = name if relative_dir == "." else f"{relative_dir}/{name}"
                if not keep(relative):
                    continue
                try:
                    self.add(os.path.join(stored, relative))
                except FileNotFoundError:
                    if not (here / name).is_symlink():
                        raise
                    # A dangling symlink: add() made the link before it failed to follow it.

    def write(self, path: str, content: str, mode: int = 0o644) -> None:
        target = self._in(self.root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        target.chmod(mode)
        self.files.add(path)

    def elf_files(self) -> list[str]:
        return sorted(path for path in self.regular if is_elf(self._in(self.source, path)))


def ldd(path: str) -> list[str]:
    """The shared libraries `path` loads, transitively, as the build stage's loader resolves them."""
    result = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        # A static program or a file ldd does not take: nothing to load.
        if "not a dynamic executable" in result.stdout + result.stderr:
            return []
        raise RuntimeError(f"ldd {path}: {result.stderr.strip() or result.stdout.strip()}")
    try:
        return parse_ldd(result.stdout)
    except ValueError as error:
        raise RuntimeError(f"{path}: {error}") from None


def add_libraries(root: Root) -> None:
    """The shared libraries of every ELF file copied so far, until nothing new is needed."""
    done: set[str] = set()
    while pending := [path for path in root.elf_files() if path not in done]:
        for path in pending:
            done.add(path)
            for library in ldd(path):
                # By the name the loader uses (the ELF interpreter's path is fixed in each program);
                # add() brings the symlinks on the way.
                directory, name = os.path.split(os.path.normpath(library))
                root.add(library)
                for extra in RUNTIME_LOADED:
                    if name.startswith("libc.so") and os.path.exists(os.path.join(directory, extra)):
                        root.add(os.path.join(directory, extra))


# ------------------------------------------------------------------------------------ dpkg status


def dpkg_owners(info: Path) -> dict[str, str]:
    """Every path a Debian package installed, to the package's name (from /var/lib/dpkg/info/*.list)."""
    owners: dict[str, str] = {}
    for listing in sorted(info.glob("*.list")):
        package = listing.name.removesuffix(".list").split(":", 1)[0]
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("/"):
                owners.setdefault(line, package)
    return owners


def status_stanzas(text: str) -> dict[str, str]:
    """/var/lib/dpkg/status as {package: its stanza}."""
    stanzas: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        match = re.search(r"^Package: (\S+)$", stanza, re.MULTILINE)
        if match:
            stanzas[match.group(1)] = stanza.strip() + "\n"
    return stanzas


def usr_aliases(path: str) -> Iterable[str]:
    """`path` and its name on the other side of Debian's merged /usr (/lib/x <-> /usr/lib/x)."""
    yield path
    if path.startswith("/usr/"):
        yield path.removeprefix("/usr")
    else:
        yield "/usr" + path


def record_packages(root: Root) -> list[str]:
    """Writes var/lib/dpkg/status.d/<package> for each package a copied path came from, and brings
    its copyright file along; returns the packages."""
    info = root.source / "var/lib/dpkg/info"
    status = root.source / "var/lib/dpkg/status"
    if not info.is_dir() or not status.is_file():
        return []
    owners = dpkg_owners(info)
    stanzas = status_stanzas(status.read_text(encoding="utf-8", errors="replace"))
    # Files only: a directory (or a symlink to one, such as /lib) is listed by many packages.
    files = [path for path in root.files if not (root.source / path.lstrip("/")).is_dir()]
    packages = sorted({owners[alias] for path in files for alias in usr_aliases(path) if alias in owners})
    for package in packages:
        if package in stanzas:
            root.write(f"/var/lib/dpkg/status.d/{package}", stanzas[package])
        copyright_file = f"/usr/share/doc/{package}/copyright"
        if (root.source / copyright_file.lstrip("/")).is_file():
            root.add(copyright_file)
    return packages


# ------------------------------------------------------------------------------------------- main


def assemble(venv: str, root: Root) -> None:
    """Everything but the check: see the module's docstring."""
    interpreter = os.path.join(venv, "bin", "python")
    root.add_tree(venv)
    root.add(interpreter)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        root.add_tree(paths[key], stdlib_kept)
    add_libraries(root)
    for path in (CA_BUNDLE, *ETC_FILES):
        if os.path.lexists(root.source / path.lstrip("/")):
            if (root.source / path.lstrip("/")).is_dir():
                root.add_tree(path)
            else:
                root.add(path)
    root.write("/etc/passwd", USERS)
    root.write("/etc/group", GROUP)
    (root.root / "tmp").mkdir(exist_ok=True)
    (root.root / "tmp").chmod(0o1777)
    record_packages(root)
    subprocess.run(["ldconfig", "-X", "-r", str(root.root)], check=True)


def check(venv: str, root: Path, packages: list[str]) -> None:
    """Imports every module of `packages` with the copied interpreter, chrooted into `root`."""
    program = (
        "import importlib, pkgutil, sys\n"
        f"for name in {packages!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, name + '.'):\n"
        "        if not module.name.endswith('.__main__'):\n"
        "            importlib.import_module(module.name)\n"
        "print('imported', len(sys.modules), 'modules')\n"
    )
    python = os.path.join(venv, "bin", "python")
    env = {"PATH": os.path.join(venv, "bin"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [
            shutil.which("chroot") or "/usr/sbin/chroot",
            "--userspec=65532:65532",
            str(root),
            python,
            "-c",
            program,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"the runtime root cannot import the operator:\n{result.stderr[-3000:]}")
    print(result.stdout.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", help="the virtualenv to run (its bin/python names the interpreter)")
    parser.add_argument("root", type=Path, help="where to assemble the root filesystem (created)")
    parser.add_argument("--check", default="", help="comma-separated packages to import in the result")
    arguments = parser.parse_args(argv)
    arguments.root.mkdir(parents=True)
    root = Root(arguments.root)
    assemble(arguments.venv, root)
    packages = [name for name in arguments.check.split(",") if name]
    if packages:
        check(arguments.venv, arguments.root, packages)
    print(f"runtime root: {len(root.regular)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
