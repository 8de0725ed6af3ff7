"""Atomic checkpoints: a writer killed with SIGKILL mid-write leaves a loadable, self-consistent checkpoint at
the final path; the next start removes the temporary it left; a full disk or a read-only directory raises.

The writer is a child process saving 16 MB checkpoints through the training's own AtomicCheckpointIO in a
loop; each checkpoint's tensor is filled with its version number, so a torn or mixed file shows. The
full disk is a file-size limit (RLIMIT_FSIZE, the write fails with EFBIG like ENOSPC); the read-only
directory is a 0555 directory written by an unprivileged user (root ignores permissions).
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..atomic import TEMPORARIES
from ..lit.resume import AtomicCheckpointIO
from .common import ROOT, Check, child_env

NAME = "last.ckpt"
NUMEL = 4_000_000  # 16 MB of float32


def _checkpoint(version: int) -> dict:
    return {"version": version, "weights": torch.full((NUMEL,), float(version))}


def _consistent(path: Path) -> tuple[bool, int]:
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:
        return False, -1
    v = ckpt["version"]
    return bool((ckpt["weights"] == float(v)).all()) and ckpt["weights"].numel() == NUMEL, v


def _child(mode: str, directory: str) -> None:
    from ..atomic import remove_stale_temporaries

    directory = Path(directory)
    io = AtomicCheckpointIO()
    if mode == "writer":
        remove_stale_temporaries(directory)  # what train.py does when it starts
        print("started", flush=True)
        sys.stdin.readline()
        version = int(time.time() * 1000) % 10**9
        while True:
            version += 1
            io.save_checkpoint(_checkpoint(version), directory / NAME)
    if mode == "full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    if mode == "readonly":
        os.setgid(65534)
        os.setuid(65534)
    try:
        io.save_checkpoint(_checkpoint(7), directory / NAME)
    except Exception as e:  # torch.save reports a failed write as a RuntimeError
        print(f"raised {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print("reported success", flush=True)


def _spawn(mode: str, directory: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mulosd.reliability.atomic_writes", mode, str(directory)],
                            cwd=ROOT, env=child_env(), text=True, **kw)


def _stale(directory: Path) -> int:
    """Every temporary left: no writer is running where this is asked, and counting them without the sweep's
    own test of staleness checks that test too."""
    return len(list(directory.glob(TEMPORARIES)))


def kills(work: Path, n: int, seed: int = 0) -> Check:
    check = Check("atomic")
    rng = random.Random(seed)
    directory = work / "atomic"
    directory.mkdir(parents=True, exist_ok=True)
    # a checkpoint before the first kill, as in any resumed run: a kill then always has an old version to keep
    AtomicCheckpointIO().save_checkpoint(_checkpoint(0), directory / NAME)
    mid_write = 0
    proc = _spawn("writer", directory, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdout.readline()
    for i in range(1, n + 1):
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(rng.uniform(0.3, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        mid_write += _stale(directory) > 0
        ok, version = _consistent(directory / NAME)
        proc = _spawn("writer", directory, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # the next start
        proc.stdout.readline()  # "started": it has removed what the kill left
        stale = _stale(directory)
        check.trial(ok and stale == 0, f"kill {i}: final path consistent={ok} (version {version}), "
                                       f"{stale} stale temporaries after the next start")
    proc.kill()
    proc.wait()
    check.figures["killed_mid_write"] = mid_write
    return check


def refusals(work: Path, check: Check) -> Check:
    """A full disk and a read-only directory: the save raises, the previous checkpoint stays intact."""
    for mode in ("full", "readonly"):
        directory = work / f"atomic_{mode}"
        directory.mkdir(parents=True, exist_ok=True)
        AtomicCheckpointIO().save_checkpoint({"version": 1, "weights": torch.ones(4)}, directory / NAME)
        if mode == "readonly":
            directory.chmod(0o555)
        try:
            r = subprocess.run([sys.executable, "-m", "mulosd.reliability.atomic_writes", mode, str(directory)],
                               cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
        finally:
            directory.chmod(0o755)
        intact = torch.load(directory / NAME, weights_only=True)["version"] == 1
        check.trial(r.returncode == 3 and "raised" in r.stdout and intact and _stale(directory) == 0,
                    f"{mode}: exit {r.returncode}, said {r.stdout.strip()!r} {r.stderr[-300:]!r}, old checkpoint "
                    f"intact={intact}, {_stale(directory)} temporaries")
        check.figures[mode] = "raised" if r.returncode == 3 else "NOT RAISED"
    return check


def run(work: Path, n: int = 10, seed: int = 0) -> Check:
    return refusals(work, kills(work, n, seed))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
