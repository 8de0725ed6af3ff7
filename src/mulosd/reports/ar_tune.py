"""python -m mulosd.reports.ar_tune --model DIR [--prompt-seed 777] [--n 200] [--cfg 3 5 7 10] [--temperature 1]
                                    [--top-k 0] [--schedule constant linear] [--write]

Chooses an exported AR model's sampling defaults, per size: plain AR with every combination of guidance scale,
guidance schedule, temperature and top-k on a tuning prompt set, one GenEval table per size and the best
combination (ties go to the earlier one in the grid). The tuning set is a world seed of its own: the AR report's
set (the default --prompt-seed of mulosd.reports.ar), the held-out report world (mulosd.eval.REPORT_WORLD) and
the training seed are refused, so that the defaults are never chosen on the prompts they are reported on.
With --write the picks go into the export's config.json as `sample_by_resolution` (which load_ar, infer.py and
the reports read), with the set they were chosen on.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from ..choices import GUIDANCE_SCHEDULES
from ..eval import EVAL_SEED, REPORT_WORLD, TUNING_WORLD, prompt_set
from ..zoo import TOKENIZER, annotate, read_config, resolve
from .ar import evaluate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.ar_tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an exported AR directory or zoo name")
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--prompt-seed", type=int, default=TUNING_WORLD, help="world seed of the tuning prompt set")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--cfg", type=float, nargs="+", default=[3.0, 5.0, 7.0, 10.0])
    ap.add_argument("--temperature", type=float, nargs="+", default=[1.0])
    ap.add_argument("--top-k", type=int, nargs="+", default=[0])
    ap.add_argument("--schedule", nargs="+", choices=GUIDANCE_SCHEDULES, default=["constant"],
                    help="guidance schedules (linear: the scale rises from 1 to 2 CFG - 1 along the raster)")
    ap.add_argument("--sizes", type=int, nargs="+", help="only these of the model's sizes (px)")
    ap.add_argument("--write", action="store_true", help="record the picks in the export's config.json")
    args = ap.parse_args(argv)
    refused = {0: "the training shards'", EVAL_SEED: "the AR report's", REPORT_WORLD: "the held-out report world's"}
    if args.prompt_seed in refused:
        ap.error(f"--prompt-seed {args.prompt_seed} is {refused[args.prompt_seed]} prompt set: tune on another "
                 "world seed")
    if args.n < 1 or args.batch < 1 or min(args.cfg) < 0 or min(args.temperature) <= 0 or min(args.top_k) < 0:
        ap.error("--n and --batch must be >= 1, --cfg and --top-k >= 0, --temperature > 0")
    try:
        path = resolve(args.model)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = read_config(path)
    sizes = meta.get("resolutions") or [meta["resolution"]]
    if args.sizes and not set(args.sizes) <= set(sizes):
        ap.error(f"{args.model} draws at {sizes} px, not at {sorted(set(args.sizes) - set(sizes))}")
    torch.manual_seed(0)
    prompts = prompt_set(args.n, seed=args.prompt_seed)
    grid = list(itertools.product(args.cfg, args.schedule, args.temperature, args.top_k))
    picks = {}
    for px in args.sizes or sizes:
        print(f"\n{path.name} at {px} px, {args.n} prompts of world seed {args.prompt_seed}")
        print("| CFG | schedule | temperature | top-k | GenEval |\n|---|---|---|---|---|")
        best = None
        for cfg_scale, schedule, temperature, top_k in grid:
            sample = {"cfg_scale": cfg_scale, "cfg_schedule": schedule, "temperature": temperature, "top_k": top_k}
            try:
                r = evaluate(str(path), args.tokenizer, prompts, args.batch, latency_prompts=0, progress=False,
                             resolution=px, sample=sample)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            score = r["score"]["geneval"]
            print(f"| {cfg_scale:g} | {schedule} | {temperature:g} | {top_k} | {score:.3f} |", flush=True)
            if best is None or score > best[0]:
                best = (score, sample)
        picks[str(px)] = best[1]
        print(f"best at {px} px: {best[1]} (GenEval {best[0]:.3f})")
    if args.write:
        annotate(path, sample_by_resolution=(meta.get("sample_by_resolution") or {}) | picks,
                 sample_tuned_on={"prompt_seed": args.prompt_seed, "n": args.n})
        print(f"wrote sample_by_resolution to {path / 'config.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
