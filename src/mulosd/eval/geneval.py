"""SynthScenes-GenEval: the judge's pass rate per GenEval category, averaged over categories as GenEval
averages its tasks, on a fixed prompt set drawn from a world seed no training shard uses."""

from __future__ import annotations

import numpy as np

from ..data.synthscenes import caption_text, judge, parse_caption, sample_scene
from ..data.synthscenes.vocab import CATEGORIES

EVAL_SEED = 4242  # training shards use world seed 0


def prompt_set(n: int = 200, seed: int = EVAL_SEED) -> list[str]:
    return [caption_text(sample_scene(seed, i).prompt) for i in range(n)]


def geneval_score(images: list[np.ndarray], captions: list[str]) -> dict:
    """-> {"geneval": mean over categories present, "<category>": pass rate, "n": count, "passed": [bool]}"""
    passed, cats = [], []
    for image, caption in zip(images, captions, strict=True):
        prompt = parse_caption(caption)
        passed.append(judge(image, prompt).geneval)
        cats.append(prompt.category)
    out = {"n": len(passed), "passed": passed}
    rates = []
    for c in CATEGORIES:
        hits = [p for p, k in zip(passed, cats, strict=True) if k == c]
        if hits:
            out[c] = float(np.mean(hits))
            rates.append(out[c])
    out["geneval"] = float(np.mean(rates)) if rates else 0.0
    return out
