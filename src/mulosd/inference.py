"""What `python infer.py` runs: parse the prompts, load the models a strategy needs, decode, and save the
images, MuLo-SD's per-round acceptance maps and the judge's verdicts; `compare=true` also decodes with `ar`
from the same seed and reports the wall-clock speed-up.

Everything that can be wrong with the request (a config value, an unknown word in a prompt, a missing model,
a drafter, verifier or sampler trained on another tokenizer) is refused before any decoding work.
`decoding=reference` draws the SynthScenes world's own rendering of each prompt: what a prompt asks for.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from PIL import Image
from tqdm import tqdm

from .config import ConfigError
from .config.infer import validate_infer
from .data.synthscenes import CaptionError, judge, parse_caption, realise, render, untaught
from .decoding.registry import STRATEGIES
from .machine import log_conditions, use_threads
from .pipeline import Pipeline
from .viz import acceptance_maps, captioned_grid
from .zoo import read_config, world_radius

log = logging.getLogger(__name__)


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


def decode_all(pipe: Pipeline, strategy: str, cfg: DictConfig, texts: list[str]) -> tuple[list, list]:
    """All prompts in batches -> (uint8 images, traces), with a progress bar."""
    images, traces = [], []
    batches = range(0, len(texts), cfg.batch_size)
    units = STRATEGIES[strategy].units(cfg, pipe.grid)
    with tqdm(total=len(batches) * units, desc=strategy, unit="step", leave=False) as bar:
        for start in batches:
            chunk = texts[start:start + cfg.batch_size]
            tokens, trace = pipe.decode(strategy, cfg, chunk, torch.arange(start, start + len(chunk)), progress=bar,
                                        rounds=STRATEGIES[strategy].rounds)  # its acceptance maps
            t = time.perf_counter()
            images += pipe.images(tokens)
            trace.stages["vq_decode"] = time.perf_counter() - t
            traces.append(trace)
    return images, traces


def _compare(pipe: Pipeline, cfg: DictConfig, texts: list[str]):
    """compare=true: the strategy against `ar` on the same prompts and seeds. Both are warmed up on the first
    batch (untimed: the first decode in a process pays for allocations and thread start-up), then decoded in
    turn `compare_repeats` times, the order alternating (A B, B A, ...) so that drift falls on both; each
    repeat gives one ratio. Returns the median repeat's (images, traces) of each and its ratio, then all ratios:
    the times reported are the ones that make the median (seeded decoding makes every repeat's images the same)."""
    log_conditions(log)
    strategy = cfg.decoding
    for s in (strategy, "ar"):
        t = time.perf_counter()
        pipe.precompile(s, cfg, texts[:cfg.batch_size])
        decode_all(pipe, s, cfg, texts[:cfg.batch_size])
        log.info(f"{s}: warm-up {time.perf_counter() - t:.1f} s (untimed" + (", compilation included)" if cfg.compile
                                                                         else ")"))
    runs: dict[str, list] = {strategy: [], "ar": []}
    for rep in range(cfg.compare_repeats):
        for s in (strategy, "ar") if rep % 2 == 0 else ("ar", strategy):
            runs[s].append(decode_all(pipe, s, cfg, texts))
    ratios = [sum(t.wall_s for t in a[1]) / sum(t.wall_s for t in m[1])
              for a, m in zip(runs["ar"], runs[strategy], strict=True)]
    median = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]  # a repeat, not a mean
    return runs[strategy][median], runs["ar"][median], ratios[median], ratios


def _judged(images, texts, synthscenes: bool) -> tuple[list, float | None]:
    """The judge's verdict per image and their SynthScenes-GenEval (None and None for free-text prompts)."""
    if not synthscenes:
        return [None] * len(texts), None
    verdicts = [judge(image, parse_caption(text)) for image, text in zip(images, texts, strict=True)]
    return verdicts, float(np.mean([v.geneval for v in verdicts]))


def _verdict_text(v) -> str:
    return "pass" if v.ok else "fail " + ", ".join(k for k, ok in v.checks.items() if not ok)


def _marked(texts: list[str], verdicts: list) -> list[str]:
    """Grid captions: the judge's GenEval verdict in front (YES / NO) where there is a judge."""
    return [t if v is None else ("YES " if v.geneval else "NO ") + t for t, v in zip(texts, verdicts, strict=True)]


def _score(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"  # n/a: free-text prompts of a real backbone have no judge


def run(cfg: DictConfig, run_dir: Path) -> dict:
    validate_infer(cfg)
    texts = load_prompts(cfg)
    synthscenes = cfg.backbone == "synthscenes"  # SynthScenes prompts parse and are judged; others are free text
    for i, text in enumerate(texts if synthscenes else []):  # every prompt is checked before any model is loaded
        try:
            why = untaught(parse_caption(text))
        except CaptionError as e:
            raise ConfigError("prompt" if len(texts) == 1 else f"prompts[{i}]", str(e)) from None
        if why and cfg.decoding != "reference":
            log.warning(f"note: the world never draws a composition like {text!r} ({why}): the shipped zoo never "
                        "saw one, so expect its models to miss it")
    out_dir = Path(cfg.out_dir) if cfg.out_dir else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.decoding == "reference":
        return _reference(cfg, texts, out_dir)
    if cfg.devices > 1:
        return _run_distributed(cfg, texts, out_dir, synthscenes)
    strategies = {cfg.decoding} | ({"ar"} if cfg.compare else set())
    use_threads(cfg.threads)
    pipe = Pipeline.from_config(cfg, strategies)
    if cfg.compare:
        (images, traces), (ar_images, ar_traces), speedup, ratios = _compare(pipe, cfg, texts)
    else:
        images, traces = decode_all(pipe, cfg.decoding, cfg, texts)
    verdicts, geneval = _judged(images, texts, synthscenes)
    for i, (text, image, v) in enumerate(zip(texts, images, verdicts, strict=True)):
        path = out_dir / f"{i:03d}.png"
        Image.fromarray(image).save(path)
        log.info(f"[{i}] {text!r} -> {path}" + (f"  judge: {_verdict_text(v)}" if v else ""))
    grid_path = out_dir / "grid.png"
    captioned_grid(images, _marked(texts, verdicts), cols=min(4, len(images))).save(grid_path)
    if STRATEGIES[cfg.decoding].rounds:
        for b, trace in enumerate(traces):
            batch_images = images[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            path = out_dir / f"acceptance_{b:03d}.png"
            acceptance_maps(batch_images, trace.rounds, pipe.grid).save(path)
            log.info(f"acceptance maps (one row per image; round 1, 2, ... then the result) -> {path}")
    wall = sum(t.wall_s for t in traces)
    for t in traces:
        log.info(t.summary())
    if cfg.backbone == "tar":  # each stage on its own: the LLM, TA-Tok, the de-tokenizer pair, the VQ decoder
        stages = {k: sum(t.stages.get(k, 0.0) for t in traces) for k in ("llm", "ta_tok")}
        log.info(f"tar stages: llm {stages['llm']:.2f} s, ta_tok {stages['ta_tok']:.2f} s, de-tokenizer "
                 f"({cfg.decoding}) {wall:.2f} s, vq_decode {sum(t.stages['vq_decode'] for t in traces):.2f} s")
    log.info(f"{cfg.decoding}: {len(texts)} images in {wall:.2f} s, SynthScenes-GenEval {_score(geneval)}; "
             f"grid -> {grid_path}")
    result = {"images": images, "traces": traces, "geneval": geneval, "wall_s": wall}
    if cfg.compare:
        ar_wall = sum(t.wall_s for t in ar_traces)
        ar_verdicts, ar_geneval = _judged(ar_images, texts, synthscenes)
        captioned_grid(ar_images, _marked(texts, ar_verdicts), cols=min(4, len(ar_images))).save(
            out_dir / "grid_ar.png")
        for t in ar_traces:
            log.info(t.summary())
        result |= {"ar_images": ar_images, "ar_wall_s": ar_wall, "ar_geneval": ar_geneval, "speedup": speedup,
                   "speedups": ratios}
        log.info(f"ar: {len(texts)} images in {ar_wall:.2f} s, SynthScenes-GenEval {_score(ar_geneval)}")
        log.info(f"speedup={speedup:.2f} spread={min(ratios):.2f}-{max(ratios):.2f} repeats={len(ratios)} "
                 f"judge_{cfg.decoding}={_score(geneval)} judge_ar={_score(ar_geneval)}")
    if cfg.wandb != "disabled":
        _log_wandb(cfg, result, traces, grid_path, run_dir)
    return result


def _run_distributed(cfg: DictConfig, texts: list[str], out_dir: Path, synthscenes: bool) -> dict | None:
    """devices > 1: the prompts decoded across processes (see generate.py); rank 0 reports."""
    from .generate import generate
    from .logs import configure

    configure()  # generate imported Lightning, whose logger prints every line itself
    result = generate(cfg, texts, out_dir)
    if result is None:
        return None
    images = result["images"]
    verdicts, geneval = _judged(images, texts, synthscenes)
    for i, (text, v) in enumerate(zip(texts, verdicts, strict=True)):
        log.info(f"[{i}] {text!r} -> {out_dir / f'{i:03d}.png'}" + (f"  judge: {_verdict_text(v)}" if v else ""))
    grid_path = out_dir / "grid.png"
    captioned_grid(images, _marked(texts, verdicts), cols=min(4, len(images))).save(grid_path)
    log.info(f"{cfg.decoding}: {len(texts)} images on {result['ranks']} processes in {result['wall_s']:.2f} s "
             f"(slowest process), SynthScenes-GenEval {_score(geneval)}; grid -> {grid_path}")
    return result | {"geneval": geneval}


def _log_wandb(cfg: DictConfig, result: dict, traces: list, grid_path: Path, run_dir: Path) -> None:
    """One W&B run per infer.py call with its summary: what a sweep over tau / radius / pool_k optimises. Its
    files go under the Hydra run directory (a multirun: each job's own), never into the working directory."""
    import wandb
    from omegaconf import OmegaConf

    run = wandb.init(project=cfg.wandb_project, mode=cfg.wandb, dir=run_dir,
                     config=OmegaConf.to_container(cfg, resolve=True))
    summary = {k: result[k] for k in ("geneval", "wall_s", "ar_geneval", "ar_wall_s", "speedup") if k in result}
    summary["steps"] = sum(t.steps for t in traces) / len(traces)
    for t in traces:
        for k, v in t.counts.items():
            summary[f"count/{k}"] = summary.get(f"count/{k}", 0) + v
    run.log(summary | {"grid": wandb.Image(str(grid_path))})
    run.finish()


def _reference(cfg: DictConfig, texts: list[str], out_dir: Path) -> dict:
    images, verdicts = [], []
    meta = read_config(cfg.models.verifier)
    radius = world_radius(meta)  # drawn as the verifier's training world draws it, at its size
    size = cfg.size or meta["resolution"]
    for i, text in enumerate(texts):
        prompt = parse_caption(text)
        image = render(realise(prompt, np.random.default_rng([cfg.seed, i]), radius), size)
        verdicts.append(judge(image, prompt))
        path = out_dir / f"{i:03d}.png"
        Image.fromarray(image).save(path)
        images.append(image)
        log.info(f"[{i}] {text!r} -> {path}  judge: {_verdict_text(verdicts[-1])}")
    if len(images) > 1:
        grid = out_dir / "grid.png"
        captioned_grid(images, _marked(texts, verdicts), cols=min(4, len(images))).save(grid)
        log.info(f"grid -> {grid}")
    return {"images": images}
