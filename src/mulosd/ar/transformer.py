"""A LlamaGen-style AR transformer over a VQ token grid: RMSNorm, SwiGLU, 2D RoPE, a condition prefix.

Positions are 2D RoPE by default; `positions="learned"` is Tar's AR-DTok instead: a learned table added to the
input embedding at the absolute slot (prefix included), no rotation, with a one-layer condition projection
(`cond_proj="linear"`, with bias) and zero features as the null condition (`null_cond="zeros"`). Its prefix
length is chosen at run time (`with_prefix(T)`), which shifts the table rows of the image tokens.

Sequence layout (training and decoding alike): `prefix` condition slots, then one slot per grid position in
raster order. Slot P+i holds image token i; the output at a slot predicts the token of the next slot, so the
last prefix slot predicts token 0 and slot P+i predicts token i+1.

A multi-resolution model (`grids`, e.g. (8, 16) for 64 and 128 px) is one set of weights trained on several
grids: each grid has its own 2D RoPE positions and a learned resolution embedding added to the condition
prefix. `at_grid(g)` is the model at grid g, a view sharing every parameter, so one checkpoint serves as
drafter and verifier, each view with its own KV cache.

Two ways to run it:
- `forward(tokens, cond)`: teacher-forced full sequence with causal attention (training, reference logits);
- `step(slots, tokens, cache)`: any set of slots at once against a `KVCache`, whose per-slot `filled` mask
  says which slots are visible context. Plain AR, ZipAR, block verification and island resampling are all
  `step` calls; un-filling a slot removes a discarded draft from every later query's context.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

# The CPU's fused attention reads the keys in blocks of this many slots from slot 0, and a block that every query
# masks adds exactly nothing to its running softmax: a step attends over the blocks up to its last written slot
# alone, bit for bit what the whole cache gives (tests/test_ar.py), and an early step reads a fraction of
# the cache. Elsewhere (CUDA, a compiled graph with its static shapes) the whole cache is read.
CPU_KEY_BLOCK = 512


@dataclass
class TransformerConfig:
    vocab_size: int = 1024
    grid: int = 16  # tokens per side
    dim: int = 256
    layers: int = 8
    heads: int = 8
    prefix: int = 4  # condition slots
    cond_dim: int = 256  # width of the condition encoder's output
    mlp_ratio: float = 8 / 3  # SwiGLU hidden = ratio * dim, rounded up to a multiple of 32
    mlp_hidden: int = 0  # an explicit SwiGLU width instead (LlamaGen rounds to multiples of 256)
    rope_base: float = 10000.0
    # what RoPE does to the condition prefix: "identity" (no rotation), or "zero": LlamaGen's cos = sin = 0,
    # which zeroes the prefix's queries and keys (so prefix slots attend uniformly); needed for its weights
    prefix_rope: str = "identity"
    # position interpolation: a grid wider than this one takes positions in its frame (index * rope_grid / grid),
    # so that a token means the same place in the image at every size; smaller grids keep their own (0: none)
    rope_grid: int = 0
    grids: tuple[int, ...] = ()  # a multi-resolution model's grids (`grid` is the one this instance runs at)
    positions: str = "rope"  # rope | learned: an absolute table over slots (AR-DTok's abs_pe)
    pos_slots: int = 0  # rows of the learned table; 0 = exactly what this prefix and grid need
    cond_proj: str = "mlp"  # mlp: Linear, GELU, Linear (LlamaGen) | linear: one Linear with bias (AR-DTok)
    null_cond: str = "learned"  # the CFG null condition: a learned prefix (LlamaGen) | zeros: zero features

    def __post_init__(self):
        for key, allowed in (("prefix_rope", ("identity", "zero")), ("positions", ("rope", "learned")),
                             ("cond_proj", ("mlp", "linear")), ("null_cond", ("learned", "zeros"))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        if self.positions == "learned":
            self.pos_slots = self.pos_slots or self.slots - 1
            if self.slots - 1 > self.pos_slots:
                raise ValueError(f"a prefix of {self.prefix} and a {self.grid}x{self.grid} grid need "
                                 f"{self.slots - 1} position rows; the table has {self.pos_slots} (prefix at most "
                                 f"{self.pos_slots - self.grid * self.grid + 1})")
        self.grids = tuple(int(g) for g in self.grids)
        if self.rope_grid < 0:
            raise ValueError(f"rope_grid must be >= 0, got {self.rope_grid}")
        if self.grids and self.grid not in self.grids:
            raise ValueError(f"grid {self.grid} is not one of the model's grids {self.grids}")

    @property
    def slots(self) -> int:
        return self.prefix + self.grid * self.grid


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight


def _grid_positions(cfg: TransformerConfig, grid: int) -> list[float]:
    """The RoPE position of each row (and column) of a `grid`-wide grid under cfg."""
    scale = cfg.rope_grid / grid if 0 < cfg.rope_grid < grid else 1.0
    return [i * scale for i in range(grid)]


def rope_2d(cfg: TransformerConfig) -> torch.Tensor:
    """cos/sin [slots, head_dim/2, 2]: half of each head rotates with the row, half with the column.
    Prefix slots get no rotation, or (prefix_rope="zero") LlamaGen's all-zero cos/sin. A grid wider than
    `rope_grid` takes fractional positions in that grid's frame."""
    head_dim = cfg.dim // cfg.heads
    quarter = head_dim // 4
    freqs = 1.0 / cfg.rope_base ** (torch.arange(quarter).float() / quarter)
    g = torch.tensor(_grid_positions(cfg, cfg.grid))
    rows, cols = g.repeat_interleave(cfg.grid), g.repeat(cfg.grid)
    angles = torch.cat([rows[:, None] * freqs, cols[:, None] * freqs], dim=1)  # [N, head_dim/2]
    grid_rope = torch.stack([angles.cos(), angles.sin()], dim=-1)
    prefix = torch.zeros(cfg.prefix, angles.shape[1], 2)
    if cfg.prefix_rope == "identity":
        prefix[..., 0] = 1.0
    return torch.cat([prefix, grid_rope])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x [..., Dh] rotated by rope [..., Dh/2, 2], which broadcasts against it (pairs of adjacent channels); the
    attention rotates its queries and keys in one call."""
    xp = x.float().unflatten(-1, (-1, 2))
    cos, sin = rope[..., 0], rope[..., 1]
    out = torch.stack([xp[..., 0] * cos - xp[..., 1] * sin, xp[..., 0] * sin + xp[..., 1] * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class KVCache:
    """Static keys/values per layer, indexed by absolute slot, and the mask of slots holding context."""

    def __init__(self, cfg: TransformerConfig, batch: int, device=None, dtype=torch.float32):
        shape = (batch, cfg.heads, cfg.slots, cfg.dim // cfg.heads)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.filled = torch.zeros(batch, cfg.slots, dtype=torch.bool, device=device)

    @property
    def batch(self) -> int:
        return self.filled.shape[0]

    def attended(self, layer: int, span: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values over the first `span` slots, in the queries' dtype."""
        return self.k[layer][:, :, :span].to(dtype), self.v[layer][:, :, :span].to(dtype)


@dataclass(frozen=True)
class Packing:
    """A ragged forward: batch row b writes lengths[b] real tokens, padded to a common width n (a padding write
    repeats its row's last one). `valid` [B, n] marks the real writes, `rows` [T] each one's batch row, and
    `spread` [B, n] the packed index of each padded write (a pad: its row's last real write)."""

    valid: torch.Tensor
    rows: torch.Tensor
    spread: torch.Tensor

    @classmethod
    def of(cls, lengths: torch.Tensor, n: int) -> Packing | None:
        """The packing of writes with these lengths [B] at width n; None where nothing is padding."""
        lengths = lengths.to(torch.long)
        if bool((lengths >= n).all()):
            return None
        cols = torch.arange(n, device=lengths.device)
        valid = cols[None] < lengths[:, None]
        first = lengths.cumsum(0) - lengths  # each row's first packed index
        spread = first[:, None] + torch.minimum(cols[None], lengths[:, None] - 1)
        return cls(valid, valid.nonzero()[:, 0], spread)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, rope, layer: int | None = None, cache: KVCache | None = None, slots=None, mask=None,
                packing: Packing | None = None):
        """`mask` [B, 1, n, span]: the cache slots the step may attend to (Transformer._span)."""
        if packing is not None:
            return self.packed(x, rope, layer, cache, slots, mask, packing)
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)  # [3, B, H, n, Dh]
        (q, k), v = (qkv[:2] if rope is None else apply_rope(qkv[:2], rope)), qkv[2]
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            b = torch.arange(x.shape[0], device=x.device)[:, None]
            cache.k[layer][b, :, slots] = k.transpose(1, 2).to(cache.k[layer].dtype)
            cache.v[layer][b, :, slots] = v.transpose(1, 2).to(cache.v[layer].dtype)
            y = F.scaled_dot_product_attention(q, *cache.attended(layer, mask.shape[-1], q.dtype), attn_mask=mask)
        return self.out(y.transpose(1, 2).flatten(2))

    def packed(self, x, rope, layer: int, cache: KVCache, slots, mask, packing: Packing):
        """x [T, dim]: the real writes of a ragged forward, packed. Projections run on those alone; only the
        attention over the cache, per batch row, sees them padded (the pad queries' outputs are dropped)."""
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, -1))  # [T, 3, H, Dh]
        (q, k), v = (qkv[:, :2] if rope is None else apply_rope(qkv[:, :2], rope[:, None])).unbind(1), qkv[:, 2]
        rows, at = packing.rows, slots[packing.valid]
        cache.k[layer][rows, :, at] = k.to(cache.k[layer].dtype)
        cache.v[layer][rows, :, at] = v.to(cache.v[layer].dtype)
        padded = q.new_zeros(*packing.valid.shape, *q.shape[1:])
        padded[packing.valid] = q
        y = F.scaled_dot_product_attention(padded.transpose(1, 2), *cache.attended(layer, mask.shape[-1], q.dtype),
                                           attn_mask=mask)
        return self.out(y.transpose(1, 2)[packing.valid].flatten(1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        hidden = cfg.mlp_hidden or 32 * math.ceil(cfg.mlp_ratio * cfg.dim / 32)
        self.gate_up = nn.Linear(cfg.dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim), SwiGLU(cfg)

    def forward(self, x, rope, **cache_args):
        x = x + self.attn(self.attn_norm(x), rope, **cache_args)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        if cfg.cond_proj == "mlp":
            self.cond_proj = nn.Sequential(nn.Linear(cfg.cond_dim, cfg.dim), nn.GELU(approximate="tanh"),
                                           nn.Linear(cfg.dim, cfg.dim))
        else:
            self.cond_proj = nn.Linear(cfg.cond_dim, cfg.dim)
        # the learned null condition for classifier-free guidance, in the encoder's output space
        self.null_cond = (nn.Parameter(torch.randn(cfg.prefix, cfg.cond_dim) / math.sqrt(cfg.cond_dim))
                          if cfg.null_cond == "learned" else None)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # one learned vector per grid, added to the prefix: the model knows which resolution it draws
        self.res_emb = nn.Embedding(len(cfg.grids), cfg.dim) if cfg.grids else None
        if cfg.positions == "rope":
            self.register_buffer("rope", rope_2d(cfg), persistent=False)
            self.abs_pe = None
        else:
            self.rope = None
            self.abs_pe = nn.Parameter(torch.randn(1, cfg.pos_slots, cfg.dim) * 0.02)
        self.apply(self._init)

    def to_config(self) -> dict:
        """What an export's config.json records; `from_config` rebuilds the architecture from it."""
        return asdict(self.cfg)

    @classmethod
    def from_config(cls, config: dict) -> Transformer:
        return cls(TransformerConfig(**config))

    @torch.no_grad()
    def load_grown(self, other: Transformer) -> None:
        """Copy every tensor of `other`, a model of this architecture with as many or fewer layers and as many or
        fewer grids, so that this model computes what `other` computes on every grid `other` has. Growing in
        depth, each block of `other` is copied into a run of consecutive blocks (the runs as even as the counts
        allow); the copies after the first start with their residual output projections at zero, which makes
        them the identity until training moves them, while their inputs' weights start where the trained
        block's are rather than from noise. Growing in grids (a multi-resolution model from one over fewer
        grids, or from a single-grid model), a new grid's resolution embedding starts as the nearest old grid's
        (zero from a single-grid model, which has none): the new view starts as the model at its nearest size."""
        skip = ("grid", "grids", "layers", "rope_grid")
        theirs, ours = ({k: v for k, v in m.to_config().items() if k not in skip} for m in (other, self))
        changed = [f"{k}: {theirs[k]} there, {ours[k]} here" for k in ours if theirs.get(k) != ours[k]]
        their_grids = other.cfg.grids or (other.cfg.grid,)
        if self.cfg.positions == "rope" and any(_grid_positions(self.cfg, g) != _grid_positions(other.cfg, g)
                                                 for g in their_grids):
            changed.append(f"rope_grid: {other.cfg.rope_grid} there, {self.cfg.rope_grid} here (it moves the "
                           "positions of a grid the model was trained on)")
        if other.cfg.layers > self.cfg.layers:
            changed.append(f"layers: {other.cfg.layers} there, {self.cfg.layers} here (it can only grow)")
        if self.cfg.grids and not set(their_grids) <= set(self.cfg.grids) or not self.cfg.grids and other.cfg.grids:
            changed.append(f"grids: {their_grids} there, {self.cfg.grids or (self.cfg.grid,)} here (they can only "
                           "grow)")
        if changed:
            raise ValueError(f"another architecture ({', '.join(changed)})")
        src = [j * other.cfg.layers // self.cfg.layers for j in range(self.cfg.layers)]
        state = {k: v for k, v in other.state_dict().items() if not k.startswith(("blocks.", "res_emb."))}
        for j, i in enumerate(src):
            state |= {f"blocks.{j}.{k}": v for k, v in other.blocks[i].state_dict().items()}
        if self.res_emb is not None:
            state["res_emb.weight"] = torch.stack([self._grown_res_emb(other, g) for g in self.cfg.grids])
        self.load_state_dict(state)
        for j in range(1, self.cfg.layers):
            if src[j] == src[j - 1]:
                self.blocks[j].attn.out.weight.zero_()
                self.blocks[j].mlp.down.weight.zero_()

    def _grown_res_emb(self, other: Transformer, grid: int) -> torch.Tensor:
        """Grid `grid`'s resolution embedding taken from `other`: its own row, else the row of other's nearest
        grid (by ratio; the larger on a tie), or zero where `other` has no resolution embedding."""
        if other.res_emb is None:
            return torch.zeros(self.cfg.dim, dtype=self.res_emb.weight.dtype)
        nearest = min(other.cfg.grids, key=lambda g: (abs(math.log(g / grid)), -g))
        return other.res_emb.weight[other.cfg.grids.index(nearest)].detach()

    def at_grid(self, grid: int) -> Transformer:
        """This multi-resolution model at another of its grids: shares every parameter, own positions."""
        if grid == self.cfg.grid:
            return self
        if grid not in self.cfg.grids:
            raise ValueError(f"the model was trained on grids {self.cfg.grids or (self.cfg.grid,)}, not {grid}")
        return self._view(grid=grid)

    def with_prefix(self, prefix: int) -> Transformer:
        """A learned-position model (AR-DTok) with another prefix length: shares every parameter; the image
        tokens move to the table rows after the new prefix. Refused when the table is too short for it."""
        if self.cfg.positions != "learned":
            raise ValueError("only a model with learned positions takes a prefix length at run time")
        return self if prefix == self.cfg.prefix else self._view(prefix=prefix)

    def _view(self, **changes) -> Transformer:
        view = copy.copy(self)
        view._buffers = dict(self._buffers)  # the parameter and module dicts stay shared
        view.cfg = replace(self.cfg, **changes)
        if view.rope is not None:
            view.rope = rope_2d(view.cfg).to(self.rope.device)
        return view

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def condition(self, cond: torch.Tensor | None, batch: int, drop: torch.Tensor | None = None) -> torch.Tensor:
        """Prefix embeddings [B, P, dim] from encoder features [B, P, cond_dim]; None = the null condition;
        rows where `drop` [B] is true get the null condition (caption dropout in training)."""
        if self.null_cond is None:  # zero features (after the projection: its bias at every slot)
            w = next(self.cond_proj.parameters())
            null = torch.zeros(batch, self.cfg.prefix, self.cfg.cond_dim, device=w.device, dtype=w.dtype)
        else:
            null = self.null_cond.expand(batch, -1, -1)
        if cond is None:
            cond = null
        elif drop is not None:
            cond = torch.where(drop[:, None, None], null.to(cond.dtype), cond)
        prefix = self.cond_proj(cond)
        if self.res_emb is not None:
            prefix = prefix + self.res_emb.weight[self.cfg.grids.index(self.cfg.grid)]
        return prefix

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor | None, drop: torch.Tensor | None = None):
        """Teacher forcing: tokens [B, N] (raster) -> logits [B, N, V], logits[:, i] predicting token i."""
        B, N = tokens.shape
        x = torch.cat([self.condition(cond, B, drop), self.tok_emb(tokens[:, :-1])], dim=1)
        rope = None
        if self.abs_pe is not None:
            x = x + self.abs_pe[:, :x.shape[1]]
        else:
            rope = self.rope[None, None, :x.shape[1]]
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.norm(x[:, self.cfg.prefix - 1:]))

    def step(self, slots: torch.Tensor, x: torch.Tensor, cache: KVCache, fill: torch.Tensor | None = None,
             groups: torch.Tensor | None = None, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Write inputs x [B, n, dim] at absolute slots [B, n] into the cache and return the logits
        [B, n, V] at those slots. A slot attends to itself and to the filled slots before it. `fill` [B, n]
        bool says which written slots become context (default all; padding of a T5 prefix does not).
        `groups` [n] (or [B, n]) makes several draft windows one forward: a write of group g >= 0 does not see
        this call's writes of other groups, and a write of group -1 (a shared one, e.g. a committed token
        rewritten) sees none of the groups' writes; every write sees the cache as it was. `lengths` [B]: row
        b's writes after its first lengths[b] are padding (each repeats the row's last real write); the
        projections and the MLPs then run on the real writes alone (`Packing`), and a pad's logits are its
        row's last real write's."""
        cache.filled.scatter_(1, slots, True if fill is None else fill)
        span = self._span(slots)  # the slots any query may attend to: none after the last written one
        key = torch.arange(span, device=slots.device)[None, None, :]
        # the diagonal keeps a padding slot's query from a fully masked row (NaN on some SDPA backends)
        mask = (key <= slots[:, :, None]) & cache.filled[:, None, :span] | (key == slots[:, :, None])  # [B, n, span]
        if groups is not None:
            groups = groups.to(slots.device).expand_as(slots)
            written = torch.full((slots.shape[0], span), -1, dtype=torch.long, device=slots.device).scatter(
                1, slots, groups)  # [B, span]: each slot's group in this call
            hidden = (written[:, None, :] >= 0) & (written[:, None, :] != groups[:, :, None])
            mask = mask & ~hidden | (key == slots[:, :, None])
        if slots.device.type == "cpu":  # the CPU attention makes a boolean mask additive in every layer: once here
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        mask = mask[:, None]
        rope = None
        if self.abs_pe is not None:
            # the last grid slot has no row when the prefix is the longest the table allows; only a no-op
            # rewrite ever writes it (nothing reads the output after the last token), so its row is clamped
            x = x + self.abs_pe[0, slots.clamp(max=self.cfg.pos_slots - 1)]
        else:
            rope = self.rope[slots][:, None]
        packing = None if lengths is None else Packing.of(lengths.to(slots.device), slots.shape[1])
        if packing is not None:  # [B, n, ...] -> the real writes [T, ...]; rope [T, 1, Dh/2, 2]
            x = x[packing.valid]
            rope = None if rope is None else rope[:, 0][packing.valid][:, None]
        for i, block in enumerate(self.blocks):
            x = block(x, rope, layer=i, cache=cache, slots=slots, mask=mask, packing=packing)
        logits = self.head(self.norm(x))
        return logits if packing is None else logits[packing.spread]

    def _span(self, slots: torch.Tensor) -> int:
        """How many cache slots a step writing `slots` attends over: on the CPU, eager, the key blocks up to the
        last written slot (CPU_KEY_BLOCK); the whole cache elsewhere."""
        if slots.device.type != "cpu" or torch.compiler.is_compiling() or slots.numel() == 0:
            return self.cfg.slots
        return min(self.cfg.slots, -(-(int(slots.max()) + 1) // CPU_KEY_BLOCK) * CPU_KEY_BLOCK)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(tokens)
