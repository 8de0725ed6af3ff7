"""Atomic writes: a file is its old version or its new one, and a sweep of stale temporaries removes only what
a writer that has ended left (the kill -9 trials are the reliability battery's)."""

import os
import subprocess

import pytest

from mulosd.atomic import atomic_write, remove_stale_temporaries


def test_a_torn_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "x.bin"
    atomic_write(target, lambda f: f.write(b"old"))

    def torn(f):
        f.write(b"new, half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, torn)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_a_write_in_progress_elsewhere_keeps_its_temporary_and_an_ended_writers_is_removed(tmp_path):
    """Two processes may write one file at once (DDP ranks filling a cache)."""
    live, ended = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["true"])
    ended.wait()
    try:
        for p in (live, ended):
            (tmp_path / f".x.bin.tmp-{p.pid}").write_bytes(b"half")
        atomic_write(tmp_path / "x.bin", lambda f: f.write(b"new"))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".x.bin.tmp-{live.pid}", "x.bin"])
    finally:
        live.kill()
        live.wait()


def test_the_sweep_takes_its_own_pids_leftovers_and_keeps_names_it_did_not_make(tmp_path):
    """A restart in a fresh PID namespace gets the pid of the run it resumes; a name no writer of ours makes
    (or a pid out of range) is left alone."""
    mine = f".a.ckpt.tmp-{os.getpid()}"
    others = [".a.ckpt.tmp-notapid", ".a.ckpt.tmp-0", ".a.ckpt.tmp-99999999999", ".b.ckpt.tmp-1"]
    for name in [mine, *others]:
        (tmp_path / name).write_bytes(b"half")
    assert remove_stale_temporaries(tmp_path, ".a.ckpt.tmp-*") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
