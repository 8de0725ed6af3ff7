"""Pixel-space measures of a reconstruction against its original."""

import torch


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB for images in [-1, 1]."""
    mse = ((a.float().clamp(-1, 1) - b.float().clamp(-1, 1)) / 2).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(1.0 / mse.clamp_min(1e-10))
