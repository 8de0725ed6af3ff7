"""LightningModule that trains the VQ tokenizer: L1 + LPIPS + PatchGAN, manual G/D optimisation.

Each batch trains on several views of the same scenes: a random crop of the full-size image and the
whole low-res versions the stream yields (64 and 32 px for 128 px scenes), so one tokenizer encodes every
resolution the drafters and verifiers use. Crops draw from a generator owned by the module, so the global
RNG (touched by Lightning when it builds loaders) cannot change what a resumed run trains on.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning as L
import numpy as np
import torch

from ..config.train import TokenizerModelConfig
from ..data.images import to_image
from ..eval.pixels import psnr
from ..losses import ImageLoss
from ..losses.image_loss import LPIPS_MIN_SIZE
from ..tokenizer import VQModel
from ..viz import captioned_grid
from .adversarial import AdversarialSteps
from .guards import NonFiniteGuard, batch_images
from .resume import assert_finite, rng_state, set_rng_state, set_stable_then_decay_lr


class TokenizerModule(AdversarialSteps, L.LightningModule):
    def __init__(self, cfg: TokenizerModelConfig):
        super().__init__()
        self.save_hyperparameters(asdict(cfg))  # plain containers: checkpoints load with weights_only=True
        self.cfg = cfg
        self.model = VQModel(cfg.vq)
        self.loss = ImageLoss(cfg.loss)
        self.automatic_optimization = False
        self.batches_seen = 0
        self.crop_rng = torch.Generator().manual_seed(cfg.train.seed)
        self.guard = NonFiniteGuard()

    # one optimizer step each for G and D per batch, even before the GAN warm-up, so that Lightning's
    # global_step is always 2 x batches (checkpoint intervals and max_steps stay aligned)
    optimizer_steps_per_batch = 2

    def configure_optimizers(self):
        o = self.cfg.optim
        g = torch.optim.Adam(self.model.parameters(), lr=o.lr, betas=tuple(o.betas))
        d_params = self.loss.discriminator.parameters() if self.loss.uses_gan else [torch.zeros(1, requires_grad=True)]
        d = torch.optim.Adam(d_params, lr=o.d_lr, betas=tuple(o.betas))
        return [g, d]

    def views(self, batch: dict) -> list[torch.Tensor]:
        image = batch["image"]
        crop = self.cfg.train.crop
        size = image.shape[-1]
        if crop < size:
            top, left = (int(v) for v in torch.randint(0, size - crop + 1, (2,), generator=self.crop_rng))
            image = image[..., top:top + crop, left:left + crop]
        return [image] + [batch["low"][r] for r in sorted(batch["low"])]

    def training_step(self, batch, batch_idx):
        factor = set_stable_then_decay_lr(self.optimizers(), self.cfg.optim, self.cfg.train.batches,
                                          self.batches_seen)
        n = self.batches_seen + 1
        reals = self.views(batch)  # before the data check: the crop generator advances on every batch
        if self.guard.nonfinite("data", batch_images(batch), n):
            return self.skip_step()
        outs = [self.model(x) for x in reals]
        fakes = [o[0] for o in outs]
        qloss = sum(o[2] for o in outs) / len(outs)
        g_loss, logs = self.loss.generator_loss(reals, fakes, self.model.last_layer(), self.batches_seen)
        total = g_loss + qloss
        gan = self.loss.gan_active(self.batches_seen)
        d_logs = self.adversarial_step(total, (lambda: self.loss.discriminator_loss(reals, fakes)) if gan else None, n)
        if d_logs is None:
            return None
        logs.update(d_logs)
        logs.update(q_loss=qloss.detach(), total=total.detach(), lr_factor=factor)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, prog_bar=False, on_step=True)
        self.log("train/batches", float(self.batches_seen), prog_bar=True, on_step=True)
        self.log("train/rec", logs.get("l1", logs.get("mse")), prog_bar=True, on_step=True)

    @torch.no_grad()
    def reconstruct(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.decode(self.model.encode(images))

    def validation_step(self, batch, batch_idx):
        views = {batch["image"].shape[-1]: batch["image"]} | {batch["low"][r].shape[-1]: batch["low"][r]
                                                              for r in batch["low"]}
        recs = {}
        for size, x in views.items():
            recs[size] = self.reconstruct(x)
            self.log(f"val/psnr{size}", psnr(recs[size], x).mean(), batch_size=len(x))
            if self.loss.lpips is not None and size >= LPIPS_MIN_SIZE:
                self.log(f"val/lpips{size}", self.loss.lpips(recs[size], x).mean(), batch_size=len(x))
        if batch_idx == 0:
            self._log_grid(views, recs, batch["caption"])

    def _log_grid(self, views: dict, recs: dict, captions: list[str]) -> None:
        """input | reconstruction at each size, for the first few validation scenes."""
        tiles = []
        top = max(views)
        for i in range(min(4, len(captions))):
            row = []
            for size in sorted(views, reverse=True):
                k = top // size
                for img in (views[size][i], recs[size][i]):
                    row.append(np.kron(to_image(img), np.ones((k, k, 1), dtype=np.uint8)))
            tiles.append(np.concatenate(row, axis=1))
        grid = captioned_grid(tiles, captions[:len(tiles)], cols=1, tile=top, lines=1)
        out = Path(self.trainer.default_root_dir) / "samples" / f"batch{self.batches_seen:06d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        grid.save(out)
        logger = self.logger
        if logger is not None and hasattr(logger, "log_image"):
            logger.log_image("val/reconstructions", [np.asarray(grid)], step=self.global_step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        assert_finite(self)
        checkpoint["mulosd"] = {"batches_seen": self.batches_seen, "crop_rng": self.crop_rng.get_state(),
                                "rng": rng_state(), "guard": self.guard.state_dict()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["mulosd"]
        self.batches_seen = int(state["batches_seen"])
        self.crop_rng.set_state(state["crop_rng"])
        set_rng_state(state["rng"])
        self.guard.load_state_dict(state.get("guard", {"in_a_row": 0, "skipped": []}))

    def datamodule(self, shards, cfg):
        """The tokenizer trains on the image stream itself."""
        return shards

    def export(self, out_dir, recipe: str):
        from ..zoo import save

        return save(self.model, "vq_tokenizer", out_dir, recipe,
                    batches=self.batches_seen, loss=asdict(self.cfg.loss))
