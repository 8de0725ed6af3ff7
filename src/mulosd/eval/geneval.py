"""SynthScenes-GenEval: the judge's pass rate per GenEval category, averaged over categories as GenEval
averages its tasks, on a fixed prompt set drawn from a world seed no training shard uses."""

from __future__ import annotations

import numpy as np

from ..data.synthscenes import caption_text, judge, parse_caption, realise, render, sample_scene
from ..data.synthscenes.vocab import CATEGORIES, RADIUS_RANGE

EVAL_SEED = 4242  # training shards use world seed 0

# The protocol of docs/results.md: settings, recipes and judge rules are chosen on the development worlds (the
# default prompt sets, the sampling tuner's, the AR report's second set and the judge audit's); every reported
# number comes from the report world, which no choice has looked at. A report world that a choice later looks
# at joins the development worlds, and the next report draws a new one.
TUNING_WORLD = 777  # the sampling tuner's prompts (reports/ar_tune.py) and the quick sweeps'
DEVELOPMENT_WORLDS = (EVAL_SEED, TUNING_WORLD, 4343, 2718, 3141, 1618, 9091, 5381, 7919)
REPORT_WORLD = 8128


def prompt_set(n: int = 200, seed: int = EVAL_SEED) -> list[str]:
    return [caption_text(sample_scene(seed, i).prompt) for i in range(n)]


def reference_renders(prompts: list[str], size: int = 128, seed: int = EVAL_SEED,
                      radius: tuple[float, float] = RADIUS_RANGE) -> list[np.ndarray]:
    """The world's own pictures of the prompts: one layout each (seeded per prompt index), rendered at `size`
    in the world geometry `radius`. The reference set of FD-VGG."""
    return [render(realise(parse_caption(t), np.random.default_rng([seed, i]), tuple(radius)), size)
            for i, t in enumerate(prompts)]


def geneval_score(images: list[np.ndarray], captions: list[str]) -> dict:
    """-> {"geneval": mean over categories present, "<category>": pass rate, "n": count, "passed": [bool],
    "categories": [str]}"""
    passed, cats = [], []
    for image, caption in zip(images, captions, strict=True):
        prompt = parse_caption(caption)
        passed.append(judge(image, prompt).geneval)
        cats.append(prompt.category)
    return {"n": len(passed), "passed": passed, "categories": cats, **category_rates(passed, cats)}


def categories(captions: list[str]) -> list[str]:
    """Each caption's GenEval category (what paired_difference and category_rates group by)."""
    return [parse_caption(c).category for c in captions]


def category_rates(passed: list[bool], categories: list[str]) -> dict:
    """Per-image verdicts -> {"<category>": pass rate for each category present, "geneval": their mean}."""
    out = {}
    for c in CATEGORIES:
        hits = [p for p, k in zip(passed, categories, strict=True) if k == c]
        if hits:
            out[c] = float(np.mean(hits))
    out["geneval"] = float(np.mean(list(out.values()))) if out else 0.0
    return out


def paired_difference(passed: list[bool], baseline: list[bool], categories: list[str]) -> tuple[float, float]:
    """GenEval(method) - GenEval(baseline) on the same prompts and seeds, and its standard error.

    GenEval is a mean over categories of per-category pass rates, so the difference is the mean over
    categories of the per-image differences' means; pairing removes the prompts' own difficulty from the
    noise, which is what lets a few hundred prompts resolve a few hundredths."""
    d = np.asarray(passed, dtype=float) - np.asarray(baseline, dtype=float)
    cats = np.asarray(categories)
    means, variances = [], []
    for c in CATEGORIES:
        dc = d[cats == c]
        if len(dc):
            means.append(dc.mean())
            variances.append(dc.var(ddof=1) / len(dc) if len(dc) > 1 else 0.0)
    if not means:
        return 0.0, 0.0
    return float(np.mean(means)), float(np.sqrt(np.sum(variances)) / len(means))
