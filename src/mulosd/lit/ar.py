"""LightningModule that trains an AR transformer on a tokenizer's grids: next-token CE with caption dropout.

The learning rate follows timm's cosine schedule with warm-up, stepped from the batch counter, so a resumed
run is on the same schedule without scheduler state. With `resolutions` (e.g. [64, 128]) one multi-resolution
transformer trains on every grid of the same scenes at once, the loss averaged over the grids (`resolution` is
the one it exports as its default). Two optional levers: `object_weight` multiplies the
loss of the tokens that hold an object (the world knows each object's mask; most tokens are background
texture, which GenEval never checks), and `ema` keeps an exponential moving average of the weights (timm's
ModelEmaV3), which validation, the samples and the export then use. With `compile` the training forward and
backward run through torch.compile (one graph per grid), the tokens and the schedule unchanged. Validation
reports the CE on held-out scenes (all tokens, object tokens, background tokens) and draws a few captions with
plain AR decoding and guidance, decoded by the tokenizer and judged.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch import nn

from ..ar import ARBackbone, Transformer, TransformerConfig, Warpers
from ..config.train import ARModelConfig
from ..data.synthscenes import judge, parse_caption
from ..data.synthscenes.encoder import SceneCaptionEncoder
from ..tokenizer import tokens_to_images
from ..viz import captioned_grid
from .guards import NonFiniteGuard
from .resume import assert_finite, rng_state, set_rng_state


def build_ar(cfg: TransformerConfig) -> tuple[Transformer, SceneCaptionEncoder]:
    return Transformer(cfg), SceneCaptionEncoder(cfg.cond_dim)


def teacher_forced_ce(model: Transformer, tokens: torch.Tensor, cond: torch.Tensor, drop: torch.Tensor | None
             ) -> torch.Tensor:
    """Per-token CE [B, N] of teacher-forced sequences tokens [B, N] under condition features cond."""
    logits = model(tokens, cond, drop)
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(), reduction="none").view_as(tokens)


class ARModule(L.LightningModule):
    optimizer_steps_per_batch = 1

    def __init__(self, cfg: ARModelConfig):
        """cfg.transformer carries the derived vocab_size, grid, prefix and grids (training.build_module)."""
        super().__init__()
        self.save_hyperparameters(asdict(cfg))  # plain containers: checkpoints load with weights_only=True
        self.cfg = cfg
        self.model, self.encoder = build_ar(cfg.transformer)
        if cfg.init_from:
            self._init_from(cfg.init_from)
        # the averaged copy of both (the encoder's embeddings are trained too); never optimised
        self.ema = (ModelEmaV3(nn.ModuleDict({"model": self.model, "encoder": self.encoder}), decay=cfg.ema)
                    if cfg.ema else None)
        if self.ema is not None:
            self.ema.requires_grad_(False)
        self.batches_seen = 0
        self.drop_rng = torch.Generator().manual_seed(cfg.train.seed)
        self.guard = NonFiniteGuard()
        self.sizes = sorted(set(cfg.resolutions) | {cfg.resolution})
        # wall-clock of training, summed over a resumed run's segments (the export records it)
        self.train_seconds, self._segment = 0.0, None
        self.px_per_token = cfg.resolution // self.model.cfg.grid
        self._compiled: dict[int, object] = {}  # grid -> the compiled training CE of the model at that grid

    def _init_from(self, name: str) -> None:
        """Start from an exported AR model: every tensor, so its grids, tokenizer and architecture must be this
        run's, except that this model may be deeper (grown with identity blocks: `Transformer.load_grown`);
        the export holds the EMA weights when it had them, so the new run starts from those."""
        from ..zoo import check_same_tokenizer, load_ar

        other, encoder, meta = load_ar(name)
        check_same_tokenizer(meta, self.cfg.tokenizer, f"model.init_from {name!r}")
        try:
            self.model.load_grown(other)
        except ValueError as e:
            raise ValueError(f"{name} is {e}") from None
        self.encoder.load_state_dict(encoder.state_dict())

    def configure_optimizers(self):
        o = self.cfg.optim
        params = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        decay = [p for n, p in params if p.dim() >= 2 and "null_cond" not in n]
        no_decay = [p for n, p in params if p.dim() < 2 or "null_cond" in n]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o.lr, betas=tuple(o.betas))
        self.schedule = CosineLRScheduler(opt, t_initial=self.cfg.train.batches, lr_min=o.lr * o.min_lr_ratio,
                                          warmup_t=o.warmup_batches, warmup_lr_init=o.lr * 0.01, t_in_epochs=False)
        return opt

    def ce(self, batch: dict, size: int, drop: torch.Tensor | None = None, ema: bool = False) -> torch.Tensor:
        """Per-token CE [B, N] of the teacher-forced sequences at `size` px (with the EMA weights if asked)."""
        nets = self.ema.module if ema else {"model": self.model, "encoder": self.encoder}
        tokens, grid = batch["tokens"][size].flatten(1), size // self.px_per_token
        cond = nets["encoder"](batch["caption"])
        if self.cfg.compile and self.training and not ema:
            return self._compiled_ce(grid)(tokens, cond, drop)
        return teacher_forced_ce(nets["model"].at_grid(grid), tokens, cond, drop)

    def _compiled_ce(self, grid: int):
        # one view per grid, kept: a fresh `at_grid` view on every call would fail dynamo's guards and recompile.
        # Static shapes: every grid traces the same code, so dynamo's default would make the second grid's
        # sequence length symbolic, and inductor's CUDA backward of that graph fails (a bf16 run on an H200)
        if grid not in self._compiled:
            self._compiled[grid] = torch.compile(functools.partial(teacher_forced_ce, self.model.at_grid(grid)),
                                                dynamic=False)
        return self._compiled[grid]

    def loss(self, batch: dict, drop: torch.Tensor | None = None) -> torch.Tensor:
        """The (object-weighted) mean token CE, averaged over the model's grids."""
        w = self.cfg.object_weight
        if w != 1.0 and "objects" not in batch:
            raise ValueError("model.object_weight needs object masks, which only SynthScenes shards carry")
        losses = []
        for size in self.sizes:
            ce = self.ce(batch, size, drop)
            if w == 1.0:
                losses.append(ce.mean())
                continue
            weight = 1.0 + (w - 1.0) * batch["objects"][size].flatten(1).to(ce.dtype)
            losses.append((weight * ce).sum() / weight.sum())  # a weighted mean: the lr means the same at any w
        return torch.stack(losses).mean()

    def on_fit_start(self) -> None:
        dm = self.trainer.datamodule
        if self.cfg.object_weight != 1.0 and not getattr(dm, "has_objects", False):
            from ..config import ConfigError

            raise ConfigError("model.object_weight", "needs object masks, which only SynthScenes shards carry "
                                                     "(set it to 1 for other data)")

    def training_step(self, batch, batch_idx):
        self.schedule.step_update(self.batches_seen)
        drop = torch.rand(len(batch["caption"]), generator=self.drop_rng) < self.cfg.cond_dropout
        loss = self.loss(batch, drop.to(self.device))
        self.batches_seen += 1
        if self.guard.nonfinite("loss", loss, self.batches_seen):
            return None  # Lightning skips the optimizer step
        self.guard.clean()
        self._stepped = True  # a finite loss: this batch updates the weights, and then the EMA
        self.log("train/ce", loss, prog_bar=True, on_step=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True)
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.clip_gradients(optimizer, gradient_clip_val=self.cfg.optim.clip, gradient_clip_algorithm="norm")

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)  # runs training_step through the closure
        # the EMA follows the update inside the optimizer step, not in on_train_batch_end: callbacks' batch-end
        # hooks (ModelCheckpoint's) run before the module's, so a checkpoint would miss this batch's update and
        # a resumed run's EMA would lag the uninterrupted one's
        if getattr(self, "_stepped", False):
            self.update_ema()
        self._stepped = False

    def update_ema(self) -> None:
        if self.ema is not None:
            self.ema.update(nn.ModuleDict({"model": self.model, "encoder": self.encoder}), step=self.batches_seen)

    def validation_step(self, batch, batch_idx):
        n = len(batch["caption"])
        for size in self.sizes:  # val/ce is the default resolution's; other grids carry their size
            tag = "" if size == self.cfg.resolution else f"_{size}px"
            ce = self.ce(batch, size, ema=self.ema is not None)
            self.log(f"val/ce{tag}", ce.mean(), batch_size=n)
            if self.ema is not None:  # the raw weights beside their average: what the EMA buys, measured
                self.log(f"val/ce_raw{tag}", self.ce(batch, size).mean(), batch_size=n)
            if "objects" in batch:
                obj = batch["objects"][size].flatten(1)
                # per-batch means over object / background tokens (batches are large enough to hold both)
                self.log(f"val/ce_objects{tag}", ce[obj].mean(), batch_size=n)
                self.log(f"val/ce_background{tag}", ce[~obj].mean(), batch_size=n)
        if batch_idx == 0:
            self._log_samples(batch["caption"][:8])

    def weights(self) -> tuple[nn.Module, nn.Module]:
        """(transformer, encoder) as decoding should use them: the EMA copy when there is one, unless the run
        asks for its raw weights."""
        if self.uses_ema:
            return self.ema.module["model"], self.ema.module["encoder"]
        return self.model, self.encoder

    @property
    def uses_ema(self) -> bool:
        return self.ema is not None and self.cfg.export_weights == "ema"

    @torch.no_grad()
    def _log_samples(self, captions: list[str]) -> None:
        """Plain AR with guidance on validation captions -> a grid with the judge's verdicts."""
        from ..decoding.ar import decode_ar
        from ..zoo import load_tokenizer

        s = self.cfg.sample
        tokenizer = load_tokenizer(self.cfg.tokenizer, device=self.device)
        backbone = ARBackbone(*self.weights(), cfg_scale=s.cfg_scale, cfg_schedule=s.cfg_schedule)
        tokens, _ = decode_ar(backbone, captions, seed=0, warpers=Warpers(s.temperature, s.top_k, s.top_p))
        images = tokens_to_images(tokenizer, tokens)
        ok = [judge(im, parse_caption(c)).geneval for im, c in zip(images, captions, strict=True)]
        self.log("val/geneval_samples", float(np.mean(ok)), batch_size=len(ok))
        labels = [("OK " if o else "NO ") + c for o, c in zip(ok, captions, strict=True)]
        size = max(128, images[0].shape[0])
        tiles = [np.kron(im, np.ones((size // im.shape[0],) * 2 + (1,), dtype=np.uint8)) for im in images]
        grid = captioned_grid(tiles, labels, cols=4, tile=size, lines=3)
        out = Path(self.trainer.default_root_dir) / "samples" / f"batch{self.batches_seen:06d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        grid.save(out)
        if self.logger and hasattr(self.logger, "log_image"):
            self.logger.log_image("val/samples", [np.asarray(grid)], step=self.global_step)

    def on_train_start(self) -> None:
        self._segment = (time.monotonic(), self.train_seconds)

    def trained_seconds(self) -> float:
        if self._segment is None:
            return self.train_seconds
        start, before = self._segment
        return before + time.monotonic() - start

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        assert_finite(self)
        checkpoint["mulosd"] = {"batches_seen": self.batches_seen, "drop_rng": self.drop_rng.get_state(),
                                "rng": rng_state(), "train_seconds": self.trained_seconds()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["mulosd"]
        self.batches_seen = int(state["batches_seen"])
        self.train_seconds = float(state.get("train_seconds", 0.0))  # checkpoints from before it was kept: 0
        self.drop_rng.set_state(state["drop_rng"])
        set_rng_state(state["rng"])

    def datamodule(self, shards, cfg):
        from .tokens import TokenDataModule

        return TokenDataModule(shards, self.cfg.tokenizer, self.sizes, batch_size=cfg.data.batch_size,
                               seed=self.cfg.train.seed, val_batches=self.cfg.train.val_batches,
                               cache_dir=cfg.data.token_cache)

    def export(self, out_dir, recipe: str):
        from ..zoo import save_ar, tokenizer_digest, tokenizer_identity

        c = self.cfg
        model, encoder = self.weights()
        return save_ar(model, encoder, out_dir, recipe, tokenizer=c.tokenizer,
                       tokenizer_sha256=tokenizer_digest(tokenizer_identity(c.tokenizer)),
                       resolution=c.resolution, batches=self.batches_seen, sample=asdict(c.sample),
                       object_weight=c.object_weight, ema=c.ema, resolutions=self.sizes,
                       weights="ema" if self.uses_ema else "raw",
                       trained_on=_hardware(self.device), train_hours=round(self.trained_seconds() / 3600, 3))


def _hardware(device: torch.device) -> str:
    """Where the run trained, for the export's record."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # the vector unit sets the speed (and whether bf16 autocast pays): train_hours compare only within one
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads"
