"""Speculative Jacobi decoding (SJD, Teng et al., ICLR 2025): training-free and lossless in distribution.

The verifier drafts for itself. A window of `window` future positions holds draft tokens, each with the
distribution q it was drawn from. One forward writes the window (and whatever committed tokens the cache
lacks) and returns the verifier's p at every window position given the tokens before it. The positions are
tested in raster order as speculative sampling tests them: accept the draft x with probability
min(1, p(x) / q(x)). At the first rejection the position is drawn from norm(max(0, p - q)) and committed;
the window's later positions are redrawn from the p just computed (their context changes, so they are drafts
again, with q = that p), and the window is refilled at its end: the position after the last p from it, the
rest uniformly. Every iteration commits at least one token, and speculative sampling is exact for any
proposal drawn before its test, so the tokens are distributed as plain AR's.

Noise is keyed by (seed, image, position) on three streams: a position's drafts use its draft noise, its test
its uniform (which decides its token once: a position is tested with effect only when every earlier one
passed), and a rejected position's redraw the verifier's noise. Images advance by their own accepted lengths
(batch > 1 in lockstep: an image that is done rewrites its last position, a no-op), so an image decodes the
same alone and in a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import residual
from .knobs import check
from .trace import Trace


@dataclass(frozen=True)
class SJDConfig:
    window: int = field(default=16, metadata={"key": "sjd_window"})  # positions drafted and verified per forward

    def __post_init__(self):
        check(self.window >= 1, "window", f"must be >= 1, got {self.window}")


@torch.no_grad()
def decode_sjd(backbone: ARBackbone, captions: list[str], cfg: SJDConfig = SJDConfig(), seed: int = 0,
               warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
               progress=None) -> tuple[torch.Tensor, Trace]:
    warpers = warpers or Warpers()
    B, N, device = len(captions), backbone.grid ** 2, backbone.device
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    trace = Trace(f"sjd{cfg.window}", images=B, tokens=B * N).start("drafted", "accepted", verifier=backbone)
    p0 = warp(backbone.start(captions), warpers)[:, 0]  # exact p at position 0
    V = p0.shape[-1]
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)
    n = [0] * B  # committed tokens per image
    written = [0] * B  # the cache holds committed tokens [0, written) with their final context
    # the window: per image, drafts for positions n .. n + len - 1 and the log q each was drawn from
    flat = torch.full((1, V), -math.log(V), device=device)  # log q of a uniform draft
    logq = [torch.cat([p0[b:b + 1], flat.expand(cfg.window - 1, -1)])[:min(cfg.window, N)] for b in range(B)]
    drafts = [_draw(q, seed, ids[b], 0) for b, q in enumerate(logq)]
    steps = 1
    while min(n) < N:
        out, index = _verify(backbone, tokens, n, written, drafts, N)
        out = warp(out, warpers)
        steps += 1
        for b in range(B):
            if n[b] >= N:
                continue
            L = len(drafts[b])
            # p at window position i: the output of the write at position n + i - 1 (the prefix's for position 0)
            p = torch.stack([p0[b] if n[b] + i == 0 else out[b, index[b][n[b] + i - 1]] for i in range(L)])
            positions = torch.arange(n[b], n[b] + L, device=device)
            x = drafts[b]
            ratio = (p.gather(-1, x[:, None]) - logq[b].gather(-1, x[:, None]))[:, 0].exp()
            u = uniform(seed, ids[b:b + 1], positions[None], ACCEPT)[0]
            j = int((u < ratio.clamp(max=1).double()).long().cumprod(0).sum())  # accepted prefix
            tokens[b, n[b]:n[b] + j] = x[:j]
            trace.count("drafted", min(j + 1, L))
            trace.count("accepted", j)
            written[b] = n[b] + j
            if j < L:  # the first rejection: drawn from the residual, committed
                dist = residual(p[j:j + 1], logq[b][j:j + 1])[None]
                tokens[b, n[b] + j] = sample(dist, seed, ids[b:b + 1], positions[None, j:j + 1])[0, 0]
                n[b] += j + 1
            else:
                n[b] += L
            # the next window: redraw the rest of this one from its p, the next position from the last write's
            # output, anything further uniformly
            start, L2 = n[b], min(cfg.window, N - n[b])
            last = int(positions[-1])  # the window's last position: its write's output is p at last + 1
            q = list(p[start - int(positions[0]):])
            if len(q) < L2:
                q.append(out[b, index[b][last]])
            logq[b] = torch.cat([torch.stack(q)[:L2], flat.expand(L2 - len(q), -1)]) if L2 else flat[:0]
            drafts[b] = _draw(logq[b], seed, ids[b], start)
            backbone.forget(torch.arange(start, N, device=device)[None], rows=torch.tensor([b]))
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return tokens.view(B, backbone.grid, backbone.grid), trace.stop()


def _draw(logq: torch.Tensor, seed: int, image: torch.Tensor, start: int) -> torch.Tensor:
    """Drafts [L] from log q [L, V] at positions start.., on the draft noise stream."""
    if not len(logq):
        return torch.empty(0, dtype=torch.long, device=logq.device)
    positions = torch.arange(start, start + len(logq), device=logq.device)[None]
    return sample(logq[None], seed, image.view(1), positions, stream=DRAFT)[0]


def _verify(backbone: ARBackbone, tokens: torch.Tensor, n: list[int], written: list[int],
            drafts: list[torch.Tensor], N: int) -> tuple[torch.Tensor, list[dict[int, int]]]:
    """One forward per batch: each image writes its committed tokens from the last one the cache lacks (at
    least its last committed token, whose output is p at its first window position) and its window. Returns
    the logits and, per image, position -> index in its writes. An image that is done rewrites its last
    position (a no-op)."""
    rows = []
    for b in range(len(n)):
        if n[b] >= N:
            rows.append([(N - 1, int(tokens[b, N - 1]))])
            continue
        committed = [(p, int(tokens[b, p])) for p in range(min(written[b], n[b] - 1) if n[b] else 0, n[b])]
        rows.append(committed + [(n[b] + i, int(t)) for i, t in enumerate(drafts[b].tolist())])
    width = max(len(r) for r in rows)
    pos = torch.tensor([[p for p, _ in r + [r[-1]] * (width - len(r))] for r in rows], device=tokens.device)
    tok = torch.tensor([[t for _, t in r + [r[-1]] * (width - len(r))] for r in rows], device=tokens.device)
    return backbone(pos, tok), [{p: i for i, (p, _) in enumerate(r)} for r in rows]
