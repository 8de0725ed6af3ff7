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

`coupling=maximal` (SCD / MC-SJD, arXiv 2510.24211) redraws the positions after the first rejection by maximal
coupling instead: a draft is kept with probability min(1, p(x) / q_old(x)), else drawn from the residual, so it
stays the same token as often as a sample of its new p can (`_coupled`). The default redraw, `gumbel`, already
couples by reusing the position's own draft noise (SCD's Gumbel coupling). Both are exact.

Noise is keyed by (seed, image, position) on three streams: a position's drafts use its draft noise, its test
its uniform (which decides its token once: a position is tested with effect only when every earlier one
passed), and a rejected position's redraw the verifier's noise; the maximal coupling's test and draw have
streams of their own, keyed by position and iteration. Images advance by their own accepted lengths
(batch > 1 in lockstep: an image that is done rewrites its last position, a no-op), so an image decodes the
same alone and in a batch.
"""

from __future__ import annotations

import math

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, COUPLE_DRAW, COUPLE_TEST, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import accepted_prefix, residual
from .knobs import SJDConfig
from .trace import Trace


@torch.no_grad()
def decode_sjd(backbone: ARBackbone, captions: list[str], cfg: SJDConfig = SJDConfig(), seed: int = 0,
               warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
               progress=None) -> tuple[torch.Tensor, Trace]:
    """-> tokens [B, G, G] and the trace. Every image's window is tested at once: one forward and a few
    batched tensor operations per iteration, whatever the batch."""
    warpers = warpers or Warpers()
    B, N, L, device = len(captions), backbone.grid ** 2, cfg.window, backbone.device
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    trace = Trace(f"sjd{L}", images=B, tokens=B * N).start("drafted", "accepted", verifier=backbone)
    p0 = warp(backbone.start(captions), warpers)[:, 0]  # [B, V]: the exact p at position 0
    V = p0.shape[-1]
    flat = torch.full((V,), -math.log(V), device=device)  # log q of a uniform draft
    rows = torch.arange(B, device=device)
    offsets = torch.arange(L, device=device)
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)
    n = torch.zeros(B, dtype=torch.long, device=device)  # committed tokens per image
    # the window: drafts for positions n .. n + L - 1 and the log q each was drawn from
    logq = flat.expand(B, L, V).clone()
    logq[:, 0] = p0
    drafts = _draw(logq, seed, ids, n[:, None] + offsets)
    steps = 1
    while bool((n < N).any()):
        window = n[:, None] + offsets  # [B, L] positions
        valid = (window < N) & (n < N)[:, None]
        out = warp(_verify(backbone, tokens, n, drafts, valid, N), warpers)  # [B, L + 1, V]
        steps += 1
        # p at window position i: the output of the write at position n + i - 1 (the prefix's for position 0)
        p = out[:, :L].clone()
        p[n == 0, 0] = p0[n == 0]
        ratio = (p.gather(-1, drafts[..., None]) - logq.gather(-1, drafts[..., None]))[..., 0].exp()
        j = accepted_prefix(ratio, uniform(seed, ids, window.clamp(max=N - 1), ACCEPT), valid)  # per image
        length = valid.sum(1)
        rejected = j < length
        b, i = (offsets[None] < j[:, None]).nonzero(as_tuple=True)  # the accepted drafts
        tokens[b, window[b, i]] = drafts[b, i]
        trace.count("drafted", torch.minimum(j + 1, length).sum())
        trace.count("accepted", j.sum())
        if rejected.any():  # the first rejection of each image: drawn from the residual, committed
            b = rows[rejected]
            jb = j[rejected]
            dist = residual(p[b, jb], logq[b, jb])[:, None]
            tokens[b, n[b] + jb] = sample(dist, seed, ids[b], (n[b] + jb)[:, None])[:, 0]
        moved = torch.where(rejected, j + 1, length)
        new_logq, source = _next_window(p, out, moved, flat)
        n_next = torch.minimum(n + moved, torch.full_like(n, N))
        new_drafts = _draw(new_logq, seed, ids, n_next[:, None] + offsets)
        if cfg.coupling == "maximal":
            new_drafts = _coupled(new_drafts, new_logq, drafts, logq, source, n, seed, ids, N)
        drafts, logq, n = new_drafts, new_logq, n_next
        backbone.forget_mask(torch.arange(N, device=device)[None] >= n[:, None])
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return tokens.view(B, backbone.grid, backbone.grid), trace.stop()


def _next_window(p: torch.Tensor, out: torch.Tensor, moved: torch.Tensor, flat: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next window's log q [B, L, V] after each image moved by `moved` [B]: the rest of this window redrawn
    from its p [B, L, V], the next position from the last write's output (out[:, L]), anything further
    uniformly (`flat`); and each new position's index in this window (< L: it was drafted already)."""
    B, L, V = p.shape
    extended = torch.cat([p, out[:, L:]], 1)  # p at positions n .. n + L
    source = moved[:, None] + torch.arange(L, device=p.device)  # index into `extended` of each new position
    logq = torch.where((source <= L)[..., None], extended.gather(1, source.clamp(max=L)[..., None].expand(-1, -1, V)),
                       flat)
    return logq, source


def _coupled(drafts: torch.Tensor, logq: torch.Tensor, old: torch.Tensor, old_logq: torch.Tensor,
             source: torch.Tensor, n: torch.Tensor, seed: int, ids: torch.Tensor, N: int) -> torch.Tensor:
    """Maximal coupling (SCD / MC-SJD): each new window position that was already drafted (its index in the
    old window, `source`, < L) keeps its old draft x with probability min(1, p(x) / q_old(x)), and otherwise
    takes a draw from norm(max(0, p - q_old)). Either way the draft is an exact sample of its new q = p, equal
    to the old one with probability 1 - TV(p, q_old), the most any coupling keeps; the test and the draw use
    noise keyed by (position, committed count n), which no later test or draw of the position reuses."""
    L = old.shape[1]
    carried = source < L
    idx = source.clamp(max=L - 1)
    prev = old.gather(1, idx)  # the old draft at each new position
    prev_logq = old_logq.gather(1, idx[..., None].expand(-1, -1, logq.shape[-1]))
    ratio = (logq.gather(-1, prev[..., None]) - prev_logq.gather(-1, prev[..., None]))[..., 0].exp()
    key = (n[:, None] + source) + N * n[:, None]  # the position, made unique per iteration (n grows)
    keep = uniform(seed, ids, key, COUPLE_TEST) < ratio.clamp(max=1).double()
    # Gumbel-max, not inversion of the residual's CDF: a batch's matmuls round p differently from a lone image's,
    # and a sum over the codebook moves an inverted draw across a code boundary where an argmax moves only at a tie
    redrawn = sample(residual(logq, prev_logq), seed, ids, key, stream=COUPLE_DRAW)
    return torch.where(carried, torch.where(keep, prev, redrawn), drafts)


def _draw(logq: torch.Tensor, seed: int, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Drafts [B, L] from log q [B, L, V] at positions [B, L], on the draft noise stream."""
    return sample(logq, seed, ids, positions, stream=DRAFT)


def _verify(backbone: ARBackbone, tokens: torch.Tensor, n: torch.Tensor, drafts: torch.Tensor,
            valid: torch.Tensor, N: int) -> torch.Tensor:
    """One forward writing, per image, its last committed token (whose output is p at its first window
    position) and its window: L + 1 writes at positions n - 1 .. n + L - 1 -> logits [B, L + 1, V]. Writes
    that do not exist (before position 0, past the grid's end, an image that is done) repeat an existing one
    (a duplicate write of one slot with its own token is a no-op), so every image has the same width."""
    B, L = drafts.shape
    last = (n - 1).clamp(min=0, max=N - 1)
    pos = torch.cat([last[:, None], n[:, None] + torch.arange(L, device=n.device)], 1)
    tok = torch.cat([tokens.gather(1, last[:, None]), drafts], 1)
    exists = torch.cat([(n > 0)[:, None], valid], 1)
    exists[:, 0] |= ~exists[:, 1:].any(1)  # an image with no window rewrites its last committed token
    # each missing write repeats the nearest existing one before it (or, at position -1, the first window one)
    idx = torch.where(exists, torch.arange(L + 1, device=n.device), -1).cummax(1).values
    idx = torch.where(idx < 0, 1, idx)
    return backbone(pos.gather(1, idx), tok.gather(1, idx))
