"""What exact resume needs beyond Lightning's checkpoint: RNG states, and atomic, NaN-free checkpoint files.

Lightning saves no RNG state, and its atomic save goes through the system temp directory (a copy across
filesystems, not a rename). See ../shared/reference/pitfalls.md §1.3, §1.5, §1.12.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


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
    """Write to a temporary file in the target directory, fsync, rename, fsync the directory: a kill
    leaves either the old checkpoint or the new one, never a torn file. Stale temporaries are removed."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.tmp-*"):
            stale.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
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


def set_stable_then_decay_lr(optimizers, optim: dict, batches: int, batches_seen: int) -> float:
    """Constant lr, then linear decay to 0 over the last `optim['decay_batches']` of `batches`: a pure function
    of the batch counter, so a resumed run needs no scheduler state. Sets G's `lr` and D's `d_lr`."""
    decay = int(optim.get("decay_batches", 0))
    factor = min(1.0, max(0.0, (batches - batches_seen) / decay)) if decay > 0 else 1.0
    for opt, key in zip(optimizers, ("lr", "d_lr"), strict=True):
        for group in opt.param_groups:
            group["lr"] = optim[key] * factor
    return factor
