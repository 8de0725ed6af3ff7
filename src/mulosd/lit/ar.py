"""LightningModule that trains an AR transformer on a tokenizer's grids: next-token CE with caption dropout.

The learning rate follows timm's cosine schedule with warm-up, stepped from the batch counter, so a resumed
run is on the same schedule without scheduler state. Validation reports the CE on held-out scenes and
draws a few captions with plain AR decoding and guidance, decoded by the tokenizer and judged.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from timm.scheduler import CosineLRScheduler

from ..ar import ARBackbone, SceneCaptionEncoder, Transformer, TransformerConfig, Warpers
from ..data.stream import to_image
from ..data.synthscenes import judge, parse_caption
from ..viz import captioned_grid
from .guards import NonFiniteGuard
from .resume import assert_finite, rng_state, set_rng_state


def build_ar(transformer: dict) -> tuple[Transformer, SceneCaptionEncoder]:
    cfg = TransformerConfig(**transformer)
    return Transformer(cfg), SceneCaptionEncoder(cfg.cond_dim)


class ARModule(L.LightningModule):
    optimizer_steps_per_batch = 1

    def __init__(self, transformer: dict, tokenizer: str, resolution: int, cond_dropout: float, sample: dict,
                 optim: dict, train: dict):
        super().__init__()
        self.save_hyperparameters()  # plain containers only
        self.model, self.encoder = build_ar(transformer)
        self.optim, self.train_cfg = optim, train
        self.batches_seen = 0
        self.drop_rng = torch.Generator().manual_seed(int(train["seed"]))
        self.guard = NonFiniteGuard()

    def configure_optimizers(self):
        o = self.optim
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and "null_cond" not in n]
        no_decay = [p for n, p in self.named_parameters() if p.dim() < 2 or "null_cond" in n]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=tuple(o["betas"]))
        self.schedule = CosineLRScheduler(opt, t_initial=int(self.train_cfg["batches"]),
                                          lr_min=o["lr"] * o["min_lr_ratio"], warmup_t=o["warmup_batches"],
                                          warmup_lr_init=o["lr"] * 0.01, t_in_epochs=False)
        return opt

    def loss(self, tokens: torch.Tensor, captions: list[str], drop: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.model(tokens.flatten(1), self.encoder(captions), drop)
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())

    def training_step(self, batch, batch_idx):
        self.schedule.step_update(self.batches_seen)
        drop = torch.rand(len(batch["caption"]), generator=self.drop_rng) < self.hparams["cond_dropout"]
        loss = self.loss(batch["tokens"], batch["caption"], drop.to(self.device))
        self.batches_seen += 1
        if self.guard.nonfinite("loss", loss, self.batches_seen):
            return None  # Lightning skips the optimizer step
        self.guard.clean()
        self.log("train/ce", loss, prog_bar=True, on_step=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True)
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.clip_gradients(optimizer, gradient_clip_val=self.optim["clip"], gradient_clip_algorithm="norm")

    def validation_step(self, batch, batch_idx):
        self.log("val/ce", self.loss(batch["tokens"], batch["caption"]), batch_size=len(batch["caption"]))
        if batch_idx == 0:
            self._log_samples(batch["caption"][:8])

    @torch.no_grad()
    def _log_samples(self, captions: list[str]) -> None:
        """Plain AR with guidance on validation captions -> a grid with the judge's verdicts."""
        from ..decoding import decode_ar
        from ..zoo import load_tokenizer

        s = self.hparams["sample"]
        tokenizer = load_tokenizer(self.hparams["tokenizer"], device=self.device)
        backbone = ARBackbone(self.model, self.encoder, cfg_scale=s["cfg_scale"])
        tokens, _ = decode_ar(backbone, captions, seed=0, warpers=Warpers(s["temperature"], s["top_k"], s["top_p"]))
        images = [to_image(x) for x in tokenizer.decode(tokens).clamp(-1, 1)]
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

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        assert_finite(self)
        checkpoint["mulosd"] = {"batches_seen": self.batches_seen, "drop_rng": self.drop_rng.get_state(),
                                "rng": rng_state()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["mulosd"]
        self.batches_seen = int(state["batches_seen"])
        self.drop_rng.set_state(state["drop_rng"])
        set_rng_state(state["rng"])

    def datamodule(self, shards, cfg):
        from ..data.tokens import TokenDataModule

        return TokenDataModule(shards, self.hparams["tokenizer"], self.hparams["resolution"],
                               batch_size=cfg.data.batch_size, seed=int(self.train_cfg["seed"]),
                               val_batches=int(self.train_cfg["val_batches"]), cache_dir=cfg.data.token_cache)

    def export(self, out_dir, recipe: str):
        from ..data.tokens import tokenizer_digest
        from ..zoo import save, tokenizer_identity

        h = self.hparams
        return save(torch.nn.ModuleDict({"model": self.model, "encoder": self.encoder}), "ar",
                    {"transformer": dict(h["transformer"]), "encoder": "synthscenes_slots"}, out_dir, recipe,
                    tokenizer=h["tokenizer"], tokenizer_sha256=tokenizer_digest(tokenizer_identity(h["tokenizer"])),
                    resolution=h["resolution"], batches=self.batches_seen,
                    sample=dict(h["sample"]))
