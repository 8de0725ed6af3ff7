"""Config errors: 30 typos and bad values over train.py, infer.py and bench.py, each a non-zero exit with an
error of at most 10 lines that names the key, and no traceback. Every case runs the real command line."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .common import ROOT, Check, World, child_env

UP_OTHER = "{up_other}"  # a sampler trained for another tokenizer (made by the battery)

# (script, overrides, the key the error must name)
CASES: list[tuple[str, list[str], str]] = [
    ("train.py", ["experiment=upsampler_ce", "model.widht=16"], "model.widht"),
    ("train.py", ["experiment=upsampler_ce", "r=3"], "r"),
    ("train.py", ["experiment=upsampler_ce", "model.train.batches=ten"], "model.train.batches"),
    ("train.py", ["experiment=upsampler_ce", "data.batch_size=0"], "data.batch_size"),
    ("train.py", ["experiment=upsampler_gan", "loss=gann"], "loss"),
    ("train.py", ["experiment=upsampler_ce", "model.loss.stage=pixel"], "model.loss.stage"),
    ("train.py", ["experiment=upsampler_ce", "data.ratios=[3]"], "data.ratios"),
    ("train.py", ["experiment=upsampler_ce", "model.optim.lr=-1"], "model.optim.lr"),
    ("train.py", ["experiment=upsampler_gan", f"model.init_from={UP_OTHER}"], "model.init_from"),
    ("train.py", ["experiment=upsampler_ce", "model.tokenizer=/nonexistent/tokenizer"], "model.tokenizer"),
    ("train.py", ["experiment=zoo_tokenizer", "model.vq.codebook_size=1"], "model.vq.codebook_size"),
    ("train.py", ["experiment=upsampler_ce", "ckpt_path=/nonexistent/last.ckpt"], "ckpt_path"),
    ("train.py", ["experiment=upsampler_gann"], "experiment"),
    ("train.py", ["experiment=upsampler_ce", "logger.name=tensorboard"], "logger.name"),
    ("train.py", ["experiment=downsampler", "model.loss.stage=gan"], "model.loss.stage"),
    ("infer.py", ["tau=1.5"], "tau"),
    ("infer.py", ["tau=nan"], "tau"),
    ("infer.py", ["tua=0.1"], "tua"),
    ("infer.py", ["r=3"], "r"),
    ("infer.py", ["radius=-1"], "radius"),
    ("infer.py", ["decoding=medusa"], "decoding"),
    ("infer.py", ["batch_size=0"], "batch_size"),
    ("infer.py", [f"models.up={UP_OTHER}"], "models.up"),
    ("infer.py", ["pool_k=many"], "pool_k"),
    ("infer.py", ["prompt=a purple unicorn"], "prompt"),
    ("bench.py", ["taus=[0.1,1.5]"], "taus"),
    ("bench.py", ["rs=[3]"], "rs"),
    ("bench.py", ["strategies=[medusa]"], "strategies"),
    ("bench.py", ["n_prompts=0"], "n_prompts"),
    ("bench.py", ["infer.tau=-0.1"], "infer.tau"),
]


def make_other_sampler(world: World) -> Path:
    """A U_2 saved for the battery's tiny tokenizer: the shipped tokenizer must refuse it."""
    from ..samplers import LatentUpsampler
    from ..zoo import load_tokenizer, save

    out = world.root / "up_other"
    if not (out / "config.json").is_file():
        up = LatentUpsampler(load_tokenizer(world.tokenizer).codebook(), 2, 16, 1, head="latent")
        save(up, "sampler", out, recipe="reliability battery: a sampler for another tokenizer", stage="gan")
    return out


def _one(script: str, overrides: list[str], key: str, work: Path, up_other: Path, i: int) -> str | None:
    """None when the case fails as it should; otherwise what went wrong."""
    args = [o.replace(UP_OTHER, str(up_other)) for o in overrides]
    run_dir = work / f"typo{i:02d}"
    r = subprocess.run([sys.executable, script, *args, f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=child_env(2))
    err = r.stderr.strip()
    lines = err.splitlines()
    problems = []
    if r.returncode == 0:
        problems.append("exit status 0")
    if "Traceback" in r.stderr or "Traceback" in r.stdout:
        problems.append("a traceback")
    if len(lines) > 10:
        problems.append(f"{len(lines)} lines of error")
    if key not in err:
        problems.append(f"the key {key!r} is not named")
    if not problems:
        return None
    return f"{script} {' '.join(overrides)}: {', '.join(problems)}; stderr: {err[-400:]!r}"


def run(world: World, work: Path, workers: int = 2, cases=CASES) -> Check:
    check = Check("typos")
    up_other = make_other_sampler(world)
    work.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda a: _one(*a[1], work, up_other, a[0]), enumerate(cases)))
    for problem in results:
        check.trial(problem is None, problem or "")
    check.figures["scripts"] = ",".join(sorted({c[0] for c in cases}))
    return check
