"""LlamaGen-XL T2I as a verifier (stage 2, 512 px, 32x32 tokens) and drafter (stage 1, 256 px, 16x16), r = 2,
sharing the VQ-16 tokenizer and the FLAN-T5-XL caption encoder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..ar import Transformer
from .checkpoints import STAGE1_FILE, STAGE2_FILE, VQ_FILE, cached_state, locate
from .gpt import from_upstream, gpt_config
from .vq16 import LlamaGenVQ, VQ16Config, config_from_state, load_vq_state

# upstream's T2I sampling defaults (autoregressive/sample/sample_t2i.py)
SAMPLE = {"cfg_scale": 7.5, "temperature": 1.0, "top_k": 1000, "top_p": 1.0}
DOWNSAMPLE = 16


@dataclass
class LlamaGenT2I:
    tokenizer: LlamaGenVQ
    verifier: Transformer
    drafter: Transformer | None
    encoder: object  # captions -> (features [B, 120, 2048], visible [B, 120])
    sample: dict


def load_vq(path: Path, config: VQ16Config | None = None) -> LlamaGenVQ:
    """The VQ in `path`; with a config, one that disagrees with it is refused (default: read off the file)."""
    state = cached_state(path)
    model = LlamaGenVQ(config or config_from_state(state))
    load_vq_state(model, state)
    return model.eval()


def load_gpt(path: Path, image_size: int, size: str | tuple = "GPT-XL", **config) -> Transformer:
    cfg = gpt_config(size, image_size // DOWNSAMPLE, **config)
    model = Transformer(cfg)
    model.load_state_dict(cached_state(path, lambda state: from_upstream(state, cfg)))
    return model.eval()


def load_llamagen(ckpt_dir: str | Path | None = None, drafter: bool = True, t5: str | None = None,
                  download: bool = True, device="cpu", dtype=torch.float32, encoder=None,
                  gpt: str | tuple = "GPT-XL", gpt_config: dict | None = None,
                  vq: VQ16Config | None = None) -> LlamaGenT2I:
    """Everything a decode needs; every missing file is named in one error before anything is loaded.
    `gpt`, `gpt_config` (vocab_size, prefix, caption_dim) and `vq` describe other sizes than the release's
    (the tests use tiny ones); `encoder` replaces FLAN-T5 (captions -> features, visible mask)."""
    files = locate([VQ_FILE, STAGE2_FILE] + ([STAGE1_FILE] if drafter else []), ckpt_dir, download)
    if encoder is None:
        from .t5 import T5_NAME, FlanT5Encoder

        encoder = FlanT5Encoder(t5 or T5_NAME, device=device, dtype=dtype)
    move = lambda m: m.to(device=device, dtype=dtype)  # noqa: E731
    gpt_config = gpt_config or {}
    t2i = LlamaGenT2I(tokenizer=load_vq(files[VQ_FILE], vq).to(device),
                      verifier=move(load_gpt(files[STAGE2_FILE], 512, gpt, **gpt_config)),
                      drafter=move(load_gpt(files[STAGE1_FILE], 256, gpt, **gpt_config)) if drafter else None,
                      encoder=encoder, sample=dict(SAMPLE))
    if t2i.tokenizer.codebook_size != t2i.verifier.cfg.vocab_size:
        raise ValueError(f"{VQ_FILE} has {t2i.tokenizer.codebook_size} codes but the GPT predicts "
                         f"{t2i.verifier.cfg.vocab_size}: not the tokenizer it was trained on")
    return t2i
