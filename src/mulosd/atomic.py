"""Files that are either the old version or the new one, never torn.

Write to a temporary file in the target's own directory (a rename across filesystems would be a copy),
fsync it, rename it over the target, fsync the directory. A kill at any instant leaves the old file or the
new one; the temporary it may leave behind is removed by the next write or `remove_stale_temporaries`.
An error (a full disk, a read-only directory) propagates: nothing reports success that did not happen.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def stale_temporaries(directory: Path) -> list[Path]:
    """The temporaries killed writers left in `directory`."""
    directory = Path(directory)
    return list(directory.glob(".*.tmp-*")) if directory.is_dir() else []


def remove_stale_temporaries(directory: Path) -> int:
    """Delete the temporaries a killed writer left in `directory`; returns how many."""
    stale = stale_temporaries(directory)
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Run `write(f)` on a temporary file and move the result to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        stale.unlink(missing_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))
