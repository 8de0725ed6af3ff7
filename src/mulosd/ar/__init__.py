"""AR image-token backbones: the transformer, its KV cache, caption conditioning and order-free sampling."""

from .backbone import ARBackbone
from .conditioning import CaptionEncoder, SceneCaptionEncoder
from .sampling import Warpers, sample, warp
from .transformer import KVCache, Transformer, TransformerConfig

__all__ = ["ARBackbone", "CaptionEncoder", "KVCache", "SceneCaptionEncoder", "Transformer", "TransformerConfig",
           "Warpers", "sample", "warp"]
