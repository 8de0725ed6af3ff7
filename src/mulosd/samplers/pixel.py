"""The pixel-space up-sampler (training-free, the paper's v2 default): decode -> super-resolve -> re-encode.

Super-resolution is any callable `(images [B,3,H,W] in [-1,1], r) -> [B,3,rH,rW]`: bicubic and Lanczos are
training-free; a learned SR model (samplers/sr.py: a checkpoint spandrel reads, or the framework's own
`experiment=pixel_sr`) fills the same slot. Row-causality is the caller's
business here: the VQ decoder's receptive field spans several rows, so MuLo-SD decodes the whole low-res
prefix and keeps only the new rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..choices import TRAINING_FREE_SR
from ..data.images import to_image, to_tensor

SuperResolver = Callable[[torch.Tensor, int], torch.Tensor]


def bicubic(images: torch.Tensor, r: int) -> torch.Tensor:
    return F.interpolate(images, scale_factor=r, mode="bicubic", align_corners=False).clamp(-1, 1)


def lanczos(images: torch.Tensor, r: int) -> torch.Tensor:
    out = []
    for x in images:
        im = Image.fromarray(to_image(x))
        out.append(to_tensor(np.asarray(im.resize((im.width * r, im.height * r), Image.LANCZOS))))
    return torch.stack(out).to(images.device)


SUPER_RESOLVERS: dict[str, SuperResolver] = {"bicubic": bicubic, "lanczos": lanczos}
assert tuple(SUPER_RESOLVERS) == TRAINING_FREE_SR


class PixelUpsampler:
    """`sr`: bicubic | lanczos | a SuperResolver (a learned one: zoo.load_sr)."""

    def __init__(self, tokenizer, r: int, sr: str | SuperResolver = "bicubic"):
        if r not in (2, 4):
            raise ValueError(f"r must be 2 or 4, got {r}")
        if isinstance(sr, str):
            if sr not in SUPER_RESOLVERS:
                raise ValueError(f"unknown super-resolver {sr!r}; known: {', '.join(SUPER_RESOLVERS)} "
                                 "(a learned one: zoo.load_sr)")
            sr = SUPER_RESOLVERS[sr]
        self.tokenizer, self.r, self.sr = tokenizer, r, sr

    @torch.no_grad()
    def up(self, tokens_low: torch.Tensor) -> torch.Tensor:
        images = self.tokenizer.decode(tokens_low).clamp(-1, 1)
        return self.tokenizer.encode(self.sr(images, self.r))
