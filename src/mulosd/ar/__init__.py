"""AR image-token backbones: the transformer, its KV cache, the caption-encoder interface and order-free sampling."""

from .backbone import ARBackbone
from .conditioning import CaptionEncoder
from .sampling import Warpers, draw, sample, warp
from .transformer import KVCache, Transformer, TransformerConfig

__all__ = ["ARBackbone", "CaptionEncoder", "KVCache", "Transformer", "TransformerConfig", "Warpers", "draw", "sample",
           "warp"]
