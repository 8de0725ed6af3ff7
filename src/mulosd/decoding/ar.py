"""Plain AR decoding: serial raster order with the KV cache, one token per image per step. The baseline
every speed-up is measured against."""

from __future__ import annotations

import torch

from ..ar import ARBackbone, Warpers
from .trace import Trace


@torch.no_grad()
def decode_ar(backbone: ARBackbone, captions: list[str], seed: int = 0, warpers: Warpers | None = None,
              image_ids: torch.Tensor | None = None, progress=None) -> tuple[torch.Tensor, Trace]:
    """-> tokens [B, grid, grid] and the trace. Noise is keyed by (seed, image_ids[b], position), so an image
    does not depend on its batch; image_ids defaults to 0..B-1."""
    B, g = len(captions), backbone.grid
    warpers = warpers or Warpers()
    trace = Trace("ar", images=B, tokens=B * g * g).start(verifier=backbone)
    logits = backbone.start(captions)
    ids = (torch.arange(B) if image_ids is None else image_ids).to(logits.device)
    tokens = torch.empty(B, g * g, dtype=torch.long, device=logits.device)
    for i in range(g * g):
        pos = torch.full((B, 1), i, device=logits.device)
        tokens[:, i:i + 1] = backbone.draw(logits, warpers, seed, ids, pos)
        if i + 1 < g * g:
            logits = backbone(pos, tokens[:, i:i + 1])
        if progress is not None:
            progress.update(1)
    trace.steps = g * g  # the prefix forward, then one per token but the last
    return tokens.view(B, g, g), trace.stop()
