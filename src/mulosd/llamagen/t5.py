"""FLAN-T5-XL captions for LlamaGen T2I, as upstream feeds them: the caption cleaned twice (captions.py), 120
tokens, T5 in the run's precision (bf16 by default, as upstream samples), features [B, 120, 2048], left padded
(the valid tokens moved to the end, padding zeroed) with the mask that keeps padding out of attention.
Needs `transformers` (+ sentencepiece) and the weights, local or from the hub; otherwise one error line."""

from __future__ import annotations

import torch

from .captions import preprocess
from .checkpoints import MissingCheckpoints

T5_NAME, T5_SLOTS = "google/flan-t5-xl", 120


def left_pad(feats: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded features [B, L, D] with mask [B, L] -> left-padded features (padding zeroed) and mask:
    row b is rotated by its valid length, as LlamaGen's sample_t2i does."""
    L = feats.shape[1]
    n = valid.sum(1, keepdim=True)
    idx = (torch.arange(L, device=feats.device)[None] + n) % L  # new[j] = old[(j + n) % L]
    out_valid = valid.gather(1, idx)
    out = feats.gather(1, idx[..., None].expand(-1, -1, feats.shape[2])) * out_valid[..., None]
    return out, out_valid


class FlanT5Encoder:
    dim, prefix = 2048, T5_SLOTS

    def __init__(self, name_or_path: str = T5_NAME, device="cpu", dtype=torch.float32):
        try:
            from transformers import AutoTokenizer, T5EncoderModel
        except ImportError:
            raise MissingCheckpoints("the FLAN-T5 caption encoder needs `pip install transformers sentencepiece`"
                                     ) from None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            self.model = T5EncoderModel.from_pretrained(name_or_path, dtype=dtype).to(device).eval()
        except OSError:
            raise MissingCheckpoints(f"missing the FLAN-T5-XL encoder {name_or_path!r}: not in the Hugging Face "
                                     f"cache and the hub is unreachable; give a local copy with llamagen.t5=DIR"
                                     ) from None
        self.device = device

    @torch.no_grad()
    def __call__(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer([preprocess(c) for c in captions], max_length=T5_SLOTS, padding="max_length",
                             truncation=True, return_tensors="pt").to(self.device)
        feats = self.model(input_ids=tok.input_ids, attention_mask=tok.attention_mask).last_hidden_state
        return left_pad(feats.float(), tok.attention_mask.bool())
