"""NaN guards: a non-finite value injected at the generator's loss, the discriminator's loss or the data is
detected at the batch it appears in, that step is skipped, training goes on, and no checkpoint holds a
non-finite value. Non-finite steps that persist stop the run with a message; weights that turn non-finite
some other way are refused at the next checkpoint, which stops the run instead of writing them.

Runs train in this process (train.py's own `fit`) with the injection patched into the loss functions and
the training step, so nothing in the product carries a test hook.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from hydra import compose, initialize_config_dir

from ..config import register_configs
from ..losses import ImageLoss
from .common import ROOT, Check, World, load_checkpoint, nonfinite_tensors, quiet

BATCHES, AT = 5, 3


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def _module_class(target: str):
    from ..lit.sampler import SamplerModule
    from ..lit.tokenizer import TokenizerModule

    return TokenizerModule if target == "tokenizer" else SamplerModule


def _inject(target: str, where: str, at: int, persistent: bool = False) -> ExitStack:
    """Patches that put a NaN at `where` (data | generator | discriminator | weights) on batch `at` (and every
    later one when persistent)."""
    cls = _module_class(target)
    current = [0]
    hit = (lambda: current[0] >= at) if persistent else (lambda: current[0] == at)
    step = cls.training_step

    def training_step(self, batch, batch_idx):
        current[0] = self.batches_seen + 1
        if where == "data" and hit():
            batch["image"][0, 0, 0, 0] = float("nan")
        out = step(self, batch, batch_idx)
        if where == "weights" and hit():
            with torch.no_grad():
                next(self.parameters()).view(-1)[0] = float("nan")
        return out

    def poisoned(fn):
        def wrapper(*args, **kwargs):
            loss, logs = fn(*args, **kwargs)
            return (loss * float("nan"), logs) if hit() else (loss, logs)
        return wrapper

    stack = ExitStack()
    stack.enter_context(mock.patch.object(cls, "training_step", training_step))
    if where == "generator":
        stack.enter_context(mock.patch.object(ImageLoss, "generator_loss", poisoned(ImageLoss.generator_loss)))
    if where == "discriminator":
        stack.enter_context(mock.patch.object(ImageLoss, "discriminator_loss",
                                              poisoned(ImageLoss.discriminator_loss)))
    return stack


def _fit(world: World, target: str, run_dir: Path, batches: int):
    from ..training import fit

    base = world.tokenizer_run if target == "tokenizer" else world.sampler(target)
    # the discriminator trains from batch 2, so it is live when the injection comes
    cfg = _compose([*base, *world.disc_start(target, 1), f"model.train.batches={batches}", "model.train.ckpt_every=1",
                    "model.train.val_every=1000", "data.num_workers=0", "model.optim.decay_batches=0"])
    return fit(cfg, run_dir)


def _checkpoints_finite(run_dir: Path) -> tuple[int, int]:
    paths = list((run_dir / "checkpoints").glob("*.ckpt"))
    return sum(bool(nonfinite_tensors(load_checkpoint(p))) for p in paths), len(paths)


def run(world: World, work: Path, targets=("gan", "tokenizer")) -> Check:
    check = Check("nan_guards")
    for target in targets:
        for where in ("data", "generator", "discriminator"):
            run_dir = work / f"{target}_{where}"
            with quiet(work / "fits.log"), _inject(target, where, AT):
                module = _fit(world, target, run_dir, BATCHES)
            skipped = list(module.guard.skipped)
            what = {"data": "data", "generator": "generator loss", "discriminator": "discriminator loss"}[where]
            bad, n = _checkpoints_finite(run_dir)
            check.trial(skipped == [(AT, what)] and module.batches_seen == BATCHES and bad == 0 and n > 0,
                        f"{target}, NaN in the {where} at batch {AT}: skipped {skipped}, trained "
                        f"{module.batches_seen}/{BATCHES}, {bad}/{n} checkpoints non-finite")
    target = targets[0]
    for where, expect in (("generator", "non-finite steps in a row"), ("weights", "non-finite weights")):
        run_dir = work / f"{target}_{where}_persistent"
        try:
            with quiet(work / "fits.log"), _inject(target, where, 2, persistent=True):
                _fit(world, target, run_dir, 14)
            stopped = "did not stop"
        except FloatingPointError as e:
            stopped = str(e)
        bad, n = _checkpoints_finite(run_dir)
        check.trial(expect in stopped and bad == 0, f"{target}, persistent NaN in the {where}: {stopped!r}, "
                                                    f"{bad}/{n} checkpoints non-finite")
    return check
