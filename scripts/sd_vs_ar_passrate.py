"""Does exact speculative decoding sample the verifier's distribution on the shipped models? Judge pass rates
over many seeds of the same prompts, `ar` against `sd` (a distribution check at full scale; the chi-square
test in tests/test_decoding.py runs on a tiny model).

    .venv/bin/python scripts/sd_vs_ar_passrate.py [SEEDS_PER_PROMPT=80]
"""

import sys
import time

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from mulosd.config import register_configs
from mulosd.data.synthscenes import judge, parse_caption
from mulosd.eval import prompt_set
from mulosd.paths import CONF
from mulosd.pipeline import Pipeline

register_configs()
with initialize_config_dir(str(CONF), version_base="1.3"):
    cfg = compose(config_name="infer", overrides=["decoding=sd"])
pipe = Pipeline.from_config(cfg, {"ar", "sd"})
# single-object and colour prompts: the categories the shipped verifier passes often enough to compare
prompts = [q for q in prompt_set(64) if parse_caption(q).category in ("single_object", "colors")][:6]
per = int(sys.argv[1]) if len(sys.argv) > 1 else 80
for strategy in ("ar", "sd"):
    start, rates = time.time(), []
    for j, p in enumerate(prompts):
        ids = torch.arange(j * per, (j + 1) * per) + 10_000  # seeds no bench uses
        tokens, _ = pipe.decode(strategy, cfg, [p] * per, ids)
        images = pipe.images(tokens)
        rates.append(np.mean([judge(im, parse_caption(p)).geneval for im in images]))
    print(f"{strategy}: pass rate {np.mean(rates):.3f} over {per * len(prompts)} images; per prompt "
          f"{' '.join(f'{r:.2f}' for r in rates)} ({time.time() - start:.0f} s)")
