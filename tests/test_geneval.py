"""The paired GenEval difference the bench reports against ar: by hand, and its interval's coverage."""

import numpy as np

from mulosd.eval import paired_difference


def test_paired_difference_by_hand():
    # two categories; GenEval averages categories, so does the difference
    passed = [1, 1, 0, 1, 0, 0]
    base = [1, 0, 0, 1, 1, 1]
    cats = ["single_object", "single_object", "single_object", "colors", "colors", "colors"]
    diff, se = paired_difference(passed, base, cats)
    d1, d2 = np.array([0, 1, 0]), np.array([0, -1, -1])
    assert np.isclose(diff, (d1.mean() + d2.mean()) / 2)
    assert np.isclose(se, np.sqrt(d1.var(ddof=1) / 3 + d2.var(ddof=1) / 3) / 2)
    assert paired_difference(base, base, cats) == (0.0, 0.0)


def test_paired_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    cats = ["single_object", "two_object", "colors"] * 100
    difficulty = rng.uniform(0.1, 0.9, size=len(cats))  # a prompt's own pass probability, shared by both methods
    hits = 0
    for _ in range(400):
        u = rng.uniform(size=len(cats))
        base = u < difficulty
        method = u < difficulty - 0.05  # the same draws: strongly paired, truly 0.05 worse
        diff, se = paired_difference(method, base, cats)
        hits += abs(diff + 0.05) <= 1.96 * se
    assert 0.90 <= hits / 400 <= 0.99
