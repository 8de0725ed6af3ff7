"""ZipAR (ICML 2025): row r+1 starts once row r has `window` tokens, and one forward advances every active
row by one token: W + (H-1) * window forwards instead of H * W.

A raster next-token model predicts a row's first token from the slot of the previous row's last token, which
ZipAR has not decoded yet when the row starts. The rule here: that slot is written provisionally with the
previous row's latest token (its neighbour in content, at the right position), and rewritten with the real
token once the row finishes; K/V computed against a provisional slot are counted as `provisional_kv`.
"""

from __future__ import annotations

import torch

from ..ar import ARBackbone, Warpers
from .trace import Trace


@torch.no_grad()
def decode_zipar(backbone: ARBackbone, captions: list[str], window: int = 4, seed: int = 0,
                 warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
                 progress=None) -> tuple[torch.Tensor, Trace]:
    W = backbone.grid
    if not 1 <= window <= W:
        raise ValueError(f"window must be in 1..{W}, got {window}")
    warpers = warpers or Warpers()
    B = len(captions)
    device = backbone.device
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    trace = Trace(f"zipar{window}", images=B, tokens=B * W * W).start("provisional_kv", verifier=backbone)
    tokens = torch.zeros(B, W * W, dtype=torch.long, device=device)
    first = backbone.start(captions)

    def draw(logits, pos):
        return backbone.draw(logits, warpers, seed, ids, pos)

    trace.steps = 1 + zipar_rows(backbone, tokens, 0, W, window, first, draw, trace, progress)
    return tokens.view(B, W, W), trace.stop()


def zipar_rows(backbone: ARBackbone, tokens: torch.Tensor, row0: int, rows: int, window: int,
               first: torch.Tensor, draw, trace: Trace, progress=None) -> int:
    """Decode rows [row0, row0 + rows) of the raster grid `tokens` [B, W*W] in place, ZipAR-style; `first`
    [B, 1, V] are the logits for the first position of row0 (from the caller's last forward), and
    `draw(logits [B,n,V], positions [B,n]) -> tokens [B,n]` samples the n active rows' next tokens at once;
    provisional slots are tallied in `trace`.
    With window = W it is plain serial decoding. Returns the number of forwards (each one sequential step)."""
    W = backbone.grid
    B, device = tokens.shape[0], tokens.device
    steps, pending = 0, []  # pending: last positions of finished rows, to be written for real
    for t in range(W + (rows - 1) * window):
        active = [(r, t - (r - row0) * window) for r in range(row0, row0 + rows) if 0 <= t - (r - row0) * window < W]
        writes, queries = list(pending), []
        pending = []
        for r, c in active:
            u = r * W + c
            if r == row0 and c == 0:
                queries.append((u, None))
                continue
            if c == 0:  # provisional: the previous row's latest token at the previous row's last slot
                latest = (r - 1) * W + window - 1  # decoded in the previous step
                writes.append((u - 1, latest))
                if latest != u - 1:  # the row's other tokens will attend to a provisional slot
                    trace.count("provisional_kv", W - 1)
            else:
                writes.append((u - 1, u - 1))
            queries.append((u, len(writes) - 1))
        logits = None
        if writes:
            pos = torch.tensor([p for p, _ in writes], device=device).expand(B, -1)
            logits = backbone(pos, tokens[:, [src for _, src in writes]])
            steps += 1
        if queries:  # every active row's token in one draw: the noise is keyed by position, not by call
            us = [u for u, _ in queries]
            dist = first if queries[0][1] is None else logits[:, [i for _, i in queries]]  # row0's start: alone
            tokens[:, us] = draw(dist, torch.tensor(us, device=device).expand(B, -1))
            pending += [(u, u) for u in us if u % W == W - 1 and u // W + 1 < row0 + rows]
        if progress is not None:
            progress.update(1)
    return steps
