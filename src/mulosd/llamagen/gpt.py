"""LlamaGen's text-to-image GPT as this project's `Transformer`: the same architecture under other names.

LlamaGen (`autoregressive/models/gpt.py`) is RMSNorm + SwiGLU + 2D RoPE with a caption prefix, as ours, so
its weights load into `Transformer` by renaming, with three settings that reproduce it exactly:
- the SwiGLU width is int(8 * dim / 3) rounded up to a multiple of 256 (`mlp_hidden`);
- its RoPE table gives the 120 caption slots cos = sin = 0, zeroing their queries and keys (`prefix_rope`);
- its caption projection has no biases (ours are loaded as zeros).
The caption prefix is 120 FLAN-T5-XL features (2048 wide); `uncond_embedding` is the learned null condition.
"""

from __future__ import annotations

import torch

from ..ar import TransformerConfig

# name -> (layers, heads, dim), as upstream's GPT_models
GPT_SIZES = {"GPT-B": (12, 12, 768), "GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280), "GPT-XXL": (48, 24, 1536),
             "GPT-XXXL": (48, 40, 2560), "GPT-1B": (22, 32, 2048), "GPT-3B": (24, 32, 3200),
             "GPT-7B": (32, 32, 4096)}
CAPTION_SLOTS, CAPTION_DIM, VOCAB = 120, 2048, 16384


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def gpt_config(size: str | tuple[int, int, int], grid: int, vocab_size: int = VOCAB, prefix: int = CAPTION_SLOTS,
               caption_dim: int = CAPTION_DIM) -> TransformerConfig:
    """The TransformerConfig of a LlamaGen T2I GPT: a size name (GPT-XL) or (layers, heads, dim), and the token
    grid (16 for 256 px, 32 for 512 px with the VQ-16 tokenizer)."""
    if isinstance(size, str):
        if size not in GPT_SIZES:
            raise ValueError(f"unknown LlamaGen GPT size {size!r}; known: {', '.join(GPT_SIZES)}")
        size = GPT_SIZES[size]
    layers, heads, dim = size
    return TransformerConfig(vocab_size=vocab_size, grid=grid, dim=dim, layers=layers, heads=heads, prefix=prefix,
                             cond_dim=caption_dim, mlp_hidden=find_multiple(int(8 * dim / 3), 256),
                             prefix_rope="zero")


def block_renames(layers: int) -> dict[str, str]:
    """upstream key -> ours for the one-to-one tensors of the transformer blocks (LlamaGen's names, which
    Tar's AR-DTok shares); w1 and w3 are concatenated into our gate_up."""
    names = {}
    for i in range(layers):
        up, ours = f"layers.{i}.", f"blocks.{i}."
        names |= {up + "attention.wqkv.weight": ours + "attn.qkv.weight",
                  up + "attention.wo.weight": ours + "attn.out.weight",
                  up + "attention_norm.weight": ours + "attn_norm.weight",
                  up + "ffn_norm.weight": ours + "mlp_norm.weight",
                  up + "feed_forward.w2.weight": ours + "mlp.down.weight"}
    return names


def _renames(layers: int) -> dict[str, str]:
    """upstream key -> ours, for every one-to-one tensor."""
    return {"tok_embeddings.weight": "tok_emb.weight", "norm.weight": "norm.weight", "output.weight": "head.weight",
            "cls_embedding.cap_proj.fc1.weight": "cond_proj.0.weight",
            "cls_embedding.cap_proj.fc2.weight": "cond_proj.2.weight",
            "cls_embedding.uncond_embedding": "null_cond"} | block_renames(layers)


IGNORED = ("freqs_cis", "causal_mask")  # upstream buffers rebuilt at load (and KV caches, when saved warm)


def from_upstream(state: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """An upstream GPT state dict -> ours, every shape checked; a missing, extra or misshapen key is refused
    with its upstream name."""
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()
             if not any(k.endswith(s) or ".kv_cache." in k for s in IGNORED)}
    out, used = {}, set()
    for up, ours in _renames(cfg.layers).items():
        if up not in state:
            raise ValueError(f"LlamaGen GPT checkpoint lacks {up!r}")
        out[ours], _ = state[up], used.add(up)
    for i in range(cfg.layers):
        w1, w3 = f"layers.{i}.feed_forward.w1.weight", f"layers.{i}.feed_forward.w3.weight"
        for k in (w1, w3):
            if k not in state:
                raise ValueError(f"LlamaGen GPT checkpoint lacks {k!r}")
            used.add(k)
        out[f"blocks.{i}.mlp.gate_up.weight"] = torch.cat([state[w1], state[w3]])  # gate (silu) first, then up
    extra = sorted(set(state) - used)
    if extra:
        raise ValueError(f"LlamaGen GPT checkpoint has keys this architecture does not: {extra[:5]}"
                         f"{' ...' if len(extra) > 5 else ''} (wrong size or model type?)")
    dim = cfg.dim
    out["cond_proj.0.bias"] = torch.zeros(dim, dtype=out["cond_proj.0.weight"].dtype)
    out["cond_proj.2.bias"] = torch.zeros(dim, dtype=out["cond_proj.2.weight"].dtype)
    _check_shapes(out, cfg)
    return out


def _check_shapes(out: dict, cfg: TransformerConfig) -> None:
    """Every converted tensor against the shape the config implies; errors name the upstream key."""
    hidden, d = cfg.mlp_hidden, cfg.dim
    want = {"tok_emb.weight": (cfg.vocab_size, d), "head.weight": (cfg.vocab_size, d), "norm.weight": (d,),
            "cond_proj.0.weight": (d, cfg.cond_dim), "cond_proj.2.weight": (d, d),
            "null_cond": (cfg.prefix, cfg.cond_dim)}
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        want |= {b + "attn.qkv.weight": (3 * d, d), b + "attn.out.weight": (d, d), b + "attn_norm.weight": (d,),
                 b + "mlp_norm.weight": (d,), b + "mlp.gate_up.weight": (2 * hidden, d),
                 b + "mlp.down.weight": (d, hidden)}
    upstream = {v: k for k, v in _renames(cfg.layers).items()}
    for key, shape in want.items():
        if tuple(out[key].shape) != shape:
            name = upstream.get(key, key.replace("blocks.", "layers.").replace("mlp.gate_up", "feed_forward.w1/w3"))
            raise ValueError(f"LlamaGen GPT checkpoint: {name!r} has shape {tuple(out[key].shape)}, expected "
                             f"{shape} for {cfg.layers} layers x dim {d}, vocab {cfg.vocab_size}, "
                             f"{cfg.prefix} caption slots of {cfg.cond_dim}")


def to_upstream(state: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """Ours -> upstream layout (the inverse of from_upstream; biases of the caption projection must be zero)."""
    out = {up: state[ours] for up, ours in _renames(cfg.layers).items()}
    for i in range(cfg.layers):
        w1, w3 = state[f"blocks.{i}.mlp.gate_up.weight"].chunk(2)
        out[f"layers.{i}.feed_forward.w1.weight"], out[f"layers.{i}.feed_forward.w3.weight"] = w1, w3
    return out
