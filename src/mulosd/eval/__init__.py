"""Evaluation: SynthScenes-GenEval over fixed prompt sets (more metrics join with the benchmark issue)."""

from .geneval import (
    DEVELOPMENT_WORLDS,
    EVAL_SEED,
    REPORT_WORLD,
    TUNING_WORLD,
    categories,
    category_rates,
    geneval_score,
    paired_difference,
    prompt_set,
    reference_renders,
)

__all__ = ["DEVELOPMENT_WORLDS", "EVAL_SEED", "REPORT_WORLD", "TUNING_WORLD", "categories", "category_rates",
           "geneval_score", "paired_difference", "prompt_set", "reference_renders"]
