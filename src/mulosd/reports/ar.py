"""python -m mulosd.reports.ar [--n 200] [--batch 25] [--models synthscenes_ar_v2,synthscenes_ar_v3]

Plain AR sampling with classifier-free guidance (each model's recorded defaults) on the fixed held-out prompt
set, at every resolution (a multi-resolution model at each of its sizes, as NAME@PX): SynthScenes-GenEval
(per category and averaged), per-token latency at batch 1 (the sequential step a speculative decoder saves)
and batched throughput, on this machine's CPU. With --fd also FD-VGG against the world's own renders of the
same prompts at the model's size (in the world geometry --radius). The last line gives GenEval per size, each
from the first model measured at it (by default: zoo v2 at 64 and 128 px, zoo v3 at 256 px; v3's 128 and 64 px
views, its drafters, are rows of the table).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from tqdm import tqdm

from ..ar import ARBackbone, Warpers
from ..choices import GUIDANCE_SCHEDULES
from ..data.synthscenes.vocab import CATEGORIES
from ..decoding.ar import decode_ar
from ..eval import EVAL_SEED, geneval_score, prompt_set, reference_renders
from ..tokenizer import tokens_to_images
from ..zoo import TOKENIZER, check_same_tokenizer, load_ar, load_tokenizer, read_config, world_radius

MODELS = ("synthscenes_ar_v2", "synthscenes_ar_v3")


def evaluate(model_name: str, tokenizer_name: str, prompts: list[str], batch: int, latency_prompts: int = 4,
             progress: bool = True, resolution: int | None = None, fd_radius: tuple[float, float] | None = None,
             sample: dict | None = None) -> dict:
    """`sample` overrides the model's recorded sampling defaults (cfg_scale, cfg_schedule, temperature, top_k,
    top_p)."""
    model, encoder, meta = load_ar(model_name, resolution=resolution)
    check_same_tokenizer(meta, tokenizer_name, model_name)
    tokenizer = load_tokenizer(tokenizer_name)
    s = meta["sample"] | (sample or {})
    warpers = Warpers(s["temperature"], s["top_k"], s["top_p"])
    guidance = {"cfg_scale": s["cfg_scale"], "cfg_schedule": s["cfg_schedule"]}
    images, start = [], time.perf_counter()
    for i in tqdm(range(0, len(prompts), batch), desc=f"{model_name} {meta['resolution']} px", disable=not progress):
        chunk = prompts[i:i + batch]
        bb = ARBackbone(model, encoder, **guidance)
        tokens, _ = decode_ar(bb, chunk, seed=0, warpers=warpers, image_ids=torch.arange(i, i + len(chunk)))
        images += tokens_to_images(tokenizer, tokens)
    batched_s = time.perf_counter() - start
    lat = []
    for i in range(min(latency_prompts, len(prompts))):  # batch 1, as the paper reports latency
        _, trace = decode_ar(ARBackbone(model, encoder, **guidance), [prompts[i]], seed=0,
                             warpers=warpers, image_ids=torch.tensor([i]))
        lat.append(trace.wall_s / trace.steps)
    score = geneval_score(images, prompts)
    params = sum(p.numel() for p in model.parameters())
    fd = None
    if fd_radius is not None:
        from ..eval.fd import frechet_distance, vgg_features

        reference = reference_renders(prompts, meta["resolution"], seed=0, radius=fd_radius)
        fd = frechet_distance(vgg_features(images), vgg_features(reference))
    return {"resolution": meta["resolution"], "grid": model.cfg.grid, "params": params, "score": score,
            "ms_per_token": 1000 * float(torch.tensor(lat).median()) if lat else float("nan"),
            "images_per_s": len(prompts) / batched_s, "cfg_scale": s["cfg_scale"], "cfg_schedule": s["cfg_schedule"],
            "images": images, "fd_vgg": fd}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.ar", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--prompt-seed", type=int, default=EVAL_SEED,
                    help="world seed of the prompt set (another seed: a second, independent set)")
    ap.add_argument("--fd", action="store_true", help="also FD-VGG against the world's renders of the prompts")
    ap.add_argument("--radius", type=float, nargs=2, metavar=("LO", "HI"),
                    help="the world geometry of the FD references (object half-size range; default: the world each "
                         "model was trained on)")
    ap.add_argument("--cfg-scale", type=float, help="instead of each model's recorded guidance scale")
    ap.add_argument("--cfg-schedule", choices=GUIDANCE_SCHEDULES,
                    help="instead of each model's recorded guidance schedule (linear: 1 -> 2 CFG - 1 along the raster)")
    ap.add_argument("--temperature", type=float, help="instead of each model's recorded temperature")
    ap.add_argument("--top-k", type=int, help="instead of each model's recorded top-k")
    ap.add_argument("--sizes", type=int, nargs="+", metavar="PX",
                    help="only these image sizes of each model (a multi-resolution model's others are skipped)")
    args = ap.parse_args(argv)
    sample = {k: v for k, v in (("cfg_scale", args.cfg_scale), ("cfg_schedule", args.cfg_schedule),
                                ("temperature", args.temperature), ("top_k", args.top_k)) if v is not None}
    if args.n < 1 or args.batch < 1:
        ap.error("--n and --batch must be >= 1")
    if args.prompt_seed == 0:
        ap.error("--prompt-seed 0 is the training shards' world seed: its prompts are not held out")
    torch.manual_seed(0)
    prompts = prompt_set(args.n, seed=args.prompt_seed)
    rows = {}
    for name in args.models.split(","):
        try:
            meta = read_config(name)
            sizes = meta.get("resolutions") or [meta["resolution"]]
            for px in [px for px in sizes if not args.sizes or px in args.sizes]:
                label = f"{name}@{px}" if len(sizes) > 1 else name
                radius = tuple(args.radius) if args.radius else world_radius(meta)
                rows[label] = evaluate(name, args.tokenizer, prompts, args.batch, resolution=px,
                                       fd_radius=radius if args.fd else None, sample=sample)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    cats = [c for c in CATEGORIES if any(c in r["score"] for r in rows.values())]
    print(f"plain AR with CFG on {args.n} held-out prompts (world seed {args.prompt_seed}), "
          f"{torch.get_num_threads()} CPU threads")
    print("| model | px | grid | params | CFG | " + " | ".join(cats) + " | GenEval | ms/token (batch 1) | images/s "
          f"(batch {args.batch}) |" + (" FD-VGG |" if args.fd else ""))
    print("|---" * (8 + len(cats) + args.fd) + "|")
    for name, r in rows.items():
        print(f"| {name} | {r['resolution']} | {r['grid']}x{r['grid']} | {r['params'] / 1e6:.1f}M | {r['cfg_scale']}"
              + ("" if r["cfg_schedule"] == "constant" else f" {r['cfg_schedule']}") + " | "
              + " | ".join(f"{r['score'].get(c, float('nan')):.2f}" for c in cats)
              + f" | {r['score']['geneval']:.3f} | {r['ms_per_token']:.2f} | {r['images_per_s']:.2f} |"
              + (f" {r['fd_vgg']:.2f} |" if args.fd else ""))
    by_res = {}
    for r in rows.values():
        by_res.setdefault(r["resolution"], r)
    fields = [f"geneval{res}={by_res[res]['score']['geneval']:.3f}" for res in sorted(by_res)]
    if 128 in by_res:
        fields.append(f"ms_per_token128={by_res[128]['ms_per_token']:.2f}")
    print("ar: " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
