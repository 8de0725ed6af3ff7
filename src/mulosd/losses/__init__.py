"""The loss stack shared by the tokenizer and the samplers: pixel, LPIPS (offline ImageNet trunks), PatchGAN."""

from .gan import (
                  NLayerDiscriminator,
                  adaptive_weight,
                  hinge_d_loss,
                  hinge_g_loss,
                  nonsaturating_d_loss,
                  nonsaturating_g_loss,
                  warmup_factor,
)
from .image_loss import ImageLoss, ImageLossConfig
from .lpips_offline import build_lpips

__all__ = ["ImageLoss", "ImageLossConfig", "NLayerDiscriminator", "adaptive_weight", "build_lpips", "hinge_d_loss",
           "hinge_g_loss", "nonsaturating_d_loss", "nonsaturating_g_loss", "warmup_factor"]
