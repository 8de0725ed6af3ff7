"""Kill -9 and resume: a run killed at random batches and resumed ends bitwise where an uninterrupted run
ends (weights, optimiser states, batch counter), having consumed the same samples in the same order.

Each target (a sampler loss stage, or the tokenizer) trains once without interruption, then again with
SIGKILLs at random batches, each followed by a restart from last.ckpt. Kills land anywhere: during a
step, a checkpoint write or the data loader's start. The consumed-keys log (one line per trained batch,
appended by every process) gives the sequence the final weights saw: the last line of each batch number.
A SIGTERM must save and exit non-zero.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..lit.resume import consumed_sequence
from .common import Check, World, load_checkpoint, start_training, train

BATCHES = 10
TARGETS = ("token_ce", "mse_lpips", "gan", "tokenizer")


def _overrides(world: World, target: str, batches: int) -> list[str]:
    base = world.tokenizer_run if target == "tokenizer" else world.sampler(target)
    # two loader workers: resuming must restart the round-robin over workers at the right one; the
    # discriminator starts and the learning rate decays mid-run, so kills land on both sides of each
    return [*base, *world.disc_start(target, 3), f"model.train.batches={batches}", "model.train.ckpt_every=1",
            "model.train.val_every=1000", "model.optim.decay_batches=4", "data.num_workers=2"]


def _batches_in(path: Path) -> int:
    try:
        return int(load_checkpoint(path)["mulosd"]["batches_seen"])
    except (FileNotFoundError, RuntimeError, EOFError, KeyError):
        return -1


def _kill_at(run_dir: Path, overrides: list[str], batch: int, rng: random.Random, resume: bool) -> int:
    """Start (or resume) the run, SIGKILL it once its last.ckpt holds `batch` batches (plus a random delay,
    so the kill lands mid-step or mid-write), and return what last.ckpt holds after the kill."""
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start_training(run_dir, overrides + ([f"ckpt_path={last}"] if resume else []))
    deadline, seen, held = time.time() + 300, None, -1
    while time.time() < deadline and proc.poll() is None and held < batch:
        time.sleep(0.02)
        stamp = last.stat().st_mtime_ns if last.exists() else None
        if stamp != seen:  # read the checkpoint only when a new one has been renamed into place
            seen, held = stamp, _batches_in(last)
    time.sleep(rng.uniform(0, 0.4))
    if proc.poll() is not None:
        raise RuntimeError(f"the run ended before its kill at batch {batch}: {proc.stderr.read()[-2000:]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return _batches_in(last)


def _equal_states(want: dict, got: dict) -> list[str]:
    diffs = [k for k, v in want["state_dict"].items() if not torch.equal(v, got["state_dict"][k])]
    for i, (a, b) in enumerate(zip(want["optimizer_states"], got["optimizer_states"], strict=True)):
        for pid, st in a["state"].items():
            diffs += [f"optimizer{i}.{pid}.{n}" for n, t in st.items()
                      if not (torch.equal(t, b["state"][pid][n]) if torch.is_tensor(t) else t == b["state"][pid][n])]
    for key in ("global_step",):
        if want[key] != got[key]:
            diffs.append(key)
    if want["mulosd"]["batches_seen"] != got["mulosd"]["batches_seen"]:
        diffs.append("batches_seen")
    if want.get("ShardDataModule") != got.get("ShardDataModule"):  # the stream position
        diffs.append("ShardDataModule")
    return diffs


def chain(world: World, target: str, kills: int, work: Path, seed: int) -> dict:
    """One target: the uninterrupted run and the killed one; returns what was compared."""
    rng = random.Random(seed)
    batches = max(BATCHES, kills + 2)  # distinct kill points inside the run
    overrides = _overrides(world, target, batches)
    ref, run = work / f"{target}_reference", work / f"{target}_killed"
    r = train(ref, overrides)
    if r.returncode != 0:
        raise RuntimeError(f"{target}: the uninterrupted run failed: {r.stderr[-2000:]}")
    at = sorted(rng.sample(range(1, batches - 1), kills))
    held = []
    for i, batch in enumerate(at):
        held.append(_kill_at(run, overrides, batch, rng, resume=i > 0))
    r = train(run, overrides + [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    if r.returncode != 0:
        raise RuntimeError(f"{target}: the resumed run failed: {r.stderr[-2000:]}")
    want, got = load_checkpoint(ref / "checkpoints" / "last.ckpt"), load_checkpoint(run / "checkpoints" / "last.ckpt")
    seq_want = consumed_sequence(ref / "consumed_keys.jsonl")
    seq_got = consumed_sequence(run / "consumed_keys.jsonl")
    want_keys = Counter(k for b in seq_want for k in b)
    got_keys = Counter(k for b in seq_got for k in b)
    return {"target": target, "kills_at": at, "held_after_kill": held, "diffs": _equal_states(want, got),
            "same_keys": seq_want == seq_got,
            "replayed": sum((got_keys - want_keys).values()), "skipped": sum((want_keys - got_keys).values())}


def plan(total_kills: int) -> list[tuple[str, int]]:
    """Kills spread round-robin over the targets, in an order that gives a short battery the three code
    paths that differ most (token CE, a GAN with its discriminator, the tokenizer): 3 -> one each, 20 -> 5 each."""
    order = ("token_ce", "gan", "tokenizer", "mse_lpips")
    counts = {t: 0 for t in order}
    for i in range(total_kills):
        counts[order[i % len(order)]] += 1
    return [(t, n) for t, n in counts.items() if n]


def run(world: World, work: Path, kills: int = 3, seed: int = 0, workers: int = 2) -> Check:
    check = Check("resume")
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(chain, world, t, n, work, seed + i) for i, (t, n) in enumerate(plan(kills))]
        results = [f.result() for f in futures]
    for res in results:
        for batch, held in zip(res["kills_at"], res["held_after_kill"], strict=True):
            ok = not res["diffs"] and res["same_keys"] and res["replayed"] == 0 and res["skipped"] == 0
            check.trial(ok, f"{res['target']} killed after batch {batch} (last.ckpt held {held}): "
                            f"differs in {res['diffs'][:5]}, same keys {res['same_keys']}, "
                            f"replayed {res['replayed']}, skipped {res['skipped']}")
    check.figures["replayed"] = sum(r["replayed"] for r in results)
    check.figures["skipped"] = sum(r["skipped"] for r in results)
    check.figures["targets"] = ",".join(r["target"] for r in results)
    return check


def sigterm(world: World, work: Path) -> Check:
    """SIGTERM mid-run: a checkpoint is saved and the exit status is non-zero (143)."""
    check = Check("sigterm")
    run_dir = work / "sigterm"
    proc = start_training(run_dir, [*world.sampler("token_ce"), "model.train.batches=1000", "model.train.ckpt_every=1",
                                    "model.train.val_every=1000", "data.num_workers=1"])
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and _batches_in(last) < 1:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    saved = _batches_in(run_dir / "checkpoints" / "on_exception.ckpt")
    check.trial(code != 0 and saved >= 1, f"exit status {code}, on_exception.ckpt holds {saved} batches")
    check.figures["exit"] = code
    return check
