"""Parallel Jacobi decoding (PJD, Liao et al., CVPR 2026): one speculative Jacobi window per image row, several
rows at once, staggered like ZipAR's rows, in one forward.

Row r holds c_r committed tokens; its next position is t_r = r W + c_r. Each forward writes, per active row, an
anchor (the row's last committed token, whose output is p at t_r) and v_r - 1 drafts at t_r .. t_r + v_r - 2,
and returns p at t_r .. t_r + v_r - 1. The windows do not see each other (PJD's row-causal mask: `groups` in
`ARBackbone`); a row sees the cache, i.e. what every row above has committed so far. The drafts are tested in
order with speculative sampling's min(1, p / q):

- the top row (the first unfinished one) commits its accepted prefix and one more token: drawn from
  norm(max(0, p - q)) at its first rejection, or from p after its last draft (the bonus); its own window is
  exact SJD, so with `window=1` (no drafts) the top row is plain AR, token for token;
- a lower row commits its accepted prefix only, and never gets ahead of the row above (v_r <= c_{r-1} - c_r);
  its tests are against a p that has not seen the rest of the rows above: PJD is not lossless;
- row r + 1 starts once row r has `start` tokens. A row's first token is predicted from the slot before it,
  the end of the row above, which is not decoded yet: as ZipAR does, that slot is written provisionally with
  the row above's latest token, seen by that row alone (PJD's models have an end-of-line token there instead).

The drafts not committed are redrawn from the p just computed (q := p, with each position's own draft noise:
SJD's Gumbel coupling); the position after a window from the last output; positions never reached hold uniform
drafts. The batch advances in lockstep, every row by the least any image accepted (as upstream does), so an
image's tokens depend on the batch it is decoded in. Noise is keyed by (seed, image, position): drafts on the
draft stream, tests on the acceptance stream, the top row's extra token on the verifier's stream.
"""

from __future__ import annotations

import math

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import residual
from .knobs import PJDConfig
from .trace import Trace


@torch.no_grad()
def decode_pjd(backbone: ARBackbone, captions: list[str], cfg: PJDConfig = PJDConfig(), seed: int = 0,
               warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
               progress=None) -> tuple[torch.Tensor, Trace]:
    warpers = warpers or Warpers()
    B, W, device = len(captions), backbone.grid, backbone.device
    N = W * W
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    trace = Trace(f"pjd{cfg.window}", images=B, tokens=B * N).start("drafted", "accepted", verifier=backbone)
    p0 = warp(backbone.start(captions), warpers)[:, 0]  # [B, V]
    V = p0.shape[-1]
    positions = torch.arange(N, device=device).expand(B, N)
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)
    tokens[:, 0] = sample(p0[:, None], seed, ids, positions[:, :1])[:, 0]  # position 0 as `ar` draws it
    # every position's current draft and the log q it was drawn from: uniform until a forward predicts it
    logq = torch.full((B, N, V), -math.log(V), device=device)
    drafts = sample(logq, seed, ids, positions, stream=DRAFT)
    c = [1] + [0] * (W - 1)  # committed tokens per row
    steps = 1
    while c[-1] < W:
        top = next(r for r in range(W) if c[r] < W)
        rows, writes = _windows(c, top, cfg, W)
        pos, tok, groups = _inputs(tokens, drafts, c, top, rows, writes)
        out = warp(backbone(pos.expand(B, -1), tok, groups), warpers)  # [B, writes, V]
        # noise keyed by position and iteration: a lower row's tests and redraws take effect, so no later test
        # or draft of a position may reuse them
        key = positions + N * steps
        steps += 1
        for r, v, i in rows:
            t, d = r * W + c[r], v - 1  # v outputs: p at t .. t + v - 1, for the d drafts and one more
            p = out[:, i:i + v]
            x = drafts[:, t:t + d]
            ratio = (p[:, :d].gather(-1, x[..., None]) - logq[:, t:t + d].gather(-1, x[..., None]))[..., 0].exp()
            ok = uniform(seed, ids, key[:, t:t + d], ACCEPT) < ratio.clamp(max=1).double()
            accepted = ok.long().cumprod(1).sum(1)  # [B]
            a = int(accepted.min())  # lockstep: every image moves by the least any accepted
            trace.count("drafted", B * d)
            trace.count("accepted", accepted.sum())
            tokens[:, t:t + a] = x[:, :a]
            n = a
            if r == top:  # one more: the draft where this image accepted it, else its residual, or the bonus
                if a < d:
                    extra = sample(residual(p[:, a:a + 1], logq[:, t + a:t + a + 1]), seed, ids,
                                   positions[:, t + a:t + a + 1])[:, 0]
                    tokens[:, t + a] = torch.where(accepted > a, x[:, a], extra)
                else:
                    tokens[:, t + d] = sample(p[:, d:d + 1], seed, ids, positions[:, t + d:t + d + 1])[:, 0]
                n = a + 1
            # what is not committed is drafted again from the p just computed
            logq[:, t + n:t + v] = p[:, n:v]
            drafts[:, t + n:t + v] = sample(p[:, n:v], seed, ids, key[:, t + n:t + v], stream=DRAFT)
            c[r] += n
        done = torch.cat([torch.arange(W, device=device) < c[r] for r in range(W)])
        backbone.forget_mask(~done[None].expand(B, -1))
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return tokens.view(B, W, W), trace.stop()


def _windows(c: list[int], top: int, cfg: PJDConfig, W: int):
    """This forward's rows -> ([(row, v, index of its anchor in the writes)], [(position, group)]): the top row
    and every started row below it that may move, each an anchor and v - 1 drafts; a write's group is its row,
    or -1 for an anchor that rewrites a committed token (seen by every row)."""
    rows, writes = [], []
    for r in range(top, W):
        if r > top and c[r - 1] < cfg.start and c[r - 1] < W:
            break  # not started: nor is any row below it
        v = min(W - c[r], cfg.window) if r == top else min(c[r - 1] - c[r], cfg.window)
        if r > top and (v <= 1 or c[r] == 0 and any(p == r * W - 1 for p, _ in writes)):
            continue  # nothing it could commit (a lower row commits drafts only), or the row above writes the
            # slot it would start from this time
        t = r * W + c[r]
        rows.append((r, v, len(writes)))
        writes.append((t - 1, -1 if c[r] > 0 or r == top else r))
        writes += [(t + i, r) for i in range(v - 1)]
    return rows, writes


def _inputs(tokens: torch.Tensor, drafts: torch.Tensor, c: list[int], top: int, rows: list, writes: list
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's positions [n], tokens [B, n] and groups [n] for `_windows`' rows and writes: each row's
    anchor (its last committed token, or for a row that has not begun the provisional one: the row above's
    latest) and its current drafts."""
    W = len(c)
    pos = torch.tensor([q for q, _ in writes], device=tokens.device)
    groups = torch.tensor([g for _, g in writes], device=tokens.device)
    tok = tokens[:, pos]
    for r, v, i in rows:
        if c[r] == 0 and r != top:
            tok[:, i] = tokens[:, (r - 1) * W + c[r - 1] - 1]
        tok[:, i + 1:i + v] = drafts[:, r * W + c[r]:r * W + c[r] + v - 1]
    return pos, tok, groups
