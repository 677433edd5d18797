"""Whether a program is a statically linked executable: the one-file images depend on it.

Why: the pause and busybox images hold a single binary and no C library, so a binary that needs the
dynamic loader would fail in the image at run time (`no such file or directory` for the loader). A
static executable has no PT_INTERP program header; that is checked here from the ELF headers,
without `file` or `ldd`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final

PT_INTERP: Final = 3
ET_EXEC: Final = 2
ET_DYN: Final = 3


def is_static_executable(path: Path) -> bool:
    """An ELF executable (64 or 32 bit, either byte order) without a program interpreter."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return False
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    (kind,) = struct.unpack_from(order + "H", data, 16)
    if kind not in (ET_EXEC, ET_DYN):
        return False
    if wide:
        (table,) = struct.unpack_from(order + "Q", data, 32)
        entry_size, count = struct.unpack_from(order + "HH", data, 54)
    else:
        (table,) = struct.unpack_from(order + "I", data, 28)
        entry_size, count = struct.unpack_from(order + "HH", data, 42)
    for index in range(count):
        (segment,) = struct.unpack_from(order + "I", data, table + index * entry_size)
        if segment == PT_INTERP:
            return False
    return True
