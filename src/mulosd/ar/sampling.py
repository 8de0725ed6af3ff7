"""Sampling warpers (temperature, top-k, top-p) and order-independent sampling by Gumbel-max.

`warp` turns logits into the distribution a decoder actually samples from; speculative acceptance tests
compare these warped distributions, so drafter and verifier must be warped the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .noise import GUMBEL, gumbel


@dataclass(frozen=True)
class Warpers:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def warp(logits: torch.Tensor, w: Warpers) -> torch.Tensor:
    """Warped log-probabilities (-inf where a warper removed a token). Greedy gives a one-hot."""
    logits = logits.float()
    if w.temperature == 0:
        return torch.where(logits == logits.amax(-1, keepdim=True), 0.0, -torch.inf).log_softmax(-1)
    logits = logits / w.temperature
    if 0 < w.top_k < logits.shape[-1]:
        kth = logits.topk(w.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if w.top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already exceeds top_p, as LlamaGen's and Tar's samplers cut (the
        # top token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) > w.top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -torch.inf)
    return logits.log_softmax(-1)


def sample(logp: torch.Tensor, seed: int, images: torch.Tensor, positions: torch.Tensor,
           stream: int = GUMBEL) -> torch.Tensor:
    """Gumbel-max over warped log-probabilities [B, n, V] with noise keyed by (seed, image, position, stream):
    an exact sample of softmax(logp), identical whenever the same distribution is queried at the same key."""
    return (logp + gumbel(seed, images, positions, logp.shape[-1], stream)).argmax(-1)


def draw(logits: torch.Tensor, warpers: Warpers, seed: int, images: torch.Tensor, positions: torch.Tensor
         ) -> torch.Tensor:
    """Tokens [B, n] sampled from logits [B, n, V] under the warpers: `sample(warp(...))` as one function, which
    a compiled backbone compiles into one kernel (`ARBackbone.draw`)."""
    return sample(warp(logits, warpers), seed, images, positions)
