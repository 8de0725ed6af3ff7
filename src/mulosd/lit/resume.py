"""What exact resume needs beyond Lightning's checkpoint: RNG states, atomic NaN-free checkpoint files that
load as data only, and a log of the sample keys each batch consumed (to prove nothing replayed or skipped).

Lightning saves no RNG state, and its atomic save goes through the system temp directory (a copy across
filesystems, not a rename).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..atomic import atomic_write


def rng_state() -> dict:
    """Global RNG states as tensors and plain containers, so the checkpoint loads with weights_only=True."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def assert_finite(module: torch.nn.Module) -> None:
    bad = [n for n, p in module.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
    if bad:
        raise FloatingPointError(f"refusing to checkpoint non-finite weights: {', '.join(bad[:5])}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written through `atomic_write` (a kill leaves the old file or the new one, never a torn
    one), and read with weights_only=True whatever the caller asks: a checkpoint is data, never code."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        atomic_write(Path(path), lambda f: torch.save(checkpoint, f))

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        return super().load_checkpoint(path, map_location=map_location or "cpu", weights_only=True)


class ConsumedKeys(Callback):
    """Appends each trained batch's sample keys to RUN/consumed_keys[.rankN].jsonl as {"batch": n, "keys": [...]}
    (n counts from 1). A resumed run appends to the same file, re-logging the batches it trains again; the
    last line of each batch number is what the final weights saw (`consumed_sequence`)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not isinstance(batch, dict) or "key" not in batch:  # token batches of the AR models carry no keys
            return
        rank = trainer.global_rank
        name = "consumed_keys.jsonl" if trainer.world_size == 1 else f"consumed_keys.rank{rank}.jsonl"
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps({"batch": pl_module.batches_seen, "keys": list(batch["key"])}) + "\n")


def consumed_sequence(path: Path) -> list[list[str]]:
    """The keys of batches 1..N as the final weights saw them: the last logged line of each batch number."""
    by_batch = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        by_batch[row["batch"]] = row["keys"]
    return [by_batch[b] for b in sorted(by_batch)]


def set_stable_then_decay_lr(optimizers, optim, batches: int, batches_seen: int) -> float:
    """Constant lr, then linear decay to 0 over the last `optim.decay_batches` of `batches` (optim: the typed
    config.train.OptimConfig): a pure function of the batch counter, so a resumed run needs no scheduler state.
    Sets G's `lr` and D's `d_lr`."""
    decay = optim.decay_batches
    factor = min(1.0, max(0.0, (batches - batches_seen) / decay)) if decay > 0 else 1.0
    for opt, key in zip(optimizers, ("lr", "d_lr"), strict=True):
        for group in opt.param_groups:
            group["lr"] = getattr(optim, key) * factor
    return factor
