"""Acceptance tests for drafted tokens, on the verifier's warped distribution p (after CFG / temperature /
top-k / top-p, as it would be sampled).

- `pooled`: MuLo-SD's rule, accept x~ when sum over B_k(x~) of p >= tau, B_k = x~ and its k nearest codes
  (the tokenizer's neighbour table). An optional total-variation cap delta (LANTERN's idea) limits how much
  of the neighbours' mass may count; `relative` measures against the same mass at p's mode instead of 1.
- `speculative`: standard speculative sampling (lossless): accept with probability min(1, p(x~)/q(x~)),
  on rejection sample from norm(max(0, p - q)). LANTERN's relaxed variant replaces p(x~) by the pooled mass
  under the delta cap.
"""

from __future__ import annotations

import torch


def pooled_mass(logp: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, k: int,
                delta: float | None = None) -> torch.Tensor:
    """p(x~) plus the mass of x~'s k nearest codes (capped at delta) -> [B, n]. logp [B, n, V], draft [B, n]."""
    p = logp.exp()
    own = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    if k == 0:
        return own
    if k > neighbours.shape[1]:
        raise ValueError(f"pool_k={k} exceeds the neighbour table's {neighbours.shape[1]} neighbours")
    extra = p.gather(-1, neighbours.to(draft.device)[draft][..., :k]).sum(-1)
    if delta is not None:
        extra = extra.clamp(max=delta)
    return own + extra


def pooled_accept(logp, draft, neighbours, k: int, tau: float, delta: float | None = None,
                  relative: bool = False) -> torch.Tensor:
    """[B, n] bool. tau = 0 accepts every draft; tau > 1 rejects every draft (an ablation and test knob).
    `relative`: compare with the pooled mass of the verifier's own most likely token instead of with 1, so a
    broad distribution (the first token's background prior, DESIGN §11) is not rejected for being broad."""
    mass = pooled_mass(logp, draft, neighbours, k, delta)
    if relative:
        return mass >= tau * pooled_mass(logp, logp.argmax(-1), neighbours, k, delta)
    return mass >= tau


def residual(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """log of norm(max(0, p - q)): where speculative sampling draws after a rejection. Where p <= q
    everywhere (numerically), falls back to p."""
    diff = (logp.exp() - logq.exp()).clamp_min(0)
    total = diff.sum(-1, keepdim=True)
    return torch.where(total > 0, (diff / total.clamp_min(1e-30)).log(), logp)
