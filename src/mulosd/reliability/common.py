"""What every check of the battery shares: its result, the tiny world it trains in, and train.py runs."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..paths import ROOT


@dataclass
class Check:
    """One line of the battery's figures: `passed` out of `total` trials, and what failed."""

    name: str
    passed: int = 0
    total: int = 0
    figures: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def trial(self, ok: bool, what: str) -> bool:
        self.total += 1
        self.passed += bool(ok)
        if not ok:
            self.failures.append(what)
        return ok

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def line(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.figures.items())
        verdict = "ok" if self.ok else "FAILED"
        return f"{self.name}: {self.passed}/{self.total} {verdict}" + (f" ({extra})" if extra else "")


@dataclass
class World:
    """A tiny tokenizer and SynthScenes shards: every training run of the battery uses them."""

    root: Path
    tokenizer: Path
    shards: Path

    @property
    def data(self) -> list[str]:
        return [f"data.synth.dir={self.shards}", "data.synth.train_shards=2", "data.synth.val_shards=1",
                "data.synth.per_shard=8", "data.synth.size=64", "data.image_size=64", "data.batch_size=4",
                "logger=none", "trainer.enable_progress_bar=false"]

    def sampler(self, stage: str) -> list[str]:
        """Overrides for a tiny U_2 (or D_2 with stage=down) of the given loss stage."""
        experiment = {"token_ce": "upsampler_ce", "mse_lpips": "upsampler_mse_lpips", "gan": "upsampler_gan",
                      "down": "downsampler"}[stage]
        return [f"experiment={experiment}", f"model.tokenizer={self.tokenizer}", "model.init_from=null",
                "model.width=16", "model.depth=1", *self.data]

    @property
    def tokenizer_run(self) -> list[str]:
        return ["experiment=zoo_tokenizer", "model.vq.ch=8", "model.vq.ch_mult=[1,1,1,2]", "model.vq.z_channels=16",
                "model.vq.codebook_size=64", "model.loss.disc_ndf=8", "model.train.crop=32", *self.data]

    @staticmethod
    def disc_start(target: str, batches: int) -> list[str]:
        """The override that starts the discriminator after `batches` batches (none for non-GAN stages)."""
        if target == "tokenizer":
            return [f"model.loss.disc_start={batches}"]
        return [f"model.loss.image.disc_start={batches}"] if target == "gan" else []


def make_world(root: Path) -> World:
    from ..data.synthscenes.shards import VAL_FIRST_INDEX, write_split
    from ..tokenizer import VQConfig, VQModel
    from ..zoo import save

    root = Path(root)
    tok = root / "tokenizer"
    if not (tok / "config.json").is_file():
        torch.manual_seed(0)
        m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=64)).eval()
        save(m, "vq_tokenizer", tok, recipe="reliability battery: random weights")
    shards = root / "shards"
    write_split(shards, "train", 2, 8, 64, 0, workers=1, progress=False)
    write_split(shards, "val", 2, 8, 64, 0, first_index=VAL_FIRST_INDEX, workers=1, progress=False)
    return World(root, tok, shards)


def train_command(run_dir: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides]


def child_env(threads: int = 1) -> dict:
    """One thread per child: the battery runs two at a time on two cores, and fp32 results must not depend
    on how busy the machine is."""
    return os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "WANDB_MODE": "disabled",
                         "PYTHONWARNINGS": "ignore"}


def train(run_dir: Path, overrides: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(train_command(run_dir, overrides), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=child_env())


def start_training(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(train_command(run_dir, overrides), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=child_env())


@contextlib.contextmanager
def quiet(log_path: Path):
    """Training in this process prints banners, warnings and per-step reports: into `log_path` with them."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "mulosd")]
    levels = [lg.level for lg in loggers]
    with open(log_path, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, weights_only=True, map_location="cpu")


def nonfinite_tensors(checkpoint: dict) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity, weights and optimiser states alike."""
    bad = [k for k, v in checkpoint.get("state_dict", {}).items()
           if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
    for i, opt in enumerate(checkpoint.get("optimizer_states", [])):
        for pid, st in opt.get("state", {}).items():
            bad += [f"optimizer{i}.{pid}.{n}" for n, t in st.items()
                    if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()]
    return bad
