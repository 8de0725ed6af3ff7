"""Tar's AR-DTok de-tokenizers as this project's `Transformer`.

AR-DTok (`tok/ar_dtok/ar_model.py` upstream) is LlamaGen's block stack with three differences, each a
`TransformerConfig` setting: learned absolute positions over slots (`positions="learned"`, the `abs_pe` table),
a one-layer condition projection with bias (`cond_proj="linear"`, upstream's `clip_proj`), and all-zero
features as the CFG null condition (`null_cond="zeros"`). The prefix is the TA-Tok feature sequence, whose
length the caller picks at run time (729, 169 or 81 tokens); the checkpoint's `cls_token_num` bounds it.

Upstream's files hold `{"model": {"name", "args", "sd"}}` (optionally `ema_sd`); the size name gives layers,
heads and width. Upstream drops an `abs_pe` of the wrong shape and loads non-strictly; this loader refuses any
missing, extra or misshapen key, naming it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..ar import Transformer, TransformerConfig
from ..llamagen.checkpoints import read_spec
from ..llamagen.gpt import block_renames, find_multiple

# size name -> (layers, heads, dim), as upstream's ar_models
SIZES = {"llama-abs-S": (12, 6, 384), "llama-abs-B": (12, 12, 768), "llama-abs-L": (24, 16, 1024),
         "llama-abs-LP": (30, 20, 1280), "llama-abs-XL": (36, 20, 1280), "llama-abs-XXL": (48, 24, 1536),
         "llama-abs-XXXL": (48, 40, 2560)}
# upstream's released files: output size -> file (their grids are 16, 32 and 64 VQ-16 tokens per side)
FILES = {256: "ar_dtok_lp_256px.pth", 512: "ar_dtok_lp_512px.pth", 1024: "ar_dtok_lp_1024px.pth"}
FEATURE_DIM, VOCAB, MAX_PREFIX = 1152, 16384, 729  # SigLIP2-so400m width, VQ-16 codes, TA-Tok's 27 x 27
PREFIXES = {0: 729, 1: 169, 2: 81}  # the LLM's <S{scale}> -> TA-Tok tokens (27², 13², 9²)
RENAMES = {"tok_embeddings.weight": "tok_emb.weight", "norm.weight": "norm.weight", "output.weight": "head.weight",
           "clip_proj.weight": "cond_proj.weight", "clip_proj.bias": "cond_proj.bias", "abs_pe": "abs_pe"}


def ardtok_config(args: dict, size: str | tuple[int, int, int], prefix: int | None = None) -> TransformerConfig:
    """The TransformerConfig of an AR-DTok from its saved ModelArgs (`max_seq_len`, `cls_token_num`,
    `vocab_size`, `cond_dim`) and size (a name or (layers, heads, dim)); `prefix`: the run-time feature length
    (default: the checkpoint's cls_token_num)."""
    if isinstance(size, str):
        if size not in SIZES:
            raise ValueError(f"unknown AR-DTok size {size!r}; known: {', '.join(SIZES)}")
        size = SIZES[size]
    layers, heads, dim = size
    for key in ("max_seq_len", "cls_token_num", "vocab_size", "cond_dim"):
        if key not in args:
            raise ValueError(f"AR-DTok checkpoint args lack {key!r}")
    if args.get("model_type", "clip_cond") != "clip_cond":
        raise ValueError(f"AR-DTok checkpoint is a {args['model_type']!r} model, not clip_cond (TA-Tok features)")
    grid = round(args["max_seq_len"] ** 0.5)
    if grid * grid != args["max_seq_len"]:
        raise ValueError(f"AR-DTok max_seq_len {args['max_seq_len']} is not a square token grid")
    hidden = find_multiple(int(2 * 4 * dim / 3), args.get("multiple_of", 256))
    cls = args["cls_token_num"]
    return TransformerConfig(vocab_size=args["vocab_size"], grid=grid, dim=dim, layers=layers, heads=heads,
                             prefix=cls if prefix is None else prefix, cond_dim=args["cond_dim"], mlp_hidden=hidden,
                             positions="learned", pos_slots=args["max_seq_len"] + cls - 1, cond_proj="linear",
                             null_cond="zeros")


def from_upstream(state: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """An upstream AR-DTok state dict -> ours; a missing, extra or misshapen key is refused by its upstream name."""
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()
             if ".kv_cache." not in k and k != "causal_mask"}
    renames = RENAMES | block_renames(cfg.layers)
    gates = {f"blocks.{i}.mlp.gate_up.weight": (f"layers.{i}.feed_forward.w1.weight",
                                                f"layers.{i}.feed_forward.w3.weight") for i in range(cfg.layers)}
    needed = list(renames) + [k for pair in gates.values() for k in pair]
    missing = [k for k in needed if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"AR-DTok checkpoint lacks {missing[0]!r}{more}")
    extra = sorted(set(state) - set(needed))
    if extra:
        raise ValueError(f"AR-DTok checkpoint has keys this architecture does not: {extra[:5]}"
                         f"{' ...' if len(extra) > 5 else ''} (wrong size or model type?)")
    out = {ours: state[up] for up, ours in renames.items()}
    out |= {k: torch.cat([state[w1], state[w3]]) for k, (w1, w3) in gates.items()}  # gate (silu) first, then up
    d, hidden, V = cfg.dim, cfg.mlp_hidden, cfg.vocab_size
    want = {"tok_emb.weight": (V, d), "head.weight": (V, d), "norm.weight": (d,), "cond_proj.weight": (d, cfg.cond_dim),
            "cond_proj.bias": (d,), "abs_pe": (1, cfg.pos_slots, d)}
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        want |= {b + "attn.qkv.weight": (3 * d, d), b + "attn.out.weight": (d, d), b + "attn_norm.weight": (d,),
                 b + "mlp_norm.weight": (d,), b + "mlp.gate_up.weight": (2 * hidden, d),
                 b + "mlp.down.weight": (d, hidden)}
    upstream = {v: k for k, v in renames.items()} | {k: w1.replace("w1", "w1/w3") for k, (w1, _) in gates.items()}
    for key, shape in want.items():
        if tuple(out[key].shape) != shape:
            raise ValueError(f"AR-DTok checkpoint: {upstream[key]!r} has shape {tuple(out[key].shape)}, expected "
                             f"{shape} for {cfg.layers} layers x dim {d}, vocab {V}, {cfg.pos_slots} position rows")
    return out


def read_ardtok(path: Path) -> tuple[dict, str, dict[str, torch.Tensor]]:
    """(args, size name, state dict) of an upstream AR-DTok file, read weights-only (a pickled object that is
    not a tensor or a plain container is refused, never run)."""
    spec = read_spec(path, {"name", "args", "sd"}, "an AR-DTok checkpoint")
    return dict(spec["args"]), spec["name"], spec["sd"]


def load_ardtok(path: Path, prefix: int | None = None, sizes: dict | None = None) -> Transformer:
    """An upstream AR-DTok file as a Transformer at run-time prefix length `prefix` (eval mode, fp32).
    `sizes` adds size names (the tests' tiny ones)."""
    args, name, state = read_ardtok(Path(path))
    size = (sizes or {}).get(name, name)
    cfg = ardtok_config(args, size, prefix)
    model = Transformer(cfg)
    model.load_state_dict(from_upstream(state, cfg))
    return model.eval()
