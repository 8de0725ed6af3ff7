"""VQ tokenizers behind one interface: encode(images) -> tokens, decode(tokens) -> images, codebook()."""

from .vq import VQConfig, VQModel

__all__ = ["VQConfig", "VQModel"]
