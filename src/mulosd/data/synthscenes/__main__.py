"""python -m mulosd.data.synthscenes {preview, judge-selftest, shards} ..."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import caption_text, render, sample_scene, vocab
from .judge import selftest
from .shards import VAL_FIRST_INDEX, write_split


def _preview(args) -> None:
    from ...viz import captioned_grid

    scenes = [sample_scene(args.seed, i, radius=args.radius) for i in range(args.n)]
    images = [render(s, args.size) for s in scenes]
    captions = [f"[{s.prompt.category}] {caption_text(s.prompt)}" for s in scenes]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    captioned_grid(images, captions, cols=args.cols).save(out)
    print(f"wrote {out} ({args.n} scenes at {args.size} px, seed {args.seed})")


def _judge_selftest(args) -> None:
    result = selftest(args.n, seed=args.seed, progress=True, radius=args.radius)
    cats = sorted({c for row in result.table.values() for c in row if c != "all"})
    print(f"judge self-test on {args.n} scenes (true and falsified caption each)")
    print("| size | render | " + " | ".join(cats) + " | all |")
    print("|---|---|" + "---|" * (len(cats) + 1))
    for (size, kind), row in result.table.items():
        print(f"| {size} | {kind} | " + " | ".join(f"{row[c]:.3f}" for c in cats) + f" | {row['all']:.3f} |")
    print(f"judge agreement: {result.agreement(128, 'clean'):.3f}")


def _shards(args) -> None:
    for split, n, first in (("train", args.num_shards, 0), ("val", args.val_shards, VAL_FIRST_INDEX)):
        if n:
            paths = write_split(Path(args.out), split, n, args.per_shard, args.size, args.seed, first_index=first,
                                image_format=args.format, radius=args.radius)
            print(f"{split}: {len(paths)} shards x {args.per_shard} samples in {args.out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mulosd.data.synthscenes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preview", help="a labelled grid of scenes and their captions")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--cols", type=int, default=4)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_preview)
    p = sub.add_parser("judge-selftest", help="judge agreement with ground truth per category and size")
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--seed", type=int, default=12345)
    p.set_defaults(fn=_judge_selftest)
    p = sub.add_parser("shards", help="write webdataset shards (image, .txt caption, .json metadata)")
    p.add_argument("--out", required=True)
    p.add_argument("--num-shards", type=int, required=True)
    p.add_argument("--val-shards", type=int, default=0)
    p.add_argument("--per-shard", type=int, default=256)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("png", "jpg"), default="png")
    p.set_defaults(fn=_shards)
    for p in sub.choices.values():
        p.add_argument("--radius", type=float, nargs=2, default=vocab.RADIUS_RANGE, metavar=("LO", "HI"),
                       help="object half-size range as fractions of the image side (the world's geometry)")
    args = parser.parse_args(argv)
    hi = vocab.MAX_RADIUS
    if not 0 < args.radius[0] <= args.radius[1] <= hi:
        parser.error(f"--radius must be LO HI with 0 < LO <= HI <= {hi:.4f} (an object stays in its cell)")
    for name in ("n", "size", "per_shard", "num_shards"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
