"""Evaluation: SynthScenes-GenEval over fixed prompt sets (more metrics join with the benchmark issue)."""

from .geneval import EVAL_SEED, geneval_score, paired_difference, prompt_set, reference_renders

__all__ = ["EVAL_SEED", "geneval_score", "paired_difference", "prompt_set", "reference_renders"]
