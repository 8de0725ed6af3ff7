"""LlamaGen text-to-image (VQ-16 tokenizer, GPT stage-1 256 px / stage-2 512 px, FLAN-T5-XL captions) behind
this project's VQTokenizer / ARBackbone interfaces, loading upstream's released checkpoints."""

from .models import load_llamagen

__all__ = ["load_llamagen"]
