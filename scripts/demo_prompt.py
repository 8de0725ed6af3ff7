"""Which prompt `make demo` draws: a typical prompt for the shipped verifier, chosen by a rule, not by eye.

    .venv/bin/python scripts/demo_prompt.py [CANDIDATES=32] [SAMPLES=16] [key=value ...]   # infer.py overrides

The candidates are the first CANDIDATES prompts of the fixed report set (world seed 4242), in its order. Each
is drawn SAMPLES times with `ar` (image ids 0, 1, ...; image 0 is what `python infer.py prompt=...` draws at
seed 0), and its pass rate is the share the judge accepts; the verifier's average is the mean of those rates.
Ordered by how far their rate is from that average, the first candidate that `ar` and MuLo-SD both draw
correctly as image 0 is the demo's prompt: as hard as the verifier's average prompt, and one the default seed
shows working (which a typical prompt does about as often as the average rate says).
"""

import sys

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from mulosd.config import register_configs
from mulosd.config.infer import validate_infer
from mulosd.data.synthscenes import judge, parse_caption
from mulosd.eval import EVAL_SEED, prompt_set
from mulosd.paths import CONF
from mulosd.pipeline import Pipeline

numbers = [a for a in sys.argv[1:] if a.isdigit()]
n_candidates, samples = (int(numbers[i]) if len(numbers) > i else (32, 16)[i] for i in range(2))
register_configs()
with initialize_config_dir(str(CONF), version_base="1.3"):
    cfg = compose(config_name="infer", overrides=[a for a in sys.argv[1:] if "=" in a])
validate_infer(cfg)
pipe = Pipeline.from_config(cfg, {"ar", "mulosd"})
candidates = prompt_set(n_candidates, seed=EVAL_SEED)
rates, first = [], {}
for p in candidates:
    tokens, _ = pipe.decode("ar", cfg, [p] * samples, torch.arange(samples))
    verdicts = [judge(im, parse_caption(p)).ok for im in pipe.images(tokens)]
    rates.append(float(np.mean(verdicts)))
    first[p] = {"ar": verdicts[0]}
    tokens, _ = pipe.decode("mulosd", cfg, [p], torch.arange(1))
    first[p]["mulosd"] = judge(pipe.images(tokens)[0], parse_caption(p)).ok
    marks = " ".join(f"{k}[0]={'YES' if v else 'no '}" for k, v in first[p].items())
    print(f"{rates[-1]:.2f}  {marks}  {parse_caption(p).category:13s} {p}", flush=True)
average = float(np.mean(rates))
print(f"verifier's average pass rate over {len(candidates)} prompts x {samples} images: {average:.3f}")
for rate, p in sorted(zip(rates, candidates, strict=True), key=lambda x: abs(x[0] - average)):
    if first[p]["ar"] and first[p]["mulosd"]:
        print(f"demo prompt: {p!r} (pass rate {rate:.2f})")
        break
else:
    print("no candidate is drawn correctly by both at image 0")
