"""Files that are either the old version or the new one, never torn.

Write to a temporary file in the target's own directory (a rename across filesystems would be a copy),
fsync it, rename it over the target, fsync the directory. A kill at any instant leaves the old file or the
new one; the temporary it may leave behind is removed by the next write or `remove_stale_temporaries` once its
writer (a process on this machine, named in it by pid) has ended.
An error (a full disk, a read-only directory) propagates: nothing reports success that did not happen.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

TEMPORARIES = ".*.tmp-*"  # every name temporary_name makes


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _writer_is_gone(tmp: Path) -> bool:
    """Whether the process a temporary is named after has ended. A write in progress elsewhere is not stale:
    removing its temporary would fail that write. Pids are this machine's: a writer on another host sharing
    the directory is not seen."""
    suffix = tmp.name.rpartition(".tmp-")[2]
    pid = int(suffix) if suffix.isascii() and suffix.isdigit() else 0
    if not 0 < pid < 2**31:
        return False  # not a name temporary_name makes: not ours to delete
    if pid == os.getpid():
        return True  # left by an earlier process with our pid (a restart in a fresh PID namespace)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False  # alive (or its pid reused: the file then waits for a later sweep)


def stale_temporaries(directory: Path, pattern: str = TEMPORARIES) -> list[Path]:
    """The temporaries matching `pattern` in `directory` whose writers have ended (killed mid-write)."""
    directory = Path(directory)
    return [p for p in directory.glob(pattern) if _writer_is_gone(p)] if directory.is_dir() else []


def remove_stale_temporaries(directory: Path, pattern: str = TEMPORARIES) -> int:
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
    remove_stale_temporaries(path.parent, f".{glob.escape(path.name)}.tmp-*")
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
