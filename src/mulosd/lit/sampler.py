"""LightningModule that trains the samplers between a drafter's and a verifier's grids: the latent up-sampler
U_r through the paper's loss stages, the down-sampler D_r, and the pixel path's SR network.

    token_ce   U_r with a logit head: CE against VQ(high-res image) tokens      (stage 1)
    mse_lpips  U_r with a latent head: the quantised latents are decoded by the frozen VQ decoder;
               MSE + LPIPS against the high-res image, plus a commitment term    (stage 2)
               and, with loss.token_ce > 0, stage 1's CE on the latent's cosines with the codes
    gan        stage 2 + PatchGAN (hinge, adaptive weight at the head, warm-up in batches)  (stage 3)
    D_r        always CE against VQ(low-res image) tokens
    sr         the SR network (samplers/sr.py) on the low-res view as the pixel path sees it, decoded from its
               tokens; MSE + LPIPS (+ PatchGAN with loss=gan) against the high-res image

The batch is streamed from the shards (image and its low-res versions); the frozen tokenizer turns the views
into tokens on the fly. Manual optimisation with a generator and a discriminator optimiser that both step
every batch (the discriminator has nothing to do before the GAN stage's warm-up ends), as in the tokenizer
module, so Lightning's global_step is always 2 x batches.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F

from ..config.train import SamplerModelConfig
from ..data.images import to_image
from ..eval.pixels import psnr
from ..losses import ImageLoss
from ..samplers import PixelUpsampler, build_sampler, head_for
from ..samplers.latent import nearest_code
from ..samplers.sr import forward_pm1, last_layer, sr_network
from ..viz import captioned_grid
from .adversarial import AdversarialSteps
from .guards import NonFiniteGuard, batch_images
from .resume import assert_finite, rng_state, set_rng_state, set_stable_then_decay_lr

log = logging.getLogger(__name__)

STAGES = ("token_ce", "mse_lpips", "gan")
CE_SCALE = 10.0  # cosine -> logit for the pixel stages' token CE (the based logits head starts at this temperature)


class SamplerModule(AdversarialSteps, L.LightningModule):
    optimizer_steps_per_batch = 2

    def __init__(self, cfg: SamplerModelConfig):
        super().__init__()
        self.save_hyperparameters(asdict(cfg))  # plain containers: checkpoints load with weights_only=True
        from ..zoo import load_tokenizer

        self.cfg = cfg
        # the frozen tokenizer is not a submodule: it is not trained, not checkpointed, not exported
        object.__setattr__(self, "tokenizer", load_tokenizer(cfg.tokenizer))
        self.kind, self.r, self.stage = cfg.kind, cfg.r, cfg.loss.stage
        if cfg.kind == "sr":
            self.sampler = sr_network(cfg.r, cfg.width, cfg.depth)
        else:
            self.sampler = build_sampler({"kind": cfg.kind, "r": cfg.r, "width": cfg.width, "depth": cfg.depth,
                                          "base": cfg.base, "head": head_for(self.stage)}, self.tokenizer.codebook())
            if cfg.kind == "up":
                self.sampler.use_tokenizer(self.tokenizer)
        image_loss = replace(cfg.loss.image, gan="none") if self.stage != "gan" else cfg.loss.image
        self.image_loss = ImageLoss(image_loss) if self.pixel_stage else None
        self.automatic_optimization = False
        self.batches_seen = 0
        self.guard = NonFiniteGuard()
        if cfg.init_from:
            self._init_from(cfg.init_from)

    @property
    def pixel_stage(self) -> bool:
        return self.kind != "down" and self.stage != "token_ce"

    def _init_from(self, name: str) -> None:
        """Start from an earlier stage's exported sampler (its codebook must be this tokenizer's). Weights whose
        shapes differ (a stage-1 logit head in a stage-2 model) are left at their initialisation."""
        from ..zoo import load_sampler, load_sr

        if self.kind == "sr":
            theirs = load_sr(name, self.r).descriptor.model.state_dict()
        else:
            earlier = load_sampler(name, tokenizer=self.cfg.tokenizer)[0]
            bases = [getattr(m, "base", "none") for m in (earlier, self.sampler)]
            if bases[0] != bases[1]:  # a correction of one base is not a correction of another
                raise ValueError(f"{name} was trained with base={bases[0]}; this run has model.base={bases[1]}")
            theirs = earlier.state_dict()
        own = self.sampler.state_dict()
        taken = {k: v for k, v in theirs.items() if k in own and own[k].shape == v.shape}
        self.sampler.load_state_dict(taken, strict=False)
        log.info("initialised %d/%d tensors from %s", len(taken), len(own), name)

    def on_fit_start(self) -> None:
        self.tokenizer.to(self.device)

    def configure_optimizers(self):
        o = self.cfg.optim
        g = torch.optim.Adam(self.sampler.parameters(), lr=o.lr, betas=tuple(o.betas))
        uses_gan = self.image_loss is not None and self.image_loss.uses_gan
        d_params = self.image_loss.discriminator.parameters() if uses_gan else [torch.zeros(1, requires_grad=True)]
        d = torch.optim.Adam(d_params, lr=o.d_lr, betas=tuple(o.betas))
        return [g, d]

    @torch.no_grad()
    def tokens(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(low-res tokens [B,h,w], high-res tokens [B,rh,rw]) of the batch's views."""
        if self.r not in batch["low"]:
            raise ValueError(f"the stream yields low-res ratios {sorted(batch['low'])}; r={self.r} needs "
                             f"data.ratios to include it")
        return self.tokenizer.encode(batch["low"][self.r]), self.tokenizer.encode(batch["image"])

    def super_resolve(self, images: torch.Tensor, r: int | None = None) -> torch.Tensor:
        """The SR network as the pixel path's SuperResolver ([-1, 1] in and out; differentiable)."""
        return forward_pm1(self.sampler, images).clamp(-1, 1)

    def generator_loss(self, batch: dict, low: torch.Tensor, high: torch.Tensor):
        if self.kind == "sr":
            with torch.no_grad():  # the input the pixel path gives it: the drafter's tokens, decoded
                seen = self.tokenizer.decode(low).clamp(-1, 1)
            fake = forward_pm1(self.sampler, seen)
            loss, logs = self.image_loss.generator_loss([batch["image"]], [fake], last_layer(self.sampler),
                                                        self.batches_seen)
            with torch.no_grad():
                logs["acc"] = (self.tokenizer.encode(fake.clamp(-1, 1)) == high).float().mean()
            return loss, logs, fake
        if self.kind == "down":
            logits = self.sampler(high)
            loss = F.cross_entropy(logits, low)
            return loss, {"ce": loss.detach(), "acc": (logits.argmax(1) == low).float().mean()}, None
        if self.stage == "token_ce":
            logits = self.sampler(low)
            loss = F.cross_entropy(logits, high)
            return loss, {"ce": loss.detach(), "acc": (logits.argmax(1) == high).float().mean()}, None
        z = self.sampler(low)
        zn = F.normalize(z, dim=1)
        q, idx = nearest_code(z, self.sampler.codebook)
        fake = self.tokenizer.decode_latents(q)
        loss, logs = self.image_loss.generator_loss([batch["image"]], [fake], self.sampler.last_layer(),
                                                    self.batches_seen)
        commit = F.mse_loss(zn, q.detach())
        loss = loss + self.cfg.loss.commitment * commit
        logs.update(commit=commit.detach(), acc=(idx == high).float().mean())
        if self.cfg.loss.ce_weight:  # keeps stage 1's token agreement while pixels are optimised
            ce = F.cross_entropy(CE_SCALE * torch.einsum("bdhw,vd->bvhw", zn, self.sampler.codebook), high)
            loss = loss + self.cfg.loss.ce_weight * ce
            logs["ce"] = ce.detach()
        return loss, logs, fake

    def training_step(self, batch, batch_idx):
        set_stable_then_decay_lr(self.optimizers(), self.cfg.optim, self.cfg.train.batches, self.batches_seen)
        n = self.batches_seen + 1
        if self.guard.nonfinite("data", batch_images(batch), n):
            return self.skip_step()
        low, high = self.tokens(batch)
        loss, logs, fake = self.generator_loss(batch, low, high)
        gan = self.image_loss is not None and self.image_loss.gan_active(self.batches_seen)
        disc = (lambda: self.image_loss.discriminator_loss([batch["image"]], [fake.detach()])) if gan else None
        d_logs = self.adversarial_step(loss, disc, n)
        if d_logs is None:
            return None
        logs.update(d_logs)
        self.log("train/acc", logs.pop("acc"), prog_bar=True, on_step=True)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, on_step=True)
        self.log("train/batches", float(self.batches_seen), prog_bar=True, on_step=True)

    @torch.no_grad()
    def predict_tokens(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        if self.kind == "sr":  # through the pixel path itself: decode, super-resolve, re-encode
            return PixelUpsampler(self.tokenizer, self.r, self.super_resolve).up(low)
        return self.sampler.down(high) if self.kind == "down" else self.sampler.up(low)

    def validation_step(self, batch, batch_idx):
        low, high = self.tokens(batch)
        pred = self.predict_tokens(low, high)
        target = low if self.kind == "down" else high
        self.log("val/acc", (pred == target).float().mean(), batch_size=len(pred))
        if self.kind != "down":
            draft = self.tokenizer.decode(pred).clamp(-1, 1)
            self.log("val/psnr", psnr(draft, batch["image"]).mean(), batch_size=len(pred))
            if batch_idx == 0:
                self._log_grid(batch, low, draft)

    @torch.no_grad()
    def _log_grid(self, batch: dict, low: torch.Tensor, draft: torch.Tensor) -> None:
        """low-res (decoded tokens, enlarged) | up-sampled draft | ground truth, for a few scenes."""
        lowimg = self.tokenizer.decode(low).clamp(-1, 1)
        tiles = []
        for i in range(min(4, len(draft))):
            views = [np.kron(to_image(lowimg[i]), np.ones((self.r, self.r, 1), dtype=np.uint8)),
                     to_image(draft[i]), to_image(batch["image"][i])]
            tiles.append(np.concatenate(views, axis=1))
        grid = captioned_grid(tiles, ["low-res | up-sampled draft | ground truth: " + c
                                      for c in batch["caption"][:len(tiles)]], cols=1, tile=draft.shape[-1], lines=2)
        out = Path(self.trainer.default_root_dir) / "samples" / f"batch{self.batches_seen:06d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        grid.save(out)
        if self.logger and hasattr(self.logger, "log_image"):
            self.logger.log_image("val/drafts", [np.asarray(grid)], step=self.global_step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        assert_finite(self)
        checkpoint["mulosd"] = {"batches_seen": self.batches_seen, "rng": rng_state(),
                                "guard": self.guard.state_dict()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["mulosd"]
        self.batches_seen = int(state["batches_seen"])
        set_rng_state(state["rng"])
        self.guard.load_state_dict(state.get("guard", {"in_a_row": 0, "skipped": []}))

    def datamodule(self, shards, cfg):
        return shards

    def export(self, out_dir, recipe: str):
        from ..zoo import save, tokenizer_digest, tokenizer_identity

        c = self.cfg
        loss = asdict(c.loss) | ({} if self.kind == "up" and self.pixel_stage else {"ce_weight": 0.0})  # as trained
        if self.kind == "sr":  # spandrel reads the architecture from the weights; the config says what it is
            return save(self.sampler, "sr", out_dir, recipe, config={"arch": "Compact", "r": self.r,
                        "width": c.width, "depth": c.depth}, stage=self.stage, tokenizer=c.tokenizer,
                        batches=self.batches_seen, loss=loss)
        return save(self.sampler, "sampler", out_dir, recipe, stage=self.stage, tokenizer=c.tokenizer,
                    tokenizer_sha256=tokenizer_digest(tokenizer_identity(c.tokenizer)), batches=self.batches_seen,
                    loss=loss)
