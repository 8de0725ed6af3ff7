"""What `python infer.py` runs: parse the prompts, decode images, save them with the judge's verdicts.

`decoding=reference` draws the SynthScenes world's own rendering of each prompt (a layout sampled from the
prompt with the run's seed): the ground truth the models are trained towards, useful to see what a prompt
asks for. The AR decoding strategies (ar, zipar, sd, mulosd) join with the decoding issue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from PIL import Image

from .config import ConfigError, validate_infer
from .data.synthscenes import CaptionError, judge, parse_caption, realise, render
from .viz import captioned_grid


def load_prompts(cfg: DictConfig) -> list[str]:
    if cfg.prompt_file:
        path = Path(cfg.prompt_file)
        if not path.is_file():
            raise ConfigError("prompt_file", f"{path} does not exist")
        prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not prompts:
            raise ConfigError("prompt_file", f"{path} holds no prompt")
        return prompts
    return list(cfg.prompts) if cfg.prompts else [cfg.prompt]


def run(cfg: DictConfig, run_dir: Path) -> list[dict]:
    validate_infer(cfg)
    texts = load_prompts(cfg)
    prompts = []
    for i, text in enumerate(texts):
        try:
            prompts.append(parse_caption(text))
        except CaptionError as e:
            raise ConfigError("prompt" if len(texts) == 1 else f"prompts[{i}]", str(e)) from None
    out_dir = Path(cfg.out_dir) if cfg.out_dir else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    results, images = [], []
    for i, (text, prompt) in enumerate(zip(texts, prompts, strict=True)):
        scene = realise(prompt, np.random.default_rng([cfg.seed, i]))
        image = render(scene, cfg.size)
        verdict = judge(image, prompt)
        path = out_dir / f"{i:03d}.png"
        Image.fromarray(image).save(path)
        images.append(image)
        failed = [k for k, v in verdict.checks.items() if not v]
        print(f"[{i}] {text!r} -> {path}  judge: {'pass' if verdict.ok else 'fail ' + ', '.join(failed)}")
        results.append({"prompt": text, "path": str(path), "geneval": verdict.geneval, "checks": verdict.checks})
    if len(images) > 1:
        grid = out_dir / "grid.png"
        captioned_grid(images, texts, cols=min(4, len(images))).save(grid)
        print(f"grid -> {grid}")
    return results
