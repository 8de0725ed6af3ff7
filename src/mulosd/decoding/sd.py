"""Speculative decoding at one resolution: a small drafter proposes `gamma` tokens in raster order, the
verifier checks them in one forward. Everything after the first rejection is discarded (raster-scan).

- `acceptance="exact"`: standard speculative sampling, lossless: accept x~ with probability min(1, p/q); at
  the first rejection draw from norm(max(0, p - q)); when all are accepted draw a bonus token from p.
- `acceptance="lantern"`: LANTERN's relaxation: p(x~) is replaced by the mass of x~ and its k nearest codes,
  of which at most delta may come from the neighbours.

Each image advances by its own accepted length (batch > 1 in lockstep: images that are done, or whose window
runs past the grid, rewrite a final position, a no-op). The uniforms of the acceptance test, the drafter's
draws and the verifier's draws use separate noise streams keyed by (seed, image, position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import pooled_mass, residual
from .knobs import check, one_of
from .trace import Trace


@dataclass(frozen=True)
class SDConfig:
    gamma: int = 4
    # exact | lantern: chosen by the strategy (decoding=sd or lantern), never read from a config
    acceptance: str = field(default="exact", metadata={"key": None})
    pool_k: int = field(default=8, metadata={"key": "lantern_k"})  # lantern
    delta: float = field(default=0.2, metadata={"key": "lantern_delta"})  # lantern

    ACCEPTANCES: ClassVar = ("exact", "lantern")

    def __post_init__(self):
        check(self.gamma >= 1, "gamma", f"must be >= 1, got {self.gamma}")
        one_of(self.acceptance, self.ACCEPTANCES, "acceptance")
        check(0 <= self.delta <= 1, "delta", f"must be in [0, 1], got {self.delta}")
        check(self.pool_k >= 0, "pool_k", f"must be >= 0, got {self.pool_k}")


def _padded(rows: list[list[tuple[int, int]]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image (position, token) writes -> [B, n] tensors, shorter rows repeating their last write."""
    width = max(len(r) for r in rows)
    pos = torch.tensor([[p for p, _ in r + [r[-1]] * (width - len(r))] for r in rows], device=device)
    tok = torch.tensor([[t for _, t in r + [r[-1]] * (width - len(r))] for r in rows], device=device)
    return pos, tok


@torch.no_grad()
def decode_sd(verifier: ARBackbone, drafter: ARBackbone, captions: list[str], cfg: SDConfig = SDConfig(),
              seed: int = 0, warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
              neighbours: torch.Tensor | None = None, progress=None) -> tuple[torch.Tensor, Trace]:
    if drafter.grid != verifier.grid:
        raise ValueError(f"sd needs a same-resolution drafter: grids {drafter.grid} and {verifier.grid}")
    if cfg.acceptance == "lantern" and neighbours is None:
        raise ValueError("lantern acceptance needs the codebook neighbour table")
    warpers = warpers or Warpers()
    B, N = len(captions), verifier.grid ** 2
    device = verifier.device
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    for bb in (verifier, drafter):
        bb.calls = bb.tokens_in = 0
    trace = Trace(f"sd_{cfg.acceptance}").start()
    trace.counts = {"drafted": 0, "accepted": 0}
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)
    n = [0] * B  # committed tokens per image
    d_written = [0] * B  # the drafter's cache holds committed tokens [0, d_written)
    v_written = [0] * B  # likewise for the verifier
    q0, p0 = drafter.start(captions), warp(verifier.start(captions), warpers)
    steps = 1
    while min(n) < N:
        g = [min(cfg.gamma, N - n_b) for n_b in n]
        G = max(g)
        drafts = torch.zeros(B, G, dtype=torch.long, device=device)
        q = torch.zeros(B, G, q0.shape[-1], device=device)
        # draft: the first step writes the committed tokens the drafter has not seen, then one draft a step
        for i in range(G):
            rows = []
            for b in range(B):
                if i == 0:
                    rows.append([(p, int(tokens[b, p])) for p in range(d_written[b], n[b])])
                elif i < g[b]:
                    rows.append([(n[b] + i - 1, int(drafts[b, i - 1]))])
                else:
                    rows.append([])
            if any(rows):
                pos, tok = _padded([r or [(max(n[b] - 1, 0), int(tokens[b, max(n[b] - 1, 0)]))]
                                    for b, r in enumerate(rows)], device)
                logits = drafter(pos, tok)
                last = torch.tensor([max(len(r) - 1, 0) for r in rows], device=device)
                step_logits = logits[torch.arange(B), last][:, None]
                steps += 1
            else:  # i == 0 at the very start: the prefix's logits
                step_logits = q0
            if i == 0:
                step_logits = torch.where(torch.tensor([n[b] == 0 for b in range(B)], device=device)[:, None, None],
                                          q0, step_logits)
            q[:, i] = warp(step_logits, warpers)[:, 0]
            pos_i = torch.tensor([[min(n[b] + i, N - 1)] for b in range(B)], device=device)
            drafts[:, i] = sample(q[:, i:i + 1], seed, ids, pos_i, stream=DRAFT)[:, 0]
        for b in range(B):
            d_written[b] = n[b] + g[b] - 1
        # verify: write the unseen committed tokens and every draft; outputs give p at each draft + a bonus
        rows = [[(p, int(tokens[b, p])) for p in range(v_written[b], n[b])] +
                [(n[b] + i, int(drafts[b, i])) for i in range(g[b])] for b in range(B)]
        rows = [r or [(N - 1, int(tokens[b, N - 1]))] for b, r in enumerate(rows)]
        pos, tok = _padded(rows, device)
        out = warp(verifier(pos, tok), warpers)
        steps += 1
        for b in range(B):
            if n[b] >= N:
                continue
            base = n[b] - v_written[b]  # index of the first draft in this image's writes
            # p for draft i is the output of the slot before it; for draft 0 at position 0, the prefix's
            p_prev = p0[b, 0] if n[b] == 0 else out[b, base - 1]
            p = torch.stack([p_prev] + [out[b, base + i] for i in range(g[b] - 1)])  # [g, V]
            bonus = out[b, base + g[b] - 1]
            positions = torch.arange(n[b], n[b] + g[b], device=device)
            d = drafts[b, :g[b]]
            p_d = p.gather(-1, d[:, None])[:, 0].exp()
            if cfg.acceptance == "lantern":
                p_d = pooled_mass(p[None], d[None], neighbours, cfg.pool_k, cfg.delta)[0]
            q_d = q[b, :g[b]].gather(-1, d[:, None])[:, 0].exp()
            u = uniform(seed, ids[b:b + 1], positions[None], ACCEPT)[0]
            ok = u < (p_d / q_d.clamp_min(1e-30)).clamp(max=1).double()
            j = int(ok.long().cumprod(0).sum())  # accepted prefix length
            tokens[b, n[b]:n[b] + j] = d[:j]
            trace.counts["drafted"] += g[b]
            trace.counts["accepted"] += j
            if j < g[b]:
                dist = residual(p[j:j + 1], q[b, j:j + 1])[None]
                tokens[b, n[b] + j] = sample(dist, seed, ids[b:b + 1], positions[None, j:j + 1])[0, 0]
                verifier.forget(positions[None, j:], rows=torch.tensor([b]))
                drafter.forget(positions[None, j:], rows=torch.tensor([b]))
                v_written[b] = n[b] + j
                d_written[b] = min(d_written[b], n[b] + j)
            else:
                v_written[b] = n[b] + g[b]
                if n[b] + g[b] < N:
                    tokens[b, n[b] + g[b]] = sample(bonus[None, None], seed, ids[b:b + 1],
                                                    torch.tensor([[n[b] + g[b]]], device=device))[0, 0]
            n[b] = min(N, n[b] + j + 1)
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return tokens.view(B, verifier.grid, verifier.grid), trace.stop(verifier=verifier, drafter=drafter)
