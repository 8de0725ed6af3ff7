"""Distributed: sampler training with trainer=ddp on 2 CPU processes (gloo) runs to the end, each rank reads
its own shards (disjoint sample keys), and the run leaves one checkpoint directory, one log directory and
one export, written by rank 0."""

from __future__ import annotations

import json
from pathlib import Path

from .common import Check, World, load_checkpoint, train

BATCHES = 4


def run(world: World, work: Path) -> Check:
    check = Check("ddp")
    run_dir = work / "ddp"
    r = train(run_dir, [*world.sampler("token_ce"), "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                        "trainer.strategy=ddp", "trainer.precision=32-true", "data.resampled=false",
                        "data.num_workers=0", "data.synth.val_shards=2", f"model.train.batches={BATCHES}",
                        "model.train.ckpt_every=2", "model.train.val_every=1000", "logger=csv",
                        "trainer.log_every_n_steps=1",
                        f"logger.save_dir={run_dir / 'logs'}"], timeout=900)
    if not check.trial(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-1500:]}"):
        return check
    keys = []
    for rank in (0, 1):
        log = run_dir / f"consumed_keys.rank{rank}.jsonl"
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        keys.append({k for row in rows for k in row["keys"]})
        check.trial(len(rows) == BATCHES, f"rank {rank} logged {len(rows)} batches, want {BATCHES}")
    check.trial(keys[0].isdisjoint(keys[1]) and all(keys), f"ranks share samples: {sorted(keys[0] & keys[1])[:5]}")
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    last = load_checkpoint(run_dir / "checkpoints" / "last.ckpt") if "last.ckpt" in ckpts else {}
    check.trial(last.get("mulosd", {}).get("batches_seen") == BATCHES and len(ckpts) <= 2,
                f"checkpoints {ckpts}, last holds {last.get('mulosd', {}).get('batches_seen')} batches")
    log_dirs = sorted((run_dir / "logs").glob("*/version_*"))
    check.trial(len(log_dirs) == 1 and (log_dirs[0] / "metrics.csv").is_file(),
                f"{len(log_dirs)} log directories: {log_dirs}")
    check.trial((run_dir / "export" / "model.safetensors").is_file(), "no export")
    stray = [p.name for p in run_dir.iterdir() if p.name.startswith(".pl_ddp_hydra")]
    check.figures.update(samples_rank0=len(keys[0]), samples_rank1=len(keys[1]), checkpoints=len(ckpts),
                         log_dirs=len(log_dirs), hydra_subdirs=len(stray))
    return check
