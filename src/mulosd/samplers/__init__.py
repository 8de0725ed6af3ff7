"""Samplers between a drafter's and a verifier's token grids: latent U_r / D_r and the pixel-space path."""

from .latent import LatentDownsampler, LatentUpsampler, RowCausalConv, build_sampler, head_for
from .pixel import SUPER_RESOLVERS, PixelUpsampler

__all__ = ["SUPER_RESOLVERS", "LatentDownsampler", "LatentUpsampler", "PixelUpsampler", "RowCausalConv",
           "build_sampler", "head_for"]
