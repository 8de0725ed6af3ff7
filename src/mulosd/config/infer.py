"""infer.py's schema: the run's models and prompts, sampling, and every strategy's knobs.

The decoding knobs are not written here: `InferConfig` is `InferOptions` plus one field per command-line key of
the strategies' knob dataclasses (decoding/knobs.py), with their defaults and help, so a knob has one default
and one range check, and a new knob is on the command line by being in its dataclass. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from ..choices import BACKBONES, GUIDANCE_SCHEDULES, RATIOS, SAMPLER_STAGES, TRAINING_FREE_SR, WANDB_MODES
from ..decoding.knobs import command_line_knobs, from_config, knob
from ..decoding.registry import STRATEGIES, STRATEGY_NAMES
from ..paths import ZOO
from . import check_keys, one_of, require

DECODINGS = (*STRATEGY_NAMES, "reference")  # reference: the world's own rendering of each prompt


@dataclass
class InferModelsConfig:
    """Zoo names or exported directories; None = the shipped SynthScenes model for this r / stage."""

    tokenizer: str = knob("synthscenes_vq_f8", "the VQ tokenizer every model was trained on")
    verifier: str = knob("synthscenes_ar_v2", "the high-res AR model M_p (every strategy's)")
    drafter: str | None = knob(None, "mulosd's low-res drafter M_q (null: the verifier itself where it draws at "
                                     "128/r px, as at r=2, else synthscenes_ar_{128/r})")
    small: str = knob("synthscenes_ar_128_small", "sd / lantern's same-resolution drafter")
    up: str | None = knob(None, "the up-sampler U_r (null: the zoo's for the verifier's size, "
                                "synthscenes_up{r}_{stage} at 128 px)")
    down: str | None = knob(None, "the down-sampler D_r (null: the zoo's for the verifier's size, "
                                  "synthscenes_down{r} at 128 px)")


@dataclass
class LlamaGenConfig:
    """backbone=llamagen_t2i: where upstream's checkpoint files are (see mulosd.llamagen.checkpoints)."""

    ckpt_dir: str | None = knob(None, "its files (null: ~/.cache/mulosd/llamagen, or $MULOSD_LLAMAGEN_DIR)")
    t5: str = knob("google/flan-t5-xl", "the T5 text encoder: a hub name in the local cache, or a directory")
    download: bool = knob(True, "fetch missing files from the hub when it is reachable")
    dtype: str = knob("bfloat16", "float32 | bfloat16 (GPU)")


@dataclass
class TarConfig:
    """backbone=tar: Tar's files (see mulosd.tar.checkpoints) and its LLM stage."""

    ckpt_dir: str | None = knob(None, "its files (null: ~/.cache/mulosd/tar, or $MULOSD_TAR_DIR)")
    resolution: int = knob(512, "the AR-DTok verifier: 512 (r=2) | 1024 (r=4); the drafter is the 256 px one")
    llm: str = knob("csuhan/Tar-1.5B", "a hub repository (csuhan/Tar-7B-v0.1 too), or a directory")
    scale: int = knob(0, "the LLM's <S{scale}>: 0 | 1 | 2 -> 729 | 169 | 81 TA-Tok ids per image")
    features: str | None = knob(None, "a .pt file of saved TA-Tok ids ([n], one set for every prompt, or "
                                      "[prompts, n]): skips the LLM")
    download: bool = knob(True, "fetch missing files from the hub when it is reachable")
    dtype: str = knob("bfloat16", "float32 | bfloat16 (GPU)")


@dataclass
class InferOptions:
    """Everything of an infer run but the strategies' own knobs (see the module docstring)."""

    backbone: str = knob("synthscenes", "synthscenes (the shipped zoo) | llamagen_t2i (upstream weights, r=2) | tar")
    device: str = knob("cpu", "cpu | cuda")
    compile: bool = knob(False, "the backbone's decode step through torch.compile (inductor; static shapes, token "
                                "counts padded to buckets): compiled once per process and shape at the first "
                                "decode, which bench.py and compare=true leave out of their timings")
    devices: int = knob(1, "> 1: the prompts decoded across this many processes (DDP: gloo on cpu, NCCL on cuda)")
    prompt: str | None = knob("a striped ring on a photographic yellow background",
                              "the prompt (chosen by scripts/demo_prompt.py: docs/log.md)")
    prompts: list[str] = field(default_factory=list, metadata={"help": "used instead of `prompt` when given"})
    prompt_file: str | None = knob(None, "one caption per line; used instead of both when given")
    seed: int = knob(0, "image i of a run is decoded with the noise keyed by (seed, i)")
    batch_size: int = knob(8, "prompts decoded together")
    decoding: str = knob("mulosd", " | ".join(DECODINGS))
    compare: bool = knob(False, "also decode with ar from the same seed: the speed-up and both judge results")
    compare_repeats: int = knob(3, "compare=true: timed runs of each, interleaved after a warm-up; the median ratio")
    threads: int | None = knob(None, "torch's CPU threads (null: torch's default, one per core); timed "
                                      "comparisons report what they ran with")
    out_dir: str | None = knob(None, "where images, maps and verdicts go (null: Hydra's run directory)")
    size: int | None = knob(None, "the verifier's side in px: a multi-resolution model decodes at any size it was "
                                   "trained at (null: its exported size; decoding=reference renders at it too)")
    # sampling: where unset, the verifier's recorded defaults (pipeline.sampling resolves them)
    cfg_scale: float | None = knob(None, "the guidance scale (null: the verifier's recorded one)")
    cfg_schedule: str | None = knob(None, "constant | linear: the guidance scale along the raster, every model's "
                                          "(null: the verifier's recorded one)")
    temperature: float | None = knob(None, "the sampling temperature (null: the verifier's recorded one)")
    top_k: int | None = knob(None, "sample among the k most likely codes, 0: all (null: the verifier's recorded)")
    top_p: float | None = knob(None, "nucleus sampling mass (null: the verifier's recorded one)")
    # MuLo-SD's models (its decoding knobs are MuLoSDConfig's)
    r: int = knob(2, "the verifier's grid over the drafter's: 2 | 4")
    upsampler: str = knob("latent", "latent: the trained U_r | pixel: decode, resize (sr), re-encode")
    stage: str = knob("gan", "the latent up-sampler's loss stage: " + " | ".join(SAMPLER_STAGES))
    sr: str = knob("bicubic", "upsampler=pixel: bicubic | lanczos | a weights file spandrel reads (.pth, .pt, .ckpt, "
                              ".safetensors) | an SR network of experiment=pixel_sr (zoo name or directory)")
    models: InferModelsConfig = field(default_factory=InferModelsConfig, metadata={"help": "the models"})
    llamagen: LlamaGenConfig = field(default_factory=LlamaGenConfig, metadata={"help": "backbone=llamagen_t2i"})
    tar: TarConfig = field(default_factory=TarConfig, metadata={"help": "backbone=tar"})
    wandb: str = knob("disabled", "disabled | offline | online: log the run's summary (what sweeps optimise)")
    wandb_project: str = knob("mulosd", "the W&B project")


KNOBS = command_line_knobs(s.config for s in STRATEGIES.values() if s.config is not None)
InferConfig = make_dataclass(
    "InferConfig", [(key, kind, knob(default, help)) for key, (kind, default, help) in KNOBS.items()],
    bases=(InferOptions,))
InferConfig.__module__ = __name__
InferConfig.__doc__ = "infer.py's options: InferOptions and every strategy's knobs (decoding/knobs.py)."
assert not {f.name for f in fields(InferOptions)} & set(KNOBS), "a knob belongs to its strategy, not to InferOptions"


def register() -> None:
    ConfigStore.instance().store(name="infer_schema", node=InferConfig)


def validate_infer(cfg: DictConfig) -> None:
    check_keys(cfg, InferConfig)
    one_of(cfg.decoding, (*STRATEGIES, "reference"), "decoding")  # today's registry: a strategy registered later too
    one_of(cfg.backbone, BACKBONES, "backbone")
    one_of(cfg.device, ("cpu", "cuda"), "device")
    require(cfg.devices >= 1, "devices", f"must be >= 1, got {cfg.devices}")
    require(cfg.devices == 1 or not cfg.compare, "compare", "compare=true decodes on one device (devices=1)")
    require(cfg.compare_repeats >= 1, "compare_repeats", f"must be >= 1, got {cfg.compare_repeats}")
    require(cfg.threads is None or cfg.threads >= 1, "threads", f"must be >= 1, got {cfg.threads}")
    require(cfg.seed >= 0, "seed", f"must be >= 0, got {cfg.seed}")
    one_of(cfg.llamagen.dtype, ("float32", "bfloat16"), "llamagen.dtype")
    if cfg.backbone != "synthscenes":  # the released backbones: no small same-resolution drafter, no world
        released = [name for name, s in STRATEGIES.items() if s.drafts_with != "small"]
        require(cfg.decoding in released, "decoding", f"{cfg.backbone} decodes with {', '.join(released)} (no small "
                "same-resolution drafter of it is released; reference draws SynthScenes only)")
    require(cfg.backbone != "llamagen_t2i" or cfg.r == 2, "r", "llamagen_t2i decodes with r=2 (stage 1 256 px -> "
            "stage 2 512 px)")
    one_of(cfg.tar.dtype, ("float32", "bfloat16"), "tar.dtype")
    one_of(cfg.tar.resolution, (512, 1024), "tar.resolution")
    one_of(cfg.tar.scale, (0, 1, 2), "tar.scale")
    if cfg.backbone == "tar":
        require(cfg.r == cfg.tar.resolution // 256, "r", f"tar at {cfg.tar.resolution} px over the 256 px drafter "
                f"is r={cfg.tar.resolution // 256}, got r={cfg.r}")
    require(cfg.size is None or cfg.size >= 8 and cfg.size % 8 == 0, "size",
            f"must be a positive multiple of 8, got {cfg.size}")
    require(cfg.size is None or cfg.backbone == "synthscenes", "size", f"the SynthScenes models' size; "
            f"backbone={cfg.backbone} fixes its own (llamagen: stage 2's 512 px, tar: tar.resolution)")
    require(cfg.batch_size >= 1, "batch_size", f"must be >= 1, got {cfg.batch_size}")
    require(bool(cfg.prompt or cfg.prompts or cfg.prompt_file), "prompt", "give prompt=, prompts=[...] or "
            "prompt_file=")
    one_of(cfg.r, RATIOS, "r")
    one_of(cfg.upsampler, ("latent", "pixel"), "upsampler")
    one_of(cfg.stage, SAMPLER_STAGES, "stage")
    require(cfg.sr in TRAINING_FREE_SR or Path(cfg.sr).is_file() or (Path(cfg.sr) / "config.json").is_file()
            or (ZOO / cfg.sr / "config.json").is_file(), "sr",
            f"{cfg.sr!r} is not bicubic, lanczos, a weights file, or an SR export (zoo name or directory)")
    for knobs in {s.config for s in STRATEGIES.values() if s.config is not None}:  # every strategy's own checks
        from_config(knobs, cfg)
    # the command line keeps tau a threshold on a probability; MuLoSDConfig also takes tau > 1 (reject every draft)
    require(cfg.tau <= 1, "tau", f"must be in [0, 1], got {cfg.tau}")
    if cfg.cfg_schedule is not None:
        one_of(cfg.cfg_schedule, GUIDANCE_SCHEDULES, "cfg_schedule")
    require(cfg.cfg_scale is None or cfg.cfg_scale >= 0, "cfg_scale", f"must be >= 0, got {cfg.cfg_scale}")
    require(cfg.temperature is None or cfg.temperature >= 0, "temperature", "must be >= 0")
    require(cfg.top_k is None or cfg.top_k >= 0, "top_k", "must be >= 0")
    require(cfg.top_p is None or 0 < cfg.top_p <= 1, "top_p", "must be in (0, 1]")
    one_of(cfg.wandb, WANDB_MODES, "wandb")
