"""python -m mulosd.reliability [--quick] [--work DIR] [--json FILE]

Runs the battery on a tiny world made on the spot (random tokenizer, SynthScenes shards) and prints one line
of figures per check, then
    reliability: resume=A/A atomic=B/B faults=C/C typos=D/D unsafe_loads=0 nan_ckpts=0 ddp=ok
--quick: 3 kill-and-resume trials and 8 killed writes (make test's size); the full battery: 20 and 50.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import atomic_writes, ddp, faults, nanguard, resume, safeload, typos
from .common import Check, load_checkpoint, make_world, nonfinite_tensors


def nan_checkpoints(work: Path) -> int:
    return sum(bool(nonfinite_tensors(load_checkpoint(p))) for p in work.rglob("checkpoints/*.ckpt"))


def summary(checks: dict[str, Check], unsafe_loads: int, nan_ckpts: int) -> str:
    def frac(name):
        c = checks[name]
        return f"{c.passed}/{c.total}"

    return (f"reliability: resume={frac('resume')} atomic={frac('atomic')} faults={frac('faults')} "
            f"typos={frac('typos')} unsafe_loads={unsafe_loads} nan_ckpts={nan_ckpts} "
            f"ddp={'ok' if checks['ddp'].ok else 'FAILED'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mulosd.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 kill-and-resume trials, 8 killed writes")
    p.add_argument("--work", type=Path, help="keep the runs here (default: a temporary directory, removed)")
    p.add_argument("--json", type=Path, help="also write the figures and failures here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="mulosd_reliability_"))
    work.mkdir(parents=True, exist_ok=True)
    kills, writes = (3, 8) if args.quick else (20, 50)
    start = time.perf_counter()
    world = make_world(work / "world")
    plan = [("resume", lambda: resume.run(world, work / "resume", kills=kills, seed=args.seed)),
            ("sigterm", lambda: resume.sigterm(world, work / "resume")),
            ("atomic", lambda: atomic_writes.run(work / "atomic", n=writes, seed=args.seed)),
            ("faults", lambda: faults.run(work / "faults", seed=args.seed)),
            ("typos", lambda: typos.run(world, work / "typos")),
            ("nan_guards", lambda: nanguard.run(world, work / "nan")),
            ("ddp", lambda: ddp.run(world, work / "ddp")),
            ("safe_loading", lambda: safeload.run(world, work / "safe", [work], sorted(work.rglob("export"))))]
    checks: dict[str, Check] = {}
    try:
        for i, (name, fn) in enumerate(plan, 1):
            t = time.perf_counter()
            try:
                checks[name] = fn()
            except Exception as e:  # noqa: BLE001 - a check that crashes is a failed check, the battery goes on
                checks[name] = Check(name, failures=[f"crashed: {type(e).__name__}: {e}"], total=1)
            print(f"[{i}/{len(plan)} {time.perf_counter() - start:5.0f} s] {checks[name].line()} "
                  f"in {time.perf_counter() - t:.0f} s", flush=True)
            for failure in checks[name].failures[:10]:
                print(f"    {failure}", flush=True)
        unsafe = checks["safe_loading"].figures.get("unsafe_loads", 1) if checks["safe_loading"].total else 1
        nan_ckpts = nan_checkpoints(work)
        line = summary(checks, unsafe, nan_ckpts)
        ok = all(c.ok for c in checks.values()) and unsafe == 0 and nan_ckpts == 0
        if args.json:
            args.json.write_text(json.dumps({name: {"passed": c.passed, "total": c.total, "figures": c.figures,
                                                    "failures": c.failures} for name, c in checks.items()}
                                            | {"line": line, "ok": ok}, indent=2, default=str) + "\n")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"battery {'passed' if ok else 'FAILED'} in {time.perf_counter() - start:.0f} s")
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
