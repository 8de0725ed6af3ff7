"""Tar as a verifier / drafter pair: AR-DTok 512 or 1024 px verifies, AR-DTok 256 px drafts (r = 2 or 4), both
conditioned on the same TA-Tok features, both decoding LlamaGen VQ-16 tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ar import Transformer
from ..llamagen.checkpoints import VQ_FILE
from ..llamagen.models import load_vq
from ..llamagen.vq16 import LlamaGenVQ, VQ16Config
from .ar_dtok import FILES, PREFIXES, load_ardtok
from .checkpoints import files, locate_tar
from .llm import TarLLM
from .ta_tok import FILE as TA_TOK_FILE
from .ta_tok import TATokDecoder, load_ta_tok

# upstream's AR-DTok sampling defaults (tok/mm_autoencoder.py, t2i_inference.py)
SAMPLE = {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


class TarConditioner:
    """The caption encoder the decoders see: `prepare(captions, ...)` turns a batch of prompts into TA-Tok
    features once (the LLM's ids, or `saved` ids: [n] for every prompt or [prompts, n] by image id, through
    TA-Tok); the drafter and the verifier then both read those features when they start. `seconds` holds the
    last batch's LLM and TA-Tok times."""

    def __init__(self, ta_tok: TATokDecoder, llm: TarLLM | None, scale: int, dtype=torch.float32):
        self.ta_tok, self.llm, self.scale, self.dtype = ta_tok, llm, scale, dtype
        self.prefix = PREFIXES[scale]
        self.captions: list[str] | None = None
        self.features: torch.Tensor | None = None
        self.saved: torch.Tensor | None = None
        self.seconds: dict[str, float] = {}

    def prepare(self, captions: list[str], seed: int, image_ids: torch.Tensor, ids: torch.Tensor | None = None):
        if ids is None and self.saved is not None:
            if self.saved.dim() == 2 and int(image_ids.max()) >= len(self.saved):
                raise ValueError(f"the saved TA-Tok ids have {len(self.saved)} rows; prompt {int(image_ids.max())} "
                                 "has none (give one row per prompt, or one row for all)")
            ids = self.saved.expand(len(captions), -1) if self.saved.dim() == 1 else self.saved[image_ids]
        t, given = time.perf_counter(), ids is not None
        if ids is None:
            if self.llm is None:
                raise ValueError("no LLM loaded: give the TA-Tok ids (tar.features=FILE)")
            ids = self.llm.ids(captions, self.scale, seed, image_ids)
        elif ids.shape != (len(captions), self.prefix):
            raise ValueError(f"TA-Tok ids {tuple(ids.shape)} do not fit {len(captions)} prompts at scale "
                             f"{self.scale} ({self.prefix} ids each)")
        llm = time.perf_counter() - t
        self.features = self.ta_tok(ids).to(self.dtype)
        self.captions = list(captions)
        self.seconds = {"llm": 0.0 if given else llm, "ta_tok": time.perf_counter() - t - llm}

    def __call__(self, captions: list[str]) -> torch.Tensor:
        if self.captions != list(captions):
            raise RuntimeError("TarConditioner.prepare(captions) must run for this batch first")
        return self.features


@dataclass
class TarT2I:
    tokenizer: LlamaGenVQ
    verifier: Transformer
    drafter: Transformer | None
    encoder: TarConditioner
    sample: dict


def load_tar(ckpt_dir: str | Path | None = None, resolution: int = 512, drafter: bool = True, scale: int = 0,
             llm: str | None = "csuhan/Tar-1.5B", download: bool = True, device="cpu", dtype=torch.float32,
             sizes: dict | None = None, vq: VQ16Config | None = None, ta_tok: dict | None = None) -> TarT2I:
    """Everything a Tar decode needs; every missing file (and the LLM, unless `llm` is None: ids given by the
    user) is named in one error before anything loads. `sizes` (AR-DTok size names), `vq` and `ta_tok`
    (SigLIP2 decoder overrides) describe other sizes than the release's: the tests' tiny ones."""
    found = locate_tar(files(resolution, drafter), ckpt_dir, download, llm)
    prefix = PREFIXES[scale]
    move = lambda m: m.to(device=device, dtype=dtype)  # noqa: E731
    conditioner = TarConditioner(load_ta_tok(found[TA_TOK_FILE], device, **(ta_tok or {})),
                                 None if llm is None else TarLLM(llm, device, dtype), scale, dtype)
    t2i = TarT2I(tokenizer=load_vq(found[VQ_FILE], vq).to(device),
                 verifier=move(load_ardtok(found[FILES[resolution]], prefix, sizes)),
                 drafter=move(load_ardtok(found[FILES[256]], prefix, sizes)) if drafter else None,
                 encoder=conditioner, sample=dict(SAMPLE))
    for name, model in (("verifier", t2i.verifier), ("drafter", t2i.drafter)):
        if model is not None and model.cfg.vocab_size != t2i.tokenizer.codebook_size:
            raise ValueError(f"the AR-DTok {name} predicts {model.cfg.vocab_size} codes but {VQ_FILE} has "
                             f"{t2i.tokenizer.codebook_size}")
        if model is not None and model.cfg.cond_dim != conditioner.ta_tok.hidden:
            raise ValueError(f"the AR-DTok {name} takes {model.cfg.cond_dim}-wide features; TA-Tok makes "
                             f"{conditioner.ta_tok.hidden}")
    return t2i
