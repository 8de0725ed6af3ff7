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
drafts. Each image advances on its own: its rows, windows and acceptances are its own, and the forward packs every
image's writes (padded to the widest). Upstream moves the batch in lockstep, every row by the least any image
accepted, which makes an image's tokens depend on its batch; here an image decodes to the same tokens in any
batch. Noise is keyed by (seed, image, position): drafts on the draft stream, tests on the acceptance stream,
the top row's extra token on the verifier's stream.
"""

from __future__ import annotations

import math

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.backbone import padded_writes
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import accepted_prefix, residual
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
    committed = torch.zeros(B, W, dtype=torch.long, device=device)  # per image and row
    committed[:, 0] = 1
    steps = 1
    while bool((committed[:, -1] < W).any()):
        plans = [_windows(c, cfg, W) for c in committed.tolist()]
        # a finished image rewrites its last token: its batch row must write something, and this changes nothing
        pos, src, groups, real = padded_writes([writes or [(N - 1, N - 1, -1)] for _, writes in plans], device)
        out = warp(backbone(pos, torch.cat([tokens, drafts], 1).gather(1, src), groups, real), warpers)  # [B, w, V]
        # noise keyed by position and iteration: a lower row's tests and redraws take effect, so no later test
        # or draft of a position may reuse them
        key = N * steps
        steps += 1
        _advance(out, plans, committed, tokens, drafts, logq, seed, ids, key, trace)
        done = torch.arange(W, device=device) < committed[:, :, None]  # [B, W, W]
        backbone.forget_mask(~done.view(B, N))
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return tokens.view(B, W, W), trace.stop()


def _advance(out: torch.Tensor, plans: list, committed: torch.Tensor, tokens: torch.Tensor, drafts: torch.Tensor,
             logq: torch.Tensor, seed: int, ids: torch.Tensor, key: int, trace: Trace) -> None:
    """Test every window of every image at once (a window: v outputs, p at t .. t + v - 1, for its d = v - 1
    drafts and one more), commit each one's accepted prefix (and for an image's top row one more token), and
    redraw what is not committed from the p just computed."""
    W, device = committed.shape[1], out.device
    windows = [(b, r, v, i, j == 0) for b, (rows, _) in enumerate(plans) for j, (r, v, i) in enumerate(rows)]
    img, row, v, i, top = (torch.tensor(f, device=device) for f in zip(*windows, strict=True))
    t, d = row * W + committed[img, row], v - 1
    lanes = torch.arange(int(v.max()), device=device)
    at = (t[:, None] + lanes).clamp(max=W * W - 1)  # [M, K] the positions a window's lanes stand for
    live = lanes < v[:, None]  # lanes past a window's v are padding
    p = out[img[:, None], (i[:, None] + lanes).clamp(max=out.shape[1] - 1)]  # [M, K, V]
    x = drafts[img[:, None], at]
    ratio = (p.gather(-1, x[..., None])[..., 0] - logq[img[:, None], at, x]).exp()
    a = accepted_prefix(ratio, uniform(seed, ids[img], at + key, ACCEPT), lanes < d[:, None])  # [M] per window
    trace.count("drafted", d.sum())
    trace.count("accepted", a.sum())
    keep = lanes < a[:, None]
    tokens[img[:, None].expand_as(at)[keep], at[keep]] = x[keep]
    # the top row's one more token at t + a: its residual where a draft was rejected, else the bonus from p
    m = top.nonzero()[:, 0]
    ta, pa = t[m] + a[m], p[m, a[m]]
    dist = torch.where((a[m] < d[m])[:, None], residual(pa, logq[img[m], ta]), pa)
    tokens[img[m], ta] = sample(dist[:, None], seed, ids[img[m]], ta[:, None])[:, 0]
    n = a + top.long()
    # what is not committed is drafted again from the p just computed
    redo = live & (lanes >= n[:, None])
    where = img[:, None].expand_as(at)[redo], at[redo]
    logq[where] = p[redo]
    drafts[where] = sample(p[redo][:, None], seed, ids[where[0]], (where[1] + key)[:, None], stream=DRAFT)[:, 0]
    committed[img, row] += n


def _windows(c: list[int], cfg: PJDConfig, W: int):
    """An image's windows this forward -> ([(row, v, index of its anchor in the writes)], [(position, source,
    group)]): the top row (the first unfinished one) and every started row below it that may move, each an
    anchor and v - 1 drafts (none when the image is finished). A write's token is `source` of [tokens | drafts]
    (a committed or provisional token at its index, a draft at N + its position); its group is its row, or -1
    for an anchor that rewrites a committed token (seen by every row). A row that has not begun is anchored on
    the provisional token, the row above's latest."""
    N = W * W
    top = next((r for r in range(W) if c[r] < W), None)
    rows, writes = [], []
    if top is None:
        return rows, writes
    for r in range(top, W):
        if r > top and c[r - 1] < cfg.start and c[r - 1] < W:
            break  # not started: nor is any row below it
        v = min(W - c[r], cfg.window) if r == top else min(c[r - 1] - c[r], cfg.window)
        if r > top and (v <= 1 or c[r] == 0 and any(p == r * W - 1 for p, _, _ in writes)):
            continue  # nothing it could commit (a lower row commits drafts only), or the row above writes the
            # slot it would start from this time
        t = r * W + c[r]
        rows.append((r, v, len(writes)))
        provisional = c[r] == 0 and r != top
        writes.append((t - 1, (r - 1) * W + c[r - 1] - 1 if provisional else t - 1,
                       -1 if c[r] > 0 or r == top else r))
        writes += [(t + k, N + t + k, r) for k in range(v - 1)]
    return rows, writes
