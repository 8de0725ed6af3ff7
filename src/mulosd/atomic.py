"""Files that are either the old version or the new one, never torn.

Write to a temporary file in the target's own directory (a rename across filesystems would be a copy),
fsync it, rename it over the target, fsync the directory. A kill at any instant leaves the old file or the
new one; the temporary it may leave behind is removed by the next write or `remove_stale_temporaries` once its
writer (named in it by pid) has ended.
An error (a full disk, a read-only directory) propagates: nothing reports success that did not happen.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _writer_is_gone(tmp: Path) -> bool:
    """Whether the process a temporary is named after has ended: another process's write in progress is not
    stale, and removing its temporary would fail that write."""
    try:
        os.kill(int(tmp.name.rpartition(".tmp-")[2]), 0)
    except (ValueError, ProcessLookupError):
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def stale_temporaries(directory: Path, pattern: str = ".*.tmp-*") -> list[Path]:
    """The temporaries killed writers left in `directory`."""
    directory = Path(directory)
    return [p for p in directory.glob(pattern) if _writer_is_gone(p)] if directory.is_dir() else []


def remove_stale_temporaries(directory: Path, pattern: str = ".*.tmp-*") -> int:
    """Delete the temporaries killed writers left in `directory`; returns how many."""
    stale = stale_temporaries(directory, pattern)
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` for writers that take a file name (safetensors, torch.save): when the
    block ends without an error the file is synced and moved onto `path`; otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_temporaries(path.parent, f".{path.name}.tmp-*"):
        stale.unlink(missing_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync(path.parent)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Run `write(f)` on a temporary file and move the result to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
    return Path(path)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))
