"""VQ tokenizers behind one interface: encode(images) -> tokens, decode(tokens) -> images, codebook()."""

import numpy as np
import torch

from ..data.images import to_image
from .vq import VQConfig, VQModel

__all__ = ["VQConfig", "VQModel", "tokens_to_images"]


@torch.no_grad()
def tokens_to_images(tokenizer, tokens: torch.Tensor) -> list[np.ndarray]:
    """Token grids [B, h, w] -> uint8 RGB images [H, W, 3]: how every caller turns tokens into pixels."""
    return [to_image(x) for x in tokenizer.decode(tokens).clamp(-1, 1)]
