"""`ARBackbone`: the one call every decoding strategy makes.

    bb = ARBackbone(model, encoder, cfg_scale=3.0)   # cfg_schedule="linear": the scale ramps along the raster
    logits0 = bb.start(captions)               # condition prefix into the cache; logits for position 0
    logits = bb(positions, tokens)             # write tokens at grid positions; logits for position + 1
    tokens = bb.draw(logits, warpers, seed, images, positions + 1)   # warp and sample (compiled with the step)
    bb.forget(positions)                       # un-fill slots: discarded drafts leave the context

Positions are raster indices on the grid, any set per call ([B, n]); each written token attends to the
filled slots at or before it. With guidance the batch is doubled internally (conditional rows, then rows
with the learned null condition) and the returned logits are `u + scale * (c - u)`, computed in float32, the
scale set by the token they predict (`guidance_scale`).
`calls` and `tokens_in` count forward passes and the token slots they write, a ragged batch's padding included (what
a padded forward computes; the eager step skips it), for the decoders' traces.
"""

from __future__ import annotations

import torch

from ..choices import GUIDANCE_SCHEDULES
from .fused import FusedStep
from .sampling import Warpers, draw
from .transformer import KVCache, Transformer


def guidance_scale(schedule: str, cfg_scale: float, positions: torch.Tensor, n: int) -> float | torch.Tensor:
    """The guidance scale for drawing the tokens at raster positions [B, k] of an n-token grid: `cfg_scale`
    everywhere ("constant"), or ("linear") rising from 1 (the conditional model alone) at the first token to
    2 cfg_scale - 1 at the last, so that its mean stays cfg_scale. The linear ramp is VAR's schedule over scales
    laid along the raster, tried because a constant strong scale turns places where the conditional model
    merely allows an object into objects (counting prompts get too many) while a weak one loses colours; on the
    zoo it measured a small gain at most (docs/log.md, zoo v2), so it is a tuning choice.
    -> a float, or [B, k, 1] float32 to broadcast over the vocabulary."""
    if schedule == "constant" or cfg_scale == 1.0:
        return cfg_scale
    if schedule != "linear":
        raise ValueError(f"unknown guidance schedule {schedule!r}; known: {', '.join(GUIDANCE_SCHEDULES)}")
    ramp = positions.clamp(0, n - 1).float() / max(n - 1, 1)
    return (1.0 + 2.0 * (cfg_scale - 1.0) * ramp)[..., None]


class ARBackbone:
    def __init__(self, model: Transformer, encoder, cfg_scale: float = 1.0, compile: bool = False,
                 cfg_schedule: str = "constant"):
        if cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0, got {cfg_scale}")
        if cfg_schedule not in GUIDANCE_SCHEDULES:
            raise ValueError(f"unknown guidance schedule {cfg_schedule!r}; known: {', '.join(GUIDANCE_SCHEDULES)}")
        self.model, self.encoder, self.cfg_scale = model, encoder, float(cfg_scale)
        self.cfg_schedule = cfg_schedule
        self.cache: KVCache | None = None
        self.calls = self.tokens_in = 0
        # the decode step compiled (torch.compile, static shapes): token counts padded up to a few buckets; on a
        # CPU, steps of a few input vectors (every step of ar at small batch, most of ZipAR's) run as one C call
        self._step = compiled_step(model, self.cfg_scale) if compile else None
        self._fused = FusedStep.for_model(model, self.cfg_scale) if compile else None
        self._draw = compiled_draw() if compile else draw

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def grid(self) -> int:
        return self.model.cfg.grid

    def scale(self, positions: torch.Tensor) -> float | torch.Tensor:
        """The guidance scale for drawing the tokens at grid positions [B, k] (`guidance_scale`)."""
        return guidance_scale(self.cfg_schedule, self.cfg_scale, positions, self.grid * self.grid)

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def batch(self) -> int:
        return self.cache.batch // (2 if self.guided else 1)

    @property
    def filled(self) -> torch.Tensor:
        """[B, N] bool: which grid positions hold context."""
        return self.cache.filled[:self.batch, self.model.cfg.prefix:]

    @property
    def device(self):
        return next(self.model.parameters()).device

    def draw(self, logits: torch.Tensor, warpers: Warpers, seed: int, images: torch.Tensor, positions: torch.Tensor
             ) -> torch.Tensor:
        """`sample(warp(logits, warpers), seed, images, positions)`, compiled with the step when it is (the
        positions padded to a bucket like the step's: each is drawn on its own, the padding is dropped)."""
        if self._step is None:
            return draw(logits, warpers, seed, images, positions)
        if self._fused is not None and self._fused.draws(warpers):
            return self._fused.draw(logits, warpers.temperature, seed, images, positions)
        n = positions.shape[1]
        # contiguous: a graph is specialised on strides too, and logits often arrive as a slice of a wider output
        logits, positions = (_pad(t, bucket(n)).contiguous() for t in (logits, positions))
        return self._draw(logits, warpers, seed, images, positions)[:, :n]

    @torch.no_grad()
    def precompile(self, captions: list[str], warpers: Warpers, seed: int) -> None:
        """Compile the step for every bucket a decode of this batch can write, and the draw for every bucket
        of up to a row, so that no later decode compiles inside a timed region (compile=true; eager: nothing
        to do). Leaves no cache behind: the next decode starts its own."""
        if self._step is None:
            return
        N, ids = self.grid * self.grid, torch.arange(len(captions), device=self.device)
        for width in BUCKETS[:BUCKETS.index(bucket(N)) + 1]:
            self.start(captions)
            pos = torch.arange(min(width, N), device=self.device).expand(len(captions), -1)
            logits = self(pos, torch.zeros_like(pos))
            if width <= bucket(self.grid):
                self.draw(logits, warpers, seed, ids, pos)
        self.cache = None
        self.calls = self.tokens_in = 0

    @torch.no_grad()
    def start(self, captions: list[str]) -> torch.Tensor:
        """Reset the cache for these captions and fill the prefix; returns logits [B, 1, V] for position 0."""
        B, P = len(captions), self.model.cfg.prefix
        feats, visible = _features(self.encoder(captions))
        dtype = next(self.model.parameters()).dtype  # a bf16 model may sit beside an fp32 caption encoder
        prefix = self.model.condition(feats.to(self.device, dtype), B)
        if self.guided:  # the null rows share the caption's padding mask, as LlamaGen's sampler does
            prefix = torch.cat([prefix, self.model.condition(None, B)])
            visible = None if visible is None else visible.repeat(2, 1)
        self.cache = KVCache(self.model.cfg, prefix.shape[0], device=self.device, dtype=dtype)
        slots = torch.arange(P, device=self.device).expand(prefix.shape[0], P)
        fill = None if visible is None else visible.to(self.device)
        logits = self.model.step(slots, prefix, self.cache, fill=fill)[:, -1:]
        self.calls += 1
        self.tokens_in += B * P
        return guide(logits, self.scale(torch.zeros(B, 1, dtype=torch.long, device=self.device)))

    @torch.no_grad()
    def __call__(self, positions: torch.Tensor, tokens: torch.Tensor, groups: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Write tokens [B, n] at grid positions [B, n]; logits [B, n, V] for the positions that follow.
        `groups` [n] or [B, n]: draft windows that do not see each other (`Transformer.step`; the eager step
        runs them). `lengths` [B]: each row's real writes, the rest padding (`padded_writes`); the eager step
        runs only the real ones through its projections (a compiled step runs the padded width)."""
        if self.cache is None:
            raise RuntimeError("call start(captions) first")
        if positions.shape != tokens.shape or positions.shape[0] != self.batch:
            raise ValueError(f"positions {tuple(positions.shape)} and tokens {tuple(tokens.shape)} must both be "
                             f"[batch={self.batch}, n]")
        N = self.grid * self.grid
        if positions.numel() and (positions.min() < 0 or positions.max() >= N):
            raise ValueError(f"positions must be in [0, {N})")
        if lengths is not None and (lengths.shape != (self.batch,) or positions.numel() and (
                lengths.min() < 1 or lengths.max() > positions.shape[1])):
            raise ValueError(f"lengths must be [batch={self.batch}], each in [1, {positions.shape[1]}]: the real "
                             f"writes of each row")
        positions = positions.to(self.device)
        scale = self.scale(positions + 1)  # a position's logits predict the next one in raster order
        slots = positions + self.model.cfg.prefix
        tokens = tokens.to(self.device)
        if self.guided:
            slots, tokens = slots.repeat(2, 1), tokens.repeat(2, 1)
            if groups is not None and groups.dim() == 2:
                groups = groups.repeat(2, 1)
            lengths = None if lengths is None else lengths.repeat(2)
        n = slots.shape[1]
        if groups is not None:
            logits = guide(self.model.step(slots, self.model.embed(tokens), self.cache, groups=groups,
                                           lengths=lengths), scale)
        elif self._fused is not None and self._fused.covers(*slots.shape):
            logits = self._fused(slots, tokens, self.cache, scale)
        elif self._step is None or n == 0:
            logits = guide(self.model.step(slots, self.model.embed(tokens), self.cache, lengths=lengths), scale)
        else:
            # pad to the bucket by repeating the last write: a duplicate write of one slot in one forward
            # computes the same K/V twice, and the extra outputs are dropped; guidance is part of the graph
            slots, tokens = (_pad(t, bucket(n)) for t in (slots, tokens))
            scales = _pad(scale, bucket(n)).contiguous() if isinstance(scale, torch.Tensor) else None
            logits = self._step(slots, tokens, self.cache, scales)[:, :n]
        self.calls += 1
        self.tokens_in += positions.numel()
        return logits

    def forget_mask(self, mask: torch.Tensor) -> None:
        """Un-fill the grid positions where mask [B, N] is true."""
        P = self.model.cfg.prefix
        keep = ~mask.to(self.device)
        if self.guided:
            keep = keep.repeat(2, 1)
        self.cache.filled[:, P:] &= keep

    def forget(self, positions: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Un-fill grid positions [B, n] (or, with rows [k], positions [k, n] of those batch rows only)."""
        slots = positions.to(self.device) + self.model.cfg.prefix
        rows = torch.arange(self.batch, device=self.device) if rows is None else rows.to(self.device)
        if self.guided:
            rows, slots = torch.cat([rows, rows + self.batch]), slots.repeat(2, 1)
        self.cache.filled[rows[:, None], slots] = False


def guide(logits: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """Classifier-free guidance in float32: rows [conditional; null] -> u + scale * (c - u) (scale 1: c alone,
    and no null rows were run). `scale` is a float or one per token ([B, n, 1], `guidance_scale`)."""
    logits = logits.float()
    if isinstance(scale, float) and scale == 1.0:
        return logits
    c, u = logits.chunk(2)
    return u + scale * (c - u)


BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
           6144, 8192)
# (id(model), guidance scale) -> (model, compiled step): one set of graphs per model (or view) and scale
_COMPILED: dict[tuple[int, float], tuple] = {}
_DRAW = None


def padded_writes(rows: list[list[tuple[int, ...]]], device=None) -> tuple[torch.Tensor, ...]:
    """Per-image writes, each a (position, token, ...) tuple, -> one long tensor [B, width] per field for a
    batched forward, then the lengths [B]: shorter rows repeat their last write (writing one slot twice in a
    forward computes the same K/V twice, so the padding changes nothing; given the lengths, the eager step
    skips it). Every row must hold at least one write."""
    width = max(len(r) for r in rows)
    writes = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
    return *(field.contiguous() for field in writes.unbind(-1)), lengths


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """t [B, n, ...] widened to [B, width, ...] along dim 1 by repeating its last entry."""
    n = t.shape[1]
    return t if width == n else torch.cat([t, t[:, -1:].expand(-1, width - n, *t.shape[2:])], 1)


def bucket(n: int) -> int:
    """The padded width of a forward writing n tokens: the smallest bucket >= n."""
    return next((b for b in BUCKETS if b >= n), n)


def compiled_step(model: Transformer, cfg_scale: float):
    """`model.step` on token ids and guidance, compiled once per model object and scale with static shapes
    (inductor): every (rows, bucket) pair compiles once per process; a new KV cache of the same shape reuses
    the graphs. The step's `scales` are a schedule's per-token scales (a graph input), or None for `cfg_scale`
    itself (a constant of the graph, so that scale 1 runs no guidance at all)."""
    key = (id(model), cfg_scale)
    if key not in _COMPILED or _COMPILED[key][0] is not model:

        def step(slots, tokens, cache, scales=None):
            return guide(model.step(slots, model.embed(tokens), cache), cfg_scale if scales is None else scales)

        _allow_recompiles()
        if next(model.parameters()).is_cuda:  # CUDA graphs remove the launch cost (untested here: no GPU)
            compiled = torch.compile(step, dynamic=False, mode="reduce-overhead")
        else:
            # cpp_wrapper: the graph's kernels are called from generated C++, not one Python call each (what a
            # one-token step still spends beyond its kernels: docs/log.md)
            compiled = torch.compile(step, dynamic=False, options={"cpp_wrapper": True})
        _COMPILED[key] = (model, compiled)
    return _COMPILED[key][1]


def compiled_draw():
    """`draw` (warpers, Gumbel noise, argmax) compiled: one fused loop over the vocabulary instead of some
    thirty small tensor operations. A graph per (shape, warpers, seed)."""
    global _DRAW
    if _DRAW is None:
        _allow_recompiles()
        _DRAW = torch.compile(draw, dynamic=False)
    return _DRAW


def _allow_recompiles() -> None:
    # one graph per (rows, bucket): a MuLo-SD or SJD decode meets more than dynamo's default 8, after which
    # it would silently run the rest eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def _features(encoded) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An encoder returns features [B, P, D], or (features, visible [B, P] bool) when some prefix slots are
    padding (a T5 caption shorter than its 120 slots): padding is written but never attended to."""
    if isinstance(encoded, tuple):
        feats, visible = encoded
        return feats, visible.bool()
    return encoded, None
