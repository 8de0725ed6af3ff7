"""The roofline of a decode step: what one backbone forward must compute and move, against what this machine
(and a GPU, on paper) can do, and what it takes measured.

A forward writing n tokens per row against a cache of S slots, for R rows (the batch, doubled by CFG):
- FLOPs: 2 x R x n x (the block weights + the output head) + 4 x R x n x S x dim x layers (scores and values
  against every slot: the cache is static, the mask hides the empty ones);
- bytes: the weights once, the K/V cache of every row once, the logits out (R x n x vocab x 4).
The limit is the larger of FLOPs / peak matmul throughput and bytes / memory bandwidth; a step far above
it is overhead-bound (per-call and per-operator cost), which is what a compiled step removes.

    python -m mulosd.reports.roofline                  # the zoo's verifier measured, eager and compiled
    python -m mulosd.reports.roofline --no-measure     # the arithmetic only (LlamaGen-XL and Tar shapes too)
"""

from __future__ import annotations

import argparse
import time

import torch

from ..ar import ARBackbone, Transformer, TransformerConfig

# on paper, dense bf16 without sparsity, and HBM bandwidth (vendor data sheets)
GPUS = {"H200": (989e12, 4.8e12), "H100 SXM": (989e12, 3.35e12), "A100 80GB": (312e12, 2.0e12)}


def forward_cost(cfg: TransformerConfig, n: int, rows: int, bytes_per_weight: int = 4) -> tuple[float, float]:
    """(FLOPs, bytes) of one forward writing n tokens in each of `rows` rows against a full static cache."""
    d, S, L = cfg.dim, cfg.slots, cfg.layers
    hidden = cfg.mlp_hidden or 32 * -(-int(cfg.mlp_ratio * d) // 32)
    block = L * (4 * d * d + 3 * d * hidden)  # qkv + out, gate/up + down
    weights = block + cfg.vocab_size * d  # + the head (of the embedding table only n rows are read)
    flops = 2 * rows * n * (block + cfg.vocab_size * d) + 4 * rows * n * S * d * L
    moved = weights * bytes_per_weight + 2 * L * rows * S * d * bytes_per_weight + rows * n * cfg.vocab_size * 4
    return float(flops), float(moved)


def machine(threads: int | None = None) -> dict[str, float]:
    """This machine's measured fp32 matmul throughput (a 1024^3 product) and memory bandwidth (a 256 MB copy)."""
    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    src, dst = torch.empty(64 << 20), torch.empty(64 << 20)
    for _ in range(3):
        a @ b
        dst.copy_(src)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    flops = 10 * 2 * 1024 ** 3 / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    bandwidth = 5 * 2 * src.numel() * 4 / (time.perf_counter() - t)  # read + write
    return {"flops": flops, "bandwidth": bandwidth, "threads": torch.get_num_threads()}


def limit_ms(flops: float, moved: float, peak_flops: float, bandwidth: float) -> float:
    return 1e3 * max(flops / peak_flops, moved / bandwidth)


def measure_step_ms(model: Transformer, encoder, n: int, cfg_scale: float, compile: bool, repeats: int = 200
                    ) -> float:
    """Median ms of one backbone forward writing n tokens into a half-full cache (batch 1), after warm-up."""
    bb = ARBackbone(model, encoder, cfg_scale, compile=compile)
    N = model.cfg.grid ** 2
    bb.start(["a red circle on a gray background"])
    half = torch.arange(N // 2)[None]
    bb(half, torch.zeros_like(half))
    pos = torch.arange(N // 2, min(N // 2 + n, N))[None]
    tok = torch.zeros_like(pos)
    for _ in range(20):
        bb(pos, tok)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        bb(pos, tok)
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[len(times) // 2]


def shapes() -> dict[str, TransformerConfig]:
    """Weight-free configs of the released backbones' verifiers."""
    from ..llamagen.gpt import gpt_config
    from ..tar.ar_dtok import ardtok_config

    tar = {"cls_token_num": 729, "vocab_size": 16384, "cond_dim": 1152}
    return {"LlamaGen-XL 512 px": gpt_config("GPT-XL", 32),
            "Tar AR-DTok-LP 512 px": ardtok_config(tar | {"max_seq_len": 1024}, "llama-abs-LP"),
            "Tar AR-DTok-LP 1024 px": ardtok_config(tar | {"max_seq_len": 4096}, "llama-abs-LP")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthscenes_ar_v2", help="a zoo name or exported AR directory")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-measure", action="store_true", help="arithmetic and the machine's peaks only")
    args = ap.parse_args(argv)
    from ..zoo import load_ar

    m = machine(args.threads)
    print(f"this machine: {m['flops'] / 1e9:.0f} GFLOP/s fp32 matmul, {m['bandwidth'] / 1e9:.1f} GB/s copy, "
          f"{m['threads']} threads")
    model, encoder, meta = load_ar(args.model)
    cfg_scale, N = meta["sample"]["cfg_scale"], model.cfg.grid ** 2
    rows = 2 if cfg_scale != 1 else 1
    print(f"\n{args.model} (batch 1, CFG {cfg_scale}: {rows} rows)\n")
    print("| forward | MFLOP | MB moved | limit ms | eager ms | compiled ms | eager / limit | compiled / limit |")
    print("|---|---|---|---|---|---|---|---|")
    for n, what in ((1, "one-token step"), (N // 4, f"verify {N // 4} tokens")):
        flops, moved = forward_cost(model.cfg, n, rows)
        lim = limit_ms(flops, moved, m["flops"], m["bandwidth"])
        if args.no_measure:
            print(f"| {what} | {flops / 1e6:.1f} | {moved / 1e6:.1f} | {lim:.3f} | | | | |")
            continue
        eager, compiled = (measure_step_ms(model, encoder, n, cfg_scale, c) for c in (False, True))
        print(f"| {what} | {flops / 1e6:.1f} | {moved / 1e6:.1f} | {lim:.3f} | {eager:.3f} | {compiled:.3f} | "
              f"{eager / lim:.1f}x | {compiled / lim:.1f}x |")
    print("\nreleased backbones, weight-free (bf16 weights and cache, batch 1 with CFG), limits on paper\n")
    print("| verifier | forward | GFLOP | GB moved | " + " | ".join(f"{g} ms" for g in GPUS) + " |")
    print("|---|---|---|---|" + "---|" * len(GPUS))
    for name, cfg in shapes().items():
        for n, what in ((1, "one-token step"), (cfg.grid ** 2, "whole-image verification")):
            flops, moved = forward_cost(cfg, n, 2, bytes_per_weight=2)
            lims = " | ".join(f"{limit_ms(flops, moved, f, b):.3f}" for f, b in GPUS.values())
            print(f"| {name} | {what} | {flops / 1e9:.2f} | {moved / 1e9:.2f} | {lims} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
