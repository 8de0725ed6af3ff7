"""Acceptance tests for drafted tokens, on the verifier's warped distribution p (after CFG / temperature /
top-k / top-p, as it would be sampled).

- `pooled`: MuLo-SD's rule, accept x~ when sum over B_k(x~) of p >= tau, B_k = x~ and its k nearest codes
  (the tokenizer's neighbour table). An optional total-variation cap delta (LANTERN's idea) limits how much
  of the neighbours' mass may count; `relative` measures against the same mass at p's mode instead of 1.
- `sampled_accept`: the pooled test made a draw, as speculative sampling would with a drafter sure of its
  pool: accept with probability min(1, pooled mass / tau), and on rejection draw outside B_k(x~)
  (`outside_pool`). At tau = 1 the pool an accepted-or-redrawn position ends in is distributed as under p,
  so a pool the verifier gives 10% is chosen 10% of the time even when every draft shows another one (the
  threshold test keeps a background draft whose pool holds 90%: an object the drafter omitted stays omitted).
  Given q, the drafter's own probability of the pool, it accepts with min(1, mass / (tau q)) instead
  (MuLo-SD's `acceptance=ratio`): speculative sampling's p / q at pool level.
- `speculative`: standard speculative sampling (lossless): accept with probability min(1, p(x~)/q(x~)),
  on rejection sample from norm(max(0, p - q)). LANTERN's relaxed variant replaces p(x~) by the pooled mass
  under the delta cap.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    broad distribution (the first token's background prior) is not rejected for being broad."""
    mass = pooled_mass(logp, draft, neighbours, k, delta)
    if relative:
        return mass >= tau * pooled_mass(logp, logp.argmax(-1), neighbours, k, delta)
    return mass >= tau


def sampled_accept(logp, draft, neighbours, k: int, tau: float, u: torch.Tensor,
                   delta: float | None = None, q: torch.Tensor | None = None) -> torch.Tensor:
    """[B, n] bool: u <= mass / (tau q) for uniforms u [B, n] in (0, 1); q [B, n] the drafter's probability of
    the draft's pool (None: 1, a drafter sure of it); tau = 0 accepts every draft."""
    scale = tau if q is None else tau * q
    return u * scale <= pooled_mass(logp, draft, neighbours, k, delta)


def outside_pool(logp: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, k: int) -> torch.Tensor:
    """logp [m, V] with B_k(draft [m]) removed (-inf): where a rejected pooled draw is redrawn. A row whose
    whole mass lies in the pool keeps p (a rejection there has probability 0 at tau = 1)."""
    pool = torch.cat([draft[:, None], neighbours.to(draft.device)[draft][:, :k]], dim=1)
    out = logp.scatter(-1, pool, -torch.inf)
    return torch.where(out.isfinite().any(-1, keepdim=True), out, logp)


def accepted_prefix(ratio: torch.Tensor, u: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Speculative sampling's test along the last dim: draft i stands when u_i < min(1, ratio_i) (ratio p / q of
    its token) and every draft before it stands -> the accepted prefix's length [...]. `valid` [..., n]: lanes
    that hold no draft (padding, past a window's end) never stand."""
    ok = u < ratio.clamp(max=1).double()
    if valid is not None:
        ok &= valid
    return ok.long().cumprod(-1).sum(-1)


def residual(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """log of norm(max(0, p - q)): where speculative sampling draws after a rejection. Where p <= q
    everywhere (numerically), falls back to p."""
    diff = (logp.exp() - logq.exp()).clamp_min(0)
    total = diff.sum(-1, keepdim=True)
    return torch.where(total > 0, (diff / total.clamp_min(1e-30)).log(), logp)


@dataclass(frozen=True)
class Pool:
    """B_k(x): a code x and its k nearest codes (rows of the tokenizer's neighbour table [V, >= k])."""

    neighbours: torch.Tensor
    k: int

    def mass(self, logp: torch.Tensor, x: torch.Tensor, delta: float | None = None) -> torch.Tensor:
        return pooled_mass(logp, x, self.neighbours, self.k, delta)
