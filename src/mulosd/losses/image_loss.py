"""Reconstruction loss for anything that decodes to pixels: pixel (L1/MSE) + LPIPS + PatchGAN.

The tokenizer uses it on its reconstructions; the stage-2/3 up-samplers use it on images decoded from
their predicted latents through the frozen VQ decoder. The module holds the discriminator and the frozen
LPIPS network; the LightningModule owns the optimisers and calls `generator_loss` and `discriminator_loss`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .gan import (
    NLayerDiscriminator,
    adaptive_weight,
    hinge_d_loss,
    hinge_g_loss,
    nonsaturating_d_loss,
    nonsaturating_g_loss,
    warmup_factor,
)
from .lpips_offline import build_lpips

LPIPS_MIN_SIZE = 32  # AlexNet's pooling leaves nothing of smaller images; they get the pixel loss only
GAN_LOSSES = {"hinge": (hinge_d_loss, hinge_g_loss), "nonsaturating": (nonsaturating_d_loss, nonsaturating_g_loss)}


@dataclass
class ImageLossConfig:
    pixel: str = "l1"  # l1 | mse
    pixel_weight: float = 1.0
    lpips_net: str = "alex"  # alex | vgg
    lpips_weight: float = 1.0
    gan: str = "hinge"  # hinge | nonsaturating | none
    gan_weight: float = 0.1
    disc_start: int = 0  # batches before the discriminator and the GAN term switch on
    adaptive_weight_max: float = 1e4
    disc_ndf: int = 32
    disc_layers: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


class ImageLoss(nn.Module):
    def __init__(self, config: ImageLossConfig):
        super().__init__()
        if config.pixel not in ("l1", "mse"):
            raise ValueError(f"pixel loss must be l1 or mse, got {config.pixel!r}")
        if config.gan not in (*GAN_LOSSES, "none"):
            raise ValueError(f"gan loss must be one of hinge, nonsaturating, none; got {config.gan!r}")
        self.config = config
        self.lpips = build_lpips(config.lpips_net) if config.lpips_weight > 0 else None
        self.discriminator = (NLayerDiscriminator(3, config.disc_ndf, config.disc_layers)
                              if config.gan != "none" else None)

    @property
    def uses_gan(self) -> bool:
        return self.discriminator is not None

    def gan_active(self, batches_seen: int) -> bool:
        return self.uses_gan and warmup_factor(batches_seen, self.config.disc_start) > 0

    def reconstruction(self, reals: list[torch.Tensor], fakes: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """Mean over the (real, fake) pairs, which may differ in size (e.g. a tokenizer's 128/64/32 px views)."""
        c = self.config
        pixel = (lambda r, f: (f - r).abs().mean()) if c.pixel == "l1" else F.mse_loss
        pix = sum(pixel(r, f) for r, f in zip(reals, fakes, strict=True)) / len(reals)
        loss, logs = c.pixel_weight * pix, {c.pixel: pix.detach()}
        pairs = [(r, f) for r, f in zip(reals, fakes, strict=True) if min(r.shape[-2:]) >= LPIPS_MIN_SIZE]
        if self.lpips is not None and pairs:
            lp = sum(self.lpips(f.float(), r.float()).mean() for r, f in pairs) / len(pairs)
            loss = loss + c.lpips_weight * lp
            logs["lpips"] = lp.detach()
        return loss, logs

    def generator_loss(self, reals: list[torch.Tensor], fakes: list[torch.Tensor], last_layer: torch.Tensor | None,
                       batches_seen: int) -> tuple[torch.Tensor, dict]:
        """Reconstruction terms, plus the adaptively weighted GAN term once the warm-up is over."""
        loss, logs = self.reconstruction(reals, fakes)
        if self.gan_active(batches_seen):
            self.discriminator.requires_grad_(False)  # G's step must leave no gradient in D
            g_fn = GAN_LOSSES[self.config.gan][1]
            g = sum(g_fn(self.discriminator(f)) for f in fakes) / len(fakes)
            self.discriminator.requires_grad_(True)
            if last_layer is not None and torch.is_grad_enabled():
                w = adaptive_weight(loss, g, last_layer, self.config.adaptive_weight_max)
            else:
                w = torch.ones((), device=loss.device)
            loss = loss + self.config.gan_weight * w * g
            logs.update(g_loss=g.detach(), adaptive_weight=w)
        return loss, logs

    def discriminator_loss(self, reals: list[torch.Tensor], fakes: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
        d_fn = GAN_LOSSES[self.config.gan][0]
        total, real_mean, fake_mean = 0.0, 0.0, 0.0
        for r, f in zip(reals, fakes, strict=True):
            lr, lf = self.discriminator(r.detach()), self.discriminator(f.detach())
            total = total + d_fn(lr, lf)
            real_mean, fake_mean = real_mean + lr.mean().detach(), fake_mean + lf.mean().detach()
        n = len(reals)
        return total / n, {"d_loss": total.detach() / n, "logits_real": real_mean / n, "logits_fake": fake_mean / n}
