"""python -m mulosd.reports.samplers [--n 200] [--size 128] [--ratios 2 4] [--dir zoo] [--tokenizer NAME]

The paper's ablation (a) on held-out SynthScenes at 128 px (`--size 256`: at the grids of the zoo's 256 px verifier
and its drafters, 16 x 16 -> 32 x 32 at r = 2, with the samplers trained there): for each up-sampler loss stage and
for the pixel-space path, at r = 2 and 4, the up-sampled drafts of VQ(low-res image) against VQ(high-res image):
token accuracy, PSNR and LPIPS of the decoded draft against the high-res image, FD-VGG of the drafts against the
high-res images as a set (what the PatchGAN stage optimises; 200 images bias it, so compare rows, not other tables),
and the judge's agreement on the decoded draft (true caption accepted, a minimally falsified one rejected).
`VQ(high)` is the ceiling (the tokenizer's own round trip), and D_r's row its accuracy against VQ(low-res image).
Samplers are read from DIR by their zoo names (mulosd.zoo.sampler_name: synthscenes_up{r}_{stage} and
synthscenes_down{r} at 128 px, synthscenes256_up{r}_{stage} and synthscenes256_down{r} at 256 px), and the pixel
path's trained SR network synthscenes_sr{r} (experiment=pixel_sr, trained at 128 px).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..choices import SAMPLER_STAGES
from ..data.images import downsample, to_image, to_tensor
from ..data.synthscenes import judge, render, sample_scene, vocab
from ..data.synthscenes.judge import falsify
from ..eval import EVAL_SEED
from ..eval.fd import frechet_distance, vgg_features
from ..eval.pixels import psnr
from ..losses import build_lpips
from ..paths import ZOO
from ..samplers.pixel import PixelUpsampler
from ..zoo import (
    SAMPLER_SIZE,
    TOKENIZER,
    load_sampler,
    load_sr,
    load_tokenizer,
    read_config,
    sampler_name,
    world_radius,
)
from . import publish

STAGES = SAMPLER_STAGES
SIZE = SAMPLER_SIZE  # the high-res side the zoo's first samplers were trained at


def sr_name(r: int) -> str:
    return f"synthscenes_sr{r}"


@torch.no_grad()
def evaluate(tokenizer, directory: Path, tokenizer_name, n: int = 200, ratios=(2, 4), batch: int = 50,
             radius: tuple[float, float] = vocab.RADIUS_RANGE, size: int = SIZE, trained_at: int | None = None) -> dict:
    """`trained_at`: read the samplers trained for a verifier of that size (default: `size`), e.g. zoo v2's 128 px
    samplers run on the 256 px grids."""
    trained_at = trained_at or size
    lpips = build_lpips("alex")
    scenes = [sample_scene(EVAL_SEED, i, radius=radius) for i in range(n)]
    wrongs = [falsify(s, np.random.default_rng([EVAL_SEED, i, 1])) for i, s in enumerate(scenes)]
    highs = [render(s, size) for s in scenes]
    reference = vgg_features(highs)
    out = {}
    for r in ratios:
        methods = {"VQ(high) (ceiling)": None, "pixel bicubic": PixelUpsampler(tokenizer, r, "bicubic"),
                   "pixel lanczos": PixelUpsampler(tokenizer, r, "lanczos")}
        sr = directory / sr_name(r)
        methods["pixel SR (trained)"] = PixelUpsampler(tokenizer, r, load_sr(sr, r)) if sr.is_dir() else "missing"
        for stage in STAGES:
            path = directory / sampler_name(r, stage, trained_at)
            methods[f"latent {stage}"] = load_sampler(path, tokenizer_name)[0] if path.is_dir() else "missing"
        rows = {}
        for name, method in tqdm(methods.items(), desc=f"samplers r={r}", unit="method", file=sys.stderr):
            if method == "missing":
                rows[name] = None
                continue
            acc, ps, lp, agree, drafts = [], [], [], [], []
            for start in range(0, n, batch):
                x = torch.stack([to_tensor(h) for h in highs[start:start + batch]])
                low = torch.stack([to_tensor(downsample(h, r)) for h in highs[start:start + batch]])
                target = tokenizer.encode(x)
                pred = target if method is None else method.up(tokenizer.encode(low))
                draft = tokenizer.decode(pred).clamp(-1, 1)
                acc.append((pred == target).float().flatten(1).mean(1))
                ps.append(psnr(draft, x))
                lp.append(lpips(draft, x).flatten())
                for j in range(len(pred)):
                    s, w = scenes[start + j], wrongs[start + j]
                    image = to_image(draft[j])
                    drafts.append(image)
                    agree += [judge(image, s.prompt).ok, not judge(image, w).ok]
            rows[name] = {"acc": torch.cat(acc).mean().item(), "psnr": torch.cat(ps).mean().item(),
                          "lpips": torch.cat(lp).mean().item(), "fd": frechet_distance(vgg_features(drafts), reference),
                          "judge": float(np.mean(agree))}
        down = directory / sampler_name(r, size=trained_at)
        if down.is_dir():
            d = load_sampler(down, tokenizer_name)[0]
            hits = []
            for start in range(0, n, batch):
                x = torch.stack([to_tensor(h) for h in highs[start:start + batch]])
                low = torch.stack([to_tensor(downsample(h, r)) for h in highs[start:start + batch]])
                hits.append((d.down(tokenizer.encode(x)) == tokenizer.encode(low)).float().flatten(1).mean(1))
            rows["D_r down-sampler"] = {"acc": torch.cat(hits).mean().item()}
        out[r] = rows
    return out


def table(results: dict, n: int, radius: tuple[float, float], size: int = SIZE) -> str:
    lines = [f"Up-sampled drafts on {n} held-out SynthScenes at {size} px (world seed {EVAL_SEED}; object half-size "
             f"{radius[0]:g}-{radius[1]:g} of the image side)", "",
             "| r | method | token acc vs VQ(high) | PSNR dB | LPIPS | FD-VGG | judge agreement |",
             "|---|---|---|---|---|---|---|"]
    for r, rows in results.items():
        for name, m in rows.items():
            if m is None:
                lines.append(f"| {r} | {name} | not trained | | | | |")
                continue
            cells = [f"{m['acc']:.3f}"] + [f"{m[k]:.{p}f}" if k in m else "" for k, p in
                                           (("psnr", 2), ("lpips", 4), ("fd", 2), ("judge", 3))]
            lines.append(f"| {r} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_line(results: dict, size: int = SIZE) -> str:
    def get(r, stage, key):
        m = results.get(r, {}).get(f"latent {stage}")
        return m[key] if m else math.nan

    return (f"samplers: size={size} r2_ce_acc={get(2, 'token_ce', 'acc'):.3f} "
            f"r2_gan_lpips={get(2, 'gan', 'lpips'):.4f} r4_ce_acc={get(4, 'token_ce', 'acc'):.3f} "
            f"r4_gan_lpips={get(4, 'gan', 'lpips'):.4f}")


# each loss stage against Lanczos at what it optimises: (key, "higher" or "lower" is better, digits)
MEASURES = {"token_ce": [("acc", "higher", 3)], "mse_lpips": [("lpips", "lower", 4), ("psnr", "higher", 2)],
            "gan": [("fd", "lower", 2)]}


def against_lanczos(results: dict) -> list[str]:
    """One line per trained stage: ahead of (or behind) Lanczos at each measure its loss optimises."""
    lines = []
    for r, rows in results.items():
        lanczos = rows.get("pixel lanczos")
        for stage, measures in MEASURES.items():
            m = rows.get(f"latent {stage}")
            if not m or not lanczos:
                continue
            parts, ahead = [], True
            for key, better, digits in measures:
                wins = m[key] > lanczos[key] if better == "higher" else m[key] < lanczos[key]
                ahead &= wins
                parts.append(f"{key} {m[key]:.{digits}f} vs {lanczos[key]:.{digits}f}")
            lines.append(f"r={r} {stage}: {'ahead of' if ahead else 'behind'} lanczos ({', '.join(parts)})")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.samplers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--size", type=int, default=SIZE, help="the high-res side in px (128: 16 x 16 tokens)")
    ap.add_argument("--ratios", type=int, nargs="+", default=[2, 4], metavar="R",
                    help="the values of r to measure (each about 20 min at 256 px on 2 cores)")
    ap.add_argument("--dir", type=Path, default=ZOO, help="where the samplers live (zoo names)")
    ap.add_argument("--trained-at", type=int, metavar="PX",
                    help="the samplers trained for a verifier of this size (default: --size), e.g. --size 256 "
                         "--trained-at 128: zoo v2's samplers on the 256 px grids")
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--out", type=Path, help="also write the table to this markdown file")
    ap.add_argument("--radius", type=float, nargs=2, metavar=("LO", "HI"),
                    help="the world's object half-size range the held-out scenes are drawn in (default: the world "
                         "the r=2 token-CE up-sampler was trained on)")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be >= 1")
    if any(r not in (2, 4) for r in args.ratios):
        ap.error(f"--ratios: the samplers exist for r = 2 and 4, got {args.ratios}")
    if args.size % 32:
        ap.error(f"--size must be a multiple of 32 (the tokenizer's 8 px cells at r = 4), got {args.size}")
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        first = args.dir / sampler_name(args.ratios[0], "token_ce", args.trained_at or args.size)
        radius = tuple(args.radius) if args.radius else world_radius(read_config(first) if first.is_dir() else {})
        results = evaluate(tokenizer, args.dir, args.tokenizer, n=args.n, ratios=tuple(args.ratios), radius=radius,
                           size=args.size, trained_at=args.trained_at)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    publish("\n".join([table(results, args.n, radius, args.size), "", *against_lanczos(results)]),
            summary_line(results, args.size), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
