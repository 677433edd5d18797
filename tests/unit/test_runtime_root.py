"""image/runtime_root.py, the operator image's root filesystem, on a made-up source tree (no ldd run).

The promises: a path comes with every symlink met on the way, as a symlink (merged /usr's /lib, a
library's soname chain, the virtualenv's python pointing outside it), so the loader and the
interpreter find what they look for by the names they use; a tree is copied less what `keep` refuses,
and a symlink pointing out of it brings its target; the standard library loses installers, GUIs, the
test suite and their extension modules, and keeps what the operator imports; `ldd`'s output is read
with the loader and without the vDSO, and a library not found fails; a dpkg record is written for each
package a copied file came from, not for packages that merely own a directory. The image itself is
built and looked into in testbed/tests/test_images_build.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from image import runtime_root
from image.runtime_root import Root


def touch(path: Path, content: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A merged-/usr tree with a library behind a soname link and a virtualenv whose python points out."""
    src = tmp_path / "src"
    lib = src / "usr/lib/x86_64-linux-gnu"
    touch(lib / "libssl.so.3.0.1", "ssl")
    (lib / "libssl.so.3").symlink_to("libssl.so.3.0.1")
    (src / "lib").symlink_to("usr/lib")
    touch(src / "usr/local/bin/python3.11", "python")
    (src / "usr/local/bin/python3").symlink_to("python3.11")
    (src / "usr/local/bin/python").symlink_to("python3")
    touch(src / "opt/venv/pyvenv.cfg", "home = /usr/local/bin\n")
    (src / "opt/venv/bin").mkdir(parents=True)
    (src / "opt/venv/bin/python").symlink_to("/usr/local/bin/python")
    (src / "opt/venv/lib64").symlink_to("lib")
    touch(src / "opt/venv/lib/python3.11/site-packages/controller/__init__.py")
    (src / "opt/venv/bin/dangling").symlink_to("/nowhere")
    return src


def test_a_path_comes_with_every_symlink_on_the_way(source: Path, tmp_path: Path) -> None:
    root = Root(tmp_path / "root", source)
    (tmp_path / "root").mkdir()
    stored = root.add("/lib/x86_64-linux-gnu/libssl.so.3")
    assert stored == "/usr/lib/x86_64-linux-gnu/libssl.so.3.0.1"
    assert os.readlink(tmp_path / "root/lib") == "usr/lib"
    assert os.readlink(tmp_path / "root/usr/lib/x86_64-linux-gnu/libssl.so.3") == "libssl.so.3.0.1"
    assert (tmp_path / "root/lib/x86_64-linux-gnu/libssl.so.3").read_text() == "ssl"
    assert root.regular == {"/usr/lib/x86_64-linux-gnu/libssl.so.3.0.1"}
    assert "/lib" in root.files
    assert "/usr/lib/x86_64-linux-gnu" not in root.files, "directories are not files"


def test_a_tree_brings_the_targets_of_its_outward_symlinks(source: Path, tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    root = Root(tmp_path / "root", source)
    root.add_tree("/opt/venv", lambda relative: not relative.startswith("lib/python3.11/site-packages/skip"))
    copied = tmp_path / "root"
    assert (copied / "opt/venv/lib/python3.11/site-packages/controller/__init__.py").is_file()
    assert os.readlink(copied / "opt/venv/lib64") == "lib"
    assert os.readlink(copied / "opt/venv/bin/python") == "/usr/local/bin/python"
    assert os.readlink(copied / "usr/local/bin/python") == "python3"
    assert (copied / "usr/local/bin/python3.11").read_text() == "python"
    assert os.readlink(copied / "opt/venv/bin/dangling") == "/nowhere", "a dangling link is kept as it is"


@pytest.mark.parametrize(
    ("relative", "kept"),
    [
        ("os.py", True),
        ("json/__init__.py", True),
        ("asyncio/base_events.py", True),
        ("__pycache__/os.cpython-311.pyc", True),
        ("lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so", True),
        ("lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so", True),
        ("site-packages/pip/__init__.py", False),
        ("ensurepip/_bundled/pip-24.0-py3-none-any.whl", False),
        ("venv/__init__.py", False),
        ("distutils/ccompiler.py", False),
        ("idlelib/idle.py", False),
        ("tkinter/__init__.py", False),
        ("test/test_os.py", False),
        ("turtle.py", False),
        ("__pycache__/turtle.cpython-311.pyc", False),
        ("config-3.11-x86_64-linux-gnu/Makefile", False),
        ("lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so", False),
        ("lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so", False),
        ("lib-dynload/_sqlite3.cpython-311-x86_64-linux-gnu.so", False),
    ],
)
def test_the_standard_library_keeps_what_runs_and_leaves_out_what_develops(relative: str, kept: bool) -> None:
    assert runtime_root.stdlib_kept(relative) is kept


def test_ldds_output_is_read_with_the_loader_and_without_the_vdso() -> None:
    output = """\
\tlinux-vdso.so.1 (0x00007ffc5a1f0000)
\tlibpython3.11.so.1.0 => /usr/local/bin/../lib/libpython3.11.so.1.0 (0x00007f1c2a400000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c2a21f000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f1c2aa5e000)
"""
    assert runtime_root.parse_ldd(output) == [
        "/usr/local/bin/../lib/libpython3.11.so.1.0",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ]
    with pytest.raises(ValueError, match=r"libffi\.so\.8 not found"):
        runtime_root.parse_ldd("\tlibffi.so.8 => not found\n")


def test_dpkg_records_name_the_packages_files_came_from(source: Path, tmp_path: Path) -> None:
    info = source / "var/lib/dpkg/info"
    touch(info / "libssl3:amd64.list", "/.\n/lib\n/usr/lib/x86_64-linux-gnu/libssl.so.3.0.1\n")
    touch(info / "base-files.list", "/.\n/lib\n/usr\n/usr/lib\n")
    status = "Package: libssl3\nStatus: install ok installed\nVersion: 3.0.20-1~deb12u2\n\n"
    status += "Package: base-files\nStatus: install ok installed\nVersion: 12.4\n"
    touch(source / "var/lib/dpkg/status", status)
    touch(source / "usr/share/doc/libssl3/copyright", "the licence")
    (tmp_path / "root").mkdir()
    root = Root(tmp_path / "root", source)
    root.add("/lib/x86_64-linux-gnu/libssl.so.3")
    assert runtime_root.record_packages(root) == ["libssl3"], "a directory's owners are not recorded"
    record = (tmp_path / "root/var/lib/dpkg/status.d/libssl3").read_text()
    assert record.startswith("Package: libssl3\n")
    assert "Version: 3.0.20-1~deb12u2" in record
    assert (tmp_path / "root/usr/share/doc/libssl3/copyright").read_text() == "the licence"


def test_a_file_listed_under_the_other_side_of_merged_usr_is_found() -> None:
    assert list(runtime_root.usr_aliases("/usr/lib/x86_64-linux-gnu/libc.so.6")) == [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ]
    assert list(runtime_root.usr_aliases("/lib/x")) == ["/lib/x", "/usr/lib/x"]
