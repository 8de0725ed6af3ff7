"""python -m mulosd.reports.tokenizer [--tokenizer NAME_OR_DIR] [--n 200] [--seed 4242]

Round-trips held-out SynthScenes (a world seed no training shard uses) through the tokenizer at 32, 64 and
128 px and reports PSNR, LPIPS (AlexNet), codebook usage (share of codes used, perplexity of the code
distribution) and the judge's agreement on the reconstructions (true caption accepted, falsified caption
rejected, as in the judge self-test), next to the same agreement on the original renders.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from tqdm import tqdm

from ..data.images import to_image, to_tensor
from ..data.synthscenes import judge, render, sample_scene, vocab
from ..data.synthscenes.judge import falsify
from ..eval.pixels import psnr
from ..losses import build_lpips
from ..zoo import TOKENIZER, load_tokenizer

HELD_OUT_SEED = 4242  # training shards use world seed 0


def _agreement(image: np.ndarray, scene, wrong) -> list[bool]:
    return [judge(image, scene.prompt).ok, not judge(image, wrong).ok]


@torch.no_grad()
def evaluate(tokenizer, n: int = 200, seed: int = HELD_OUT_SEED, sizes=(32, 64, 128), batch: int = 50,
             progress: bool = True, radius=vocab.RADIUS_RANGE) -> dict:
    lpips = build_lpips("alex")
    scenes = [sample_scene(seed, i, radius=radius) for i in range(n)]
    wrongs = [falsify(s, np.random.default_rng([seed, i, 1])) for i, s in enumerate(scenes)]
    rows = {}
    for size in sizes:
        psnrs, lps, counts, agree, agree_orig = [], [], torch.zeros(tokenizer.codebook_size), [], []
        for start in tqdm(range(0, n, batch), desc=f"{size} px", disable=not progress):
            chunk = scenes[start:start + batch]
            originals = [render(s, size) for s in chunk]
            x = torch.stack([to_tensor(o) for o in originals])
            tokens = tokenizer.encode(x)
            rec = tokenizer.decode(tokens).clamp(-1, 1)
            psnrs.append(psnr(rec, x))
            lps.append(lpips(rec, x).flatten())
            counts += torch.bincount(tokens.flatten(), minlength=tokenizer.codebook_size).float()
            for j, (s, o) in enumerate(zip(chunk, originals, strict=True)):
                agree += _agreement(to_image(rec[j]), s, wrongs[start + j])
                agree_orig += _agreement(o, s, wrongs[start + j])
        p = counts / counts.sum()
        nz = p[p > 0]
        rows[size] = {"psnr": torch.cat(psnrs).mean().item(), "lpips": torch.cat(lps).mean().item(),
                      "usage": (counts > 0).float().mean().item(),
                      "perplexity": torch.exp(-(nz * nz.log()).sum()).item(),
                      "judge": float(np.mean(agree)), "judge_original": float(np.mean(agree_orig))}
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.tokenizer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=TOKENIZER, help="zoo name or exported directory")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=HELD_OUT_SEED)
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--radius", type=float, nargs=2, default=vocab.RADIUS_RANGE, metavar=("LO", "HI"),
                    help="the world's object half-size range (fractions of the image side)")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be >= 1")
    if any(s < 8 or s % 8 for s in args.sizes):
        ap.error("--sizes must be multiples of 8")
    torch.manual_seed(0)
    try:
        tok = load_tokenizer(args.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        rows = evaluate(tok, n=args.n, seed=args.seed, sizes=args.sizes, radius=tuple(args.radius))
    except ValueError as e:  # a radius range that does not fit the world's grid
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"tokenizer {args.tokenizer} on {args.n} held-out scenes (world seed {args.seed}, object radius "
          f"{args.radius[0]:g}-{args.radius[1]:g})")
    print("| size | PSNR dB | LPIPS | codes used | perplexity | judge (round trip) | judge (original) |")
    print("|---|---|---|---|---|---|---|")
    for size, r in rows.items():
        print(f"| {size} | {r['psnr']:.2f} | {r['lpips']:.4f} | {r['usage']:.3f} | {r['perplexity']:.0f} | "
              f"{r['judge']:.3f} | {r['judge_original']:.3f} |")
    print(summary(rows))
    return 0


def summary(rows: dict[int, dict]) -> str:
    """The last line: PSNR, LPIPS and the judge's round trip at each size measured, each named by its size, and
    the codebook's usage at the largest."""
    parts = [f"{k}{size}={r[k]:.{d}f}" for k, d in (("psnr", 2), ("lpips", 4), ("judge", 3))
             for size, r in sorted(rows.items())]
    return f"tokenizer: {' '.join(parts)} usage{max(rows)}={rows[max(rows)]['usage']:.3f}"


if __name__ == "__main__":
    sys.exit(main())
