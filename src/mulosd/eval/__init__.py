"""Evaluation: SynthScenes-GenEval over fixed prompt sets (more metrics join with the benchmark issue)."""

from .geneval import EVAL_SEED, geneval_score, prompt_set

__all__ = ["EVAL_SEED", "geneval_score", "prompt_set"]
