"""python -m mulosd.reports.judge_audit [--labels FILE] [--out REPORT.md] [--pictures SHEET.png] [--write-images DIR]

The SynthScenes judge against people, on generated images. The audit set is fixed: for each world seed of
`SETS` (no report or training run uses them), some prompts of every GenEval category, each decoded by every
method of `METHODS` with the shipped zoo at `seed=0`, image id = the prompt's index. Each image was labelled
by two people looking at it (what objects it shows, and whether a person would pass it for its prompt), and
every image they were not both sure of by three more, its label the majority of the five;
`judge_audit.json` beside this module holds the labels with each image's prompt, method, id and a hash of
its pixels, so the images are regenerated, never stored, and a label is only compared with the image it was
given for. The judge's rules were chosen on the worlds of `CHOSEN_ON` and are checked on the others.

    (default)       decode the set, judge it, compare with the labels: agreement overall, per world, on sure
                    labels, per category and per method, next to the labellers' agreement with each other and
                    the most any judge can expect (`oracle_agreement`); the judge's shape names against
                    people's for the regions of `judge_regions.json`; each disagreement; the last line
                    `judge audit: n=.. agreement=..`
    --write-images  only decode the set and write it for labelling: 128 px PNGs, 4x enlargements, a manifest"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..data.synthscenes import caption_text, judge, parse_caption, sample_scene, vocab
from ..data.synthscenes.vocab import CATEGORIES
from . import publish

# world seed -> prompts per category. The judge's rules were chosen looking at the errors on the worlds of
# CHOSEN_ON (on 2718 up to judge v3, v4's two rules on 3141's, v5's on all four); the others are held out:
# labelled the same way, never looked at while choosing
SETS = {2718: 8, 3141: 4, 1618: 4, 9091: 4, 5381: 4, 7919: 4}
CHOSEN_ON = (2718, 3141, 1618, 9091)
BATCH = 8  # the batch the labelled images were decoded in (see decode_items)
# method name -> infer.py settings (on top of what infer.py ships): `ar`, ZipAR at its weakest and its
# equal-quality windows, and MuLo-SD's default
METHODS = {"ar": {"decoding": "ar"}, "zipar_w1": {"decoding": "zipar", "window": 1},
           "zipar_w3": {"decoding": "zipar", "window": 3},
           # the default of the day the images were labelled (their hashes hold them): the paper's expansion,
           # and the U_2 of that day, kept in the zoo for this
           "mulosd": {"decoding": "mulosd", "expanded": "resample", "radius": 1, "draft_rows": 4,
                      "models": {"up": "synthscenes_up2_gan_audit"}}}
LABELS = Path(__file__).with_name("judge_audit.json")
# people's names for the regions of the first four worlds' images (one labeller per region, shown cut out)
REGIONS = Path(__file__).with_name("judge_regions.json")


@dataclass(frozen=True)
class Item:
    world: int  # the world seed the prompt is drawn from
    method: str
    index: int  # the prompt's index in the audit world: its scene seed and the image id it is decoded with
    caption: str
    category: str

    @property
    def name(self) -> str:
        return f"{self.world}_{self.method}_{self.index:03d}"


@functools.cache
def audit_prompts(world: int, per_category: int) -> list[tuple[int, str, str]]:
    """(index, caption, category): `per_category` prompts per category of world `world`, interleaved."""
    out = []
    for i in range(per_category * len(CATEGORIES)):
        category = CATEGORIES[i % len(CATEGORIES)]
        out.append((i, caption_text(sample_scene(world, i, category=category).prompt), category))
    return out


def audit_items(sets: dict[int, int] = SETS) -> list[Item]:
    return [Item(w, m, i, c, k) for w, n in sets.items() for m in METHODS for i, c, k in audit_prompts(w, n)]


def pixel_hash(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:16]


def decode_items(items: list[Item], progress: bool = True) -> list[np.ndarray]:
    """The items' images, decoded exactly as they were when labelled: each in its batch of BATCH consecutive
    prompts of its world and method (image id = prompt index). The batch is part of the recipe: batched float
    reductions round differently at other batch sizes, and a sampled token can flip."""
    import torch
    from omegaconf import OmegaConf
    from tqdm import tqdm

    from ..config.infer import InferConfig, validate_infer
    from ..pipeline import Pipeline

    base = OmegaConf.structured(InferConfig)
    cfgs = {m: OmegaConf.merge(base, s) for m, s in METHODS.items()}
    for cfg in cfgs.values():
        validate_infer(cfg)
    def models(cfg):  # the models a method's settings name (MuLo-SD keeps the U_2 of its labels)
        return OmegaConf.to_yaml(cfg.models)

    pipes = {}
    for cfg in cfgs.values():
        if models(cfg) not in pipes:
            pipes[models(cfg)] = Pipeline.from_config(cfg, {c.decoding for c in cfgs.values()
                                                            if models(c) == models(cfg)})
    batches = sorted({(it.world, it.method, it.index // BATCH) for it in items})
    decoded = {}
    with tqdm(total=len(batches), desc="judge audit: decoding", unit="batch", disable=not progress) as bar:
        for world, method, b in batches:
            prompts = audit_prompts(world, SETS.get(world, 0))[b * BATCH:(b + 1) * BATCH]
            if not prompts:
                raise ValueError(f"world {world} has no audit prompt {b * BATCH}")
            cfg = cfgs[method]
            pipe = pipes[models(cfg)]
            tokens, _ = pipe.decode(cfg.decoding, cfg, [c for _, c, _ in prompts],
                                    torch.tensor([i for i, _, _ in prompts]))
            for (i, _, _), image in zip(prompts, pipe.images(tokens), strict=True):
                decoded[(world, method, i)] = image
            bar.update(1)
    return [decoded[(it.world, it.method, it.index)] for it in items]


def write_images(out: Path, items: list[Item], images: list[np.ndarray], enlarge: int = 4) -> None:
    """128 px PNGs, enlargements for looking at, and manifest.json (file -> method, index, caption, hash)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for it, image in zip(items, images, strict=True):
        name = it.name
        Image.fromarray(image).save(out / f"{name}.png")
        big = Image.fromarray(image).resize((image.shape[1] * enlarge, image.shape[0] * enlarge), Image.NEAREST)
        big.save(out / f"{name}_x{enlarge}.png")
        manifest.append({"file": name, "world": it.world, "method": it.method, "index": it.index, "caption": it.caption,
                         "category": it.category, "hash": pixel_hash(image)})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def load_labels(path: Path = LABELS) -> list[dict]:
    return json.loads(path.read_text())["labels"]


def _rate(hits: list[bool]) -> str:
    return f"{np.mean(hits):.3f} ({sum(hits)}/{len(hits)})" if hits else "-"


def audit(labels: list[dict], images: list[np.ndarray]) -> dict:
    """Judge each image and compare with its label -> rows (label + verdict + detections) and the tables."""
    rows = []
    for lab, image in zip(labels, images, strict=True):
        v = judge(image, parse_caption(lab["caption"]))
        rows.append({**lab, "judge": v.geneval, "same_image": pixel_hash(image) == lab["hash"],
                     "detections": [f"{d.shape} {d.colour or 'two-coloured'} ({d.cx:.2f}, {d.cy:.2f}) fit {d.match:.2f}"
                                    for d in v.detections]})
    return {"rows": rows, "agreement": float(np.mean([r["judge"] == r["pass"] for r in rows]))}


def oracle_agreement(rows: list[dict]) -> float:
    """At most what any judge can expect to agree with these labels: a judge that knew, for each image, the
    verdict most people would give. A label two sure labellers agreed on is taken as that verdict; a label by
    five is a majority of a sample, and the verdict most people give is on its side with the posterior
    probability of a pass rate above or below one half, given the votes (uniform prior)."""
    from scipy.stats import beta

    expected = []
    for r in rows:
        if r["sure"]:
            expected.append(1.0)
            continue
        k, n = sum(r["labellers"]), len(r["labellers"])
        above = 1.0 - beta.cdf(0.5, k + 1, n - k + 1)
        expected.append(above if r["pass"] else 1.0 - above)
    return float(np.mean(expected)) if expected else float("nan")


def region_agreement(rows: list[dict], images: list[np.ndarray], path: Path = REGIONS) -> list[dict]:
    """People's name for each labelled region next to the judge's (`name_shape`; 'none' for a blob); regions
    the judge no longer reads from the image (its foreground changed) are left out."""
    from ..data.synthscenes.judge import name_shape, object_regions

    wanted = {}
    for region in json.loads(path.read_text())["regions"]:
        wanted.setdefault(region["image"], []).append(region)
    out = []
    for r, image in zip(rows, images, strict=True):
        name = f"{r['world']}_{r['method']}_{r['index']:03d}"
        if name not in wanted:
            continue
        found = {(sl[0].start, sl[0].stop, sl[1].start, sl[1].stop): mask for sl, mask in object_regions(image)}
        for region in wanted[name]:
            mask = found.get(tuple(region["bbox"]))
            if mask is not None:
                out.append({**region, "judge": name_shape(mask) or "none"})
    return out


def report(result: dict, command: str) -> tuple[str, str]:
    rows = result["rows"]
    groups = {"all": rows}
    groups |= {f"world {w} ({'rules chosen here' if w in CHOSEN_ON else 'held out'})":
               [r for r in rows if r["world"] == w] for w in SETS}
    groups |= {"labels both labellers were sure of": [r for r in rows if r["sure"]],
               "the rest, labelled by five (majority)": [r for r in rows if not r["sure"]]}
    agree = lambda rs: [r["judge"] == r["pass"] for r in rs]  # noqa: E731
    people = lambda rs: [r["labellers"][0] == r["labellers"][1] for r in rs]  # noqa: E731
    lines = [f"`{command}`", "",
             "| images | n | judge = label | judge = labeller 1 | judge = labeller 2 | labeller 1 = labeller 2 |",
             "|---|---|---|---|---|---|"]
    for name, rs in ((k, v) for k, v in groups.items() if v):
        lines.append(f"| {name} | {len(rs)} | {_rate(agree(rs))} | "
                     f"{_rate([r['judge'] == r['labellers'][0] for r in rs])} | "
                     f"{_rate([r['judge'] == r['labellers'][1] for r in rs])} | {_rate(people(rs))} |")
    lines += ["", "At most what a judge can expect (`oracle_agreement`: it knows the verdict most people give; sure "
                  "labels taken as right): " + ", ".join(f"{name} {oracle_agreement(rs):.3f}"
                                                          for name, rs in groups.items() if rs) + "."]
    for key, values in (("category", CATEGORIES), ("method", list(METHODS))):
        lines += ["", f"| {key} | n | judge = label | judge passes, people fail | judge fails, people pass | "
                      "people pass |", "|---|---|---|---|---|---|"]
        for value in values:
            rs = [r for r in rows if r[key] == value]
            lines.append(f"| {value} | {len(rs)} | {_rate(agree(rs))} | "
                         f"{sum(r['judge'] and not r['pass'] for r in rs)} | "
                         f"{sum(r['pass'] and not r['judge'] for r in rs)} | "
                         f"{np.mean([r['pass'] for r in rs]) if rs else float('nan'):.3f} |")
    regions = result.get("regions", [])
    if regions:
        named = [g for g in regions if g["shape"] != "several"]
        lines += ["", f"Shapes of {len(named)} regions, named by people (one each, cut out of the first four worlds' "
                      f"images) and by the judge: agreement {_rate([g['judge'] == g['shape'] for g in named])}, on "
                      f"the names people were sure of {_rate([g['judge'] == g['shape'] for g in named if g['sure']])} "
                      f"({len(regions) - len(named)} regions people saw as several objects left out).", "",
                  "| people's name | n | judge names it so | judge: a blob (none) | judge: another shape |",
                  "|---|---|---|---|---|"]
        for shape in (*vocab.SHAPES, "none"):
            gs = [g for g in named if g["shape"] == shape]
            lines.append(f"| {shape} | {len(gs)} | {_rate([g['judge'] == shape for g in gs])} | "
                         f"{sum(g['judge'] == 'none' for g in gs) if shape != 'none' else '-'} | "
                         f"{sum(g['judge'] not in (shape, 'none') for g in gs)} |")
    changed = [r for r in rows if not r["same_image"]]
    if changed:
        lines += ["", f"{len(changed)} regenerated image(s) differ from the labelled ones (the decode changed): "
                      "their labels may not apply."]
    lines += ["", "Disagreements (label: what the two labellers saw; judge: what it detected):", ""]
    for r in rows:
        if r["judge"] != r["pass"]:
            lines.append(f"- {r['world']}_{r['method']}_{r['index']:03d} \"{r['caption']}\": people "
                         f"{'pass' if r['pass'] else 'fail'}{'' if r['sure'] else ' (unsure)'}, judge "
                         f"{'pass' if r['judge'] else 'fail'}. Seen: {r['seen'][0]} | judge: "
                         f"{'; '.join(r['detections']) or 'nothing'}")
    line = f"judge audit: n={len(rows)} agreement={result['agreement']:.3f}"
    return "\n".join(lines) + "\n", line


def disagreement_sheet(rows: list[dict], images: list[np.ndarray], path: Path) -> None:
    """The images the judge and people disagree on, captioned with both verdicts."""
    from ..viz import captioned_grid

    picked = [(r, im) for r, im in zip(rows, images, strict=True) if r["judge"] != r["pass"]]
    if not picked:
        return
    captions = [f"{r['caption']} | people {'pass' if r['pass'] else 'fail'}{'' if r['sure'] else '?'}, judge "
                f"{'pass' if r['judge'] else 'fail'}" for r, _ in picked]
    path.parent.mkdir(parents=True, exist_ok=True)
    captioned_grid([im for _, im in picked], captions, cols=6, tile=160).save(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.judge_audit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=Path, default=LABELS, help="the labelled set (JSON)")
    ap.add_argument("--out", type=Path, help="write the report (markdown) here")
    ap.add_argument("--pictures", type=Path, help="write a sheet of the disagreements (PNG) here")
    ap.add_argument("--write-images", type=Path, metavar="DIR",
                    help="only decode the audit set and write it for labelling (PNGs, 4x enlargements, manifest)")
    args = ap.parse_args(argv)
    if args.write_images:
        items = audit_items()
        write_images(args.write_images, items, decode_items(items))
        print(f"wrote {len(items)} images and manifest.json to {args.write_images}")
        return 0
    try:
        labels = load_labels(args.labels)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read labels {args.labels}: {e}", file=sys.stderr)
        return 2
    items = [Item(lab["world"], lab["method"], lab["index"], lab["caption"], lab["category"]) for lab in labels]
    known = {(it.world, it.method, it.index, it.caption) for it in audit_items()}
    stray = [it for it in items if (it.world, it.method, it.index, it.caption) not in known]
    if stray:
        print(f"error: {len(stray)} label(s) are not of the audit set (first: world {stray[0].world}, method "
              f"{stray[0].method!r}, prompt {stray[0].index}); methods: {', '.join(METHODS)}, worlds: "
              f"{', '.join(map(str, SETS))}", file=sys.stderr)
        return 2
    images = decode_items(items)
    result = audit(labels, images)
    result["regions"] = region_agreement(result["rows"], images)
    command = " ".join(["python -m mulosd.reports.judge_audit", *(argv if argv is not None else sys.argv[1:])])
    if args.pictures:
        disagreement_sheet(result["rows"], images, args.pictures)
    publish(*report(result, command), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
