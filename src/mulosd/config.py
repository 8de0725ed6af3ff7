"""Structured config schemas, registered with Hydra, and the checks run before any work starts.

Every config group's YAML is merged onto a dataclass here, so a typo'd key (in YAML or on the command
line) or a value of the wrong type fails at composition with the full key named. `validate` then catches
what types cannot: keys smuggled in with `++`, and values out of range. Both end as one-line errors.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .ar.backbone import GUIDANCE_SCHEDULES
from .ar.transformer import TransformerConfig
from .data.synthscenes import vocab
from .decoding import STRATEGY_CONFIGS, STRATEGY_NAMES, KnobError, from_config
from .losses.image_loss import ImageLossConfig
from .paths import CONF
from .tokenizer.vq import VQConfig


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the full key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass
class SynthShardsConfig:
    """A SynthScenes shard set written on first use (DataModule.prepare_data)."""

    dir: str = "data/shards/synthscenes128"
    train_shards: int = 32
    first_shard: int = 0  # train on shards first_shard .. first_shard+train_shards-1 (fresh scenes for a new cycle)
    val_shards: int = 2
    per_shard: int = 256
    size: int = 128
    seed: int = 0
    image_format: str = "png"
    # object half-size range as fractions of the image side (None: the world's, vocab.RADIUS_RANGE); a
    # shard set of another geometry needs its own `dir`
    radius: list[float] | None = None


@dataclass
class DataConfig:
    name: str = MISSING
    train_urls: str | None = None  # paths, brace patterns, pipe: commands or http(s) URLs
    val_urls: str | None = None
    image_size: int = 128
    ratios: list[int] = field(default_factory=lambda: [2, 4])  # low-res versions S/r yielded with each image
    batch_size: int = 16
    num_workers: int = 2
    shuffle_buffer: int = 1000
    resampled: bool = True  # training draws shards with replacement (infinite stream)
    batches_per_epoch: int = 0  # 0: one endless epoch with resampling (training stops at max_steps)
    val_batches: int = 0  # 0: the whole validation split
    max_image_pixels: int = 64_000_000
    synth: SynthShardsConfig | None = None
    token_cache: str = "data/tokens"  # token grids computed once per tokenizer for the AR models
    # RUN/consumed_keys.jsonl: each trained batch's sample keys (what a run saw; the resume battery reads it).
    # About 20 bytes per sample: turn off for very long runs on large batches.
    log_keys: bool = True


@dataclass
class TrainerConfig:
    """Passed to lightning.Trainer as keyword arguments."""

    accelerator: str = "cpu"
    devices: Any = 1
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    max_steps: int = -1
    max_epochs: int | None = None
    val_check_interval: Any = None
    check_val_every_n_epoch: int | None = 1
    limit_val_batches: Any = None
    log_every_n_steps: int = 50
    enable_progress_bar: bool = True
    fast_dev_run: Any = False
    deterministic: bool = False
    max_time: str | None = None  # "DD:HH:MM:SS": stop there, checkpoint and export (a GPU run's time budget)


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | csv | none
    project: str = "mulosd"
    mode: str = "offline"  # wandb: online | offline | disabled
    save_dir: str | None = None  # None: the run directory's logs/ (never the repository)
    entity: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class InspectConfig:
    num_batches: int = 20
    grid_rows: int = 4  # rows of the saved picture of the first batch


@dataclass
class OptimConfig:
    lr: float = 2e-4
    d_lr: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.5, 0.9])
    clip_g: float = 1.0  # gradient-norm clipping per optimizer (manual optimisation)
    clip_d: float = 1.0
    # stable-then-decay: constant lr, then linear decay to 0 over the last decay_batches batches of
    # train.batches (0 = constant). A constant-lr checkpoint can therefore be resumed into its decay.
    decay_batches: int = 0


@dataclass
class ScheduleConfig:
    batches: int = 3000  # training length in batches (Lightning's max_steps counts optimizer steps)
    seed: int = 0  # the module's own generators (crops, caption dropout, batch order)
    ckpt_every: int = 250  # batches
    val_every: int = 500  # batches
    val_batches: int = 4


@dataclass
class TokenizerScheduleConfig(ScheduleConfig):
    crop: int = 64  # random crop of the full-size image; the low-res versions are used whole


@dataclass
class TokenizerModelConfig:
    name: str = "tokenizer"
    vq: VQConfig = field(default_factory=VQConfig)
    loss: ImageLossConfig = field(default_factory=lambda: ImageLossConfig(disc_start=2000))
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TokenizerScheduleConfig = field(default_factory=TokenizerScheduleConfig)


@dataclass
class SampleConfig:
    """How validation samples (and the AR report) are drawn."""

    cfg_scale: float = 3.0
    cfg_schedule: str = "constant"  # constant | linear (ar.backbone.guidance_scale: 1 -> 2 cfg_scale - 1 on the raster)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class AROptimConfig:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.05
    warmup_batches: int = 200
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at train.batches
    clip: float = 1.0


@dataclass
class ARModelConfig:
    name: str = "ar"
    tokenizer: str = "synthscenes_vq_f8"  # zoo name or exported directory
    resolution: int = 128  # image side; the grid is resolution / the tokenizer's downsample factor
    # a multi-resolution model: one transformer trained on the grids of all these image sides together
    # (resolution among them is its default); [] = a model of `resolution` alone
    resolutions: list[int] = field(default_factory=list)
    cond_dropout: float = 0.1  # caption dropout (the null condition) for classifier-free guidance
    object_weight: float = 1.0  # loss weight of the tokens that hold an object (SynthScenes knows its masks)
    ema: float = 0.0  # decay of an EMA of the weights, used for validation and export (0 = none)
    # the copy validation samples and the export use when there is an EMA: "raw" where the EMA still lags at the
    # end of a short schedule (val/ce against val/ce_raw says which is better; task=export re-exports either)
    export_weights: str = "ema"
    compile: bool = False  # the training forward and backward through torch.compile (docs/zoo_v2.md measures it)
    # start from an exported AR model of the same architecture and tokenizer (zoo name or exported directory),
    # or of fewer layers, grown in depth: a new training cycle from a finished one; the optimizer, schedule and
    # EMA start afresh
    init_from: str | None = None
    # vocab_size, grid and prefix are derived from the tokenizer, the resolution and the caption encoder
    # the zoo's architecture (TransformerConfig's own defaults are a generic model's)
    transformer: TransformerConfig = field(
        default_factory=lambda: TransformerConfig(dim=192, layers=6, heads=6, cond_dim=192))
    sample: SampleConfig = field(default_factory=SampleConfig)
    optim: AROptimConfig = field(default_factory=AROptimConfig)
    train: ScheduleConfig = field(default_factory=ScheduleConfig)


@dataclass
class SamplerLossConfig:
    """Selected by the `loss` group: token_ce | mse_lpips | gan."""

    stage: str = "token_ce"
    commitment: float = 0.25  # pulls the continuous latents towards their codes (stages 2 and 3)
    image: ImageLossConfig = field(default_factory=lambda: ImageLossConfig(pixel="mse", gan="none"))


@dataclass
class SamplerModelConfig:
    name: str = "sampler"
    kind: str = "up"  # up (U_r) | down (D_r)
    r: int = 2
    tokenizer: str = "synthscenes_vq_f8"
    width: int = 128
    depth: int = 4
    init_from: str | None = None  # an earlier stage's sampler (zoo name or exported directory)
    loss: SamplerLossConfig = field(default_factory=SamplerLossConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    train: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(batches=1500))


MODEL_SCHEMAS = {"tokenizer": TokenizerModelConfig, "ar": ARModelConfig, "sampler": SamplerModelConfig}


@dataclass
class TrainConfig:
    task: str = "fit"  # fit | inspect_data | export (a checkpoint's weights, ckpt_path=, as a fit exports them)
    seed: int = 0
    run_name: str | None = None
    ckpt_path: str | None = None  # resume from this checkpoint (e.g. RUN/checkpoints/last.ckpt)
    r: int = 2  # the resolution ratio of the samplers (a top-level knob: `experiment=upsampler_gan r=4`)
    # the frozen tokenizer of AR and sampler models: a zoo name, an exported directory, or llamagen_vq16
    tokenizer: str = "synthscenes_vq_f8"
    model: Any = None  # one of MODEL_SCHEMAS, chosen by the `model` config group
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)


@dataclass
class InferModelsConfig:
    """Zoo names or exported directories; None = the shipped SynthScenes model for this r / stage."""

    tokenizer: str = "synthscenes_vq_f8"
    verifier: str = "synthscenes_ar_v2"
    drafter: str | None = None  # the verifier itself where it draws at 128/r px (r=2), else synthscenes_ar_{128/r}
    small: str = "synthscenes_ar_128_small"  # the same-resolution drafter of sd / lantern
    up: str | None = None  # synthscenes_up{r}_{stage}
    down: str | None = None  # synthscenes_down{r}


@dataclass
class LlamaGenConfig:
    """backbone=llamagen_t2i: where upstream's checkpoint files are (see mulosd.llamagen.checkpoints)."""

    ckpt_dir: str | None = None  # default ~/.cache/mulosd/llamagen (or $MULOSD_LLAMAGEN_DIR)
    t5: str = "google/flan-t5-xl"  # a hub name in the local cache, or a directory
    download: bool = True  # fetch missing files from the hub when it is reachable
    dtype: str = "bfloat16"  # float32 | bfloat16 (GPU)


@dataclass
class TarConfig:
    """backbone=tar: Tar's files (see mulosd.tar.checkpoints) and its LLM stage."""

    ckpt_dir: str | None = None  # default ~/.cache/mulosd/tar (or $MULOSD_TAR_DIR)
    resolution: int = 512  # the AR-DTok verifier: 512 (r=2) | 1024 (r=4); the drafter is the 256 px one
    llm: str = "csuhan/Tar-1.5B"  # a hub repository (csuhan/Tar-7B-v0.1 too), or a directory
    scale: int = 0  # the LLM's <S{scale}>: 0 | 1 | 2 -> 729 | 169 | 81 TA-Tok ids per image
    features: str | None = None  # a .pt file of saved TA-Tok ids ([n], one for every prompt, or [prompts, n]):
    # skips the LLM
    download: bool = True  # fetch missing files from the hub when it is reachable
    dtype: str = "bfloat16"  # float32 | bfloat16 (GPU)


@dataclass
class InferConfig:
    backbone: str = "synthscenes"  # synthscenes (the shipped zoo) | llamagen_t2i (upstream weights, r=2) | tar
    device: str = "cpu"  # cpu | cuda
    # the backbone's decode step through torch.compile (inductor; static shapes, token counts padded to
    # buckets): compiled once per process and shape, at the first decode, which bench.py and compare=true
    # leave out of their timings
    compile: bool = False
    devices: int = 1  # > 1: the prompts decoded across this many processes (DDP: gloo on cpu, NCCL on cuda)
    prompt: str | None = "a dotted cyan cross and a striped blue circle on a photographic yellow background"
    prompts: list[str] = field(default_factory=list)  # used instead of `prompt` when given
    prompt_file: str | None = None  # one caption per line; used instead of both when given
    seed: int = 0
    batch_size: int = 8
    decoding: str = "mulosd"  # mulosd | ar | zipar | sd | lantern | sjd | reference
    compare: bool = False  # also decode with ar from the same seed: speed-up and both judge results
    compare_repeats: int = 3  # compare=true: timed runs of each, interleaved after a warm-up; the median ratio
    out_dir: str | None = None  # default: Hydra's run directory
    size: int = 128  # decoding=reference only (the models fix the size otherwise)
    # sampling (None: the verifier's recorded defaults)
    cfg_scale: float | None = None
    cfg_schedule: str | None = None  # constant | linear: the guidance scale along the raster (every model decoding)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    # MuLo-SD
    r: int = 2
    upsampler: str = "latent"  # latent | pixel
    stage: str = "gan"  # the latent up-sampler's loss stage (SAMPLER_STAGES): token_ce | mse_lpips | gan
    sr: str = "bicubic"  # pixel path: bicubic | lanczos
    # the defaults below are the bench's choices at r = 2, each measured in docs/results.md: tau 0.5 (with
    # acceptance=ratio) is the fastest setting whose GenEval interval against ar stays inside the quality target
    tau: float = 0.5
    pool_k: int = 64  # 64 of 1024 codes: LANTERN's share (1000 of 16384)
    delta: float | None = None
    radius: int = 1
    rejection: str = "local"
    expanded: str = "resample"  # resample | reverify: what happens to the positions the radius adds to R_X
    resample: str = "zipar"  # parallel | serial | zipar (an island's rows advance together)
    resample_window: int = 2  # ZipAR window for resample=zipar
    keep_rejected: bool = False  # rejected drafts stay in the verifier's context until resampled
    kv_refresh: str = "round"  # round | eager | none (see decoding/mulosd.py; eager measured no better)
    draft_rows: int = 4
    draft: str = "zipar"  # serial | zipar: how the drafter fills a block of draft_rows low-res rows
    draft_window: int = 1  # ZipAR window for draft=zipar
    draft_temperature: float | None = None  # the drafter's temperature (0 = its mode); None = the verifier's
    draft_cfg_scale: float | None = None  # the drafter's guidance scale; None = the verifier's
    relative: bool = False  # acceptance against the mode's pooled mass (see decoding/acceptance.py)
    # threshold: pooled mass >= tau (the paper) | sampled: with probability min(1, mass / tau) | ratio: min(1,
    # mass / (tau q)), q the drafter's pooled mass of the parent low-res token (docs/guide.md, "Decoding")
    acceptance: str = "ratio"
    # baselines
    gamma: int = 4  # sd / lantern draft length
    lantern_k: int = 64
    lantern_delta: float = 0.2
    window: int = 4  # zipar
    sjd_window: int = 16  # sjd: positions drafted and verified per forward
    models: InferModelsConfig = field(default_factory=InferModelsConfig)
    llamagen: LlamaGenConfig = field(default_factory=LlamaGenConfig)
    tar: TarConfig = field(default_factory=TarConfig)
    wandb: str = "disabled"  # disabled | offline | online: log the run's summary (what sweeps optimise)
    wandb_project: str = "mulosd"


@dataclass
class BenchConfig:
    n_prompts: int = 64
    prompt_seed: int = 4242  # the fixed held-out prompt set (mulosd.eval.prompt_set)
    seed: int = 0
    mode: str = "latency"  # latency: the table against ar at batch_size | throughput: images/s at each batch
    # also measure every point with infer.compile=true, interleaved with the eager one, and print the per-step
    # table against the roofline
    compile: bool = False
    batch_size: int = 1  # latency as the paper measures it; larger batches work too
    throughput_batches: list[int] = field(default_factory=lambda: [1, 8, 32])  # mode=throughput
    strategies: list[str] = field(default_factory=lambda: ["zipar", "sd", "lantern", "sjd", "mulosd"])  # + ar
    rs: list[int] = field(default_factory=lambda: [2, 4])
    taus: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4])
    radii: list[int] = field(default_factory=lambda: [0, 1])
    windows: list[int] = field(default_factory=list)  # ZipAR windows, one point each (empty: infer.window)
    # MuLo-SD variants measured side by side, name -> infer overrides: +variants.zip={resample:zipar}
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    fd: bool = True  # FD-VGG against the world's renders of the same prompts
    metrics: list[str] = field(default_factory=list)  # real metrics where their weights exist: fid, clip, hpsv2
    metrics_weights: dict[str, str] = field(default_factory=dict)  # metric -> local weights file
    resume: bool = True  # continue RUN/cells.jsonl instead of starting over
    out_dir: str | None = "outputs/bench"
    infer: InferConfig = field(default_factory=InferConfig)  # models, sampling and strategy defaults


TASKS = ("fit", "inspect_data", "export")
LOGGERS = ("wandb", "csv", "none")
WANDB_MODES = ("online", "offline", "disabled")
RATIOS = (2, 4)
SAMPLER_STAGES = ("token_ce", "mse_lpips", "gan")
DECODINGS = (*STRATEGY_NAMES, "reference")
BACKBONES = ("synthscenes", "llamagen_t2i", "tar")


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="infer_schema", node=InferConfig)
    cs.store(name="bench_schema", node=BenchConfig)


def check_keys(cfg: DictConfig, schema: type, prefix: str = "") -> DictConfig:
    """Reject keys the schema does not have (Hydra lets `++key=value` add them past the schema) and values
    of the wrong type; returns the config merged onto the schema (typed, defaults filled in)."""
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as e:
        key = prefix + str(getattr(e, "full_key", None) or "")
        raise ConfigError(key or "config", str(e).splitlines()[0]) from None


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def _one_of(value, options, key: str) -> None:
    _require(value in options, key, f"{value!r} is not one of {', '.join(map(str, options))}")


def validate_data(d: DataConfig | DictConfig, key: str = "data") -> None:
    _require(d.image_size >= 8 and d.image_size % 8 == 0, f"{key}.image_size",
             f"must be a positive multiple of 8, got {d.image_size}")
    for r in d.ratios:
        _one_of(r, RATIOS, f"{key}.ratios")
        _require(d.image_size % (8 * r) == 0, f"{key}.ratios",
                 f"image_size {d.image_size} / {r} must still be a multiple of 8")
    _require(d.batch_size >= 1, f"{key}.batch_size", f"must be >= 1, got {d.batch_size}")
    _require(d.num_workers >= 0, f"{key}.num_workers", f"must be >= 0, got {d.num_workers}")
    _require(d.shuffle_buffer >= 0, f"{key}.shuffle_buffer", f"must be >= 0, got {d.shuffle_buffer}")
    _require(d.batches_per_epoch >= 0, f"{key}.batches_per_epoch", f"must be >= 0, got {d.batches_per_epoch}")
    _require(d.max_image_pixels > 0, f"{key}.max_image_pixels", "must be > 0")
    if d.synth is None:
        _require(bool(d.train_urls), f"{key}.train_urls", "no shards given (see data/README.md)")
    else:
        s = d.synth
        for name in ("train_shards", "per_shard", "size"):
            _require(s[name] >= 1, f"{key}.synth.{name}", f"must be >= 1, got {s[name]}")
        _require(s.val_shards >= 0, f"{key}.synth.val_shards", "must be >= 0")
        _require(s.first_shard >= 0, f"{key}.synth.first_shard", f"must be >= 0, got {s.first_shard}")
        _require(s.seed >= 0, f"{key}.synth.seed", f"must be >= 0, got {s.seed}")
        _one_of(s.image_format, ("png", "jpg"), f"{key}.synth.image_format")
        if s.radius is not None:
            hi = vocab.MAX_RADIUS
            _require(len(s.radius) == 2 and 0 < s.radius[0] <= s.radius[1] <= hi, f"{key}.synth.radius",
                     f"must be [lo, hi] with 0 < lo <= hi <= {hi:.4f} (an object stays in its cell), got "
                     f"{list(s.radius)}")


def validate_model(m: DictConfig) -> DictConfig:
    _require("name" in m, "model.name", "missing")
    _one_of(m.name, tuple(MODEL_SCHEMAS), "model.name")
    m = check_keys(m, MODEL_SCHEMAS[m.name], prefix="model.")
    for name in ("ckpt_every", "val_every", "val_batches", "batches"):
        _require(m.train[name] >= 1, f"model.train.{name}", "must be >= 1")
    _require(m.train.seed >= 0, "model.train.seed", f"must be >= 0, got {m.train.seed}")
    return {"tokenizer": _validate_tokenizer, "ar": _validate_ar, "sampler": _validate_sampler}[m.name](m)


def _validate_sampler(m: DictConfig) -> DictConfig:
    _one_of(m.kind, ("up", "down"), "model.kind")
    _one_of(m.r, RATIOS, "model.r")
    _one_of(m.loss.stage, SAMPLER_STAGES, "model.loss.stage")
    _require(m.kind == "up" or m.loss.stage == "token_ce", "model.loss.stage",
             "the down-sampler trains with token_ce only")
    _require(m.width >= 8 and m.width % 4 == 0, "model.width", f"must be a multiple of 4, >= 8; got {m.width}")
    _require(m.depth >= 1, "model.depth", "must be >= 1")
    _require(m.optim.lr > 0 and m.optim.d_lr > 0, "model.optim.lr", "learning rates must be > 0")
    _require(0 <= m.optim.decay_batches <= m.train.batches, "model.optim.decay_batches",
             f"must be in [0, model.train.batches={m.train.batches}]")
    _require(m.loss.commitment >= 0, "model.loss.commitment", "must be >= 0")
    _one_of(m.loss.image.gan, ("hinge", "nonsaturating", "none"), "model.loss.image.gan")
    return m


def _validate_ar(m: DictConfig) -> DictConfig:
    t, o = m.transformer, m.optim
    _require(m.resolution >= 8, "model.resolution", f"must be >= 8, got {m.resolution}")
    _require(0 <= m.cond_dropout < 1, "model.cond_dropout", f"must be in [0, 1), got {m.cond_dropout}")
    _require(m.object_weight > 0, "model.object_weight", f"must be > 0, got {m.object_weight}")
    _require(not m.resolutions or m.resolution in m.resolutions, "model.resolutions",
             f"must include model.resolution={m.resolution}, got {list(m.resolutions)}")
    _require(0 <= m.ema < 1, "model.ema", f"must be in [0, 1), got {m.ema}")
    _one_of(m.export_weights, ("ema", "raw"), "model.export_weights")
    _require(t.dim % t.heads == 0 and (t.dim // t.heads) % 4 == 0, "model.transformer.heads",
             f"dim {t.dim} / heads {t.heads} must be a multiple of 4 (2D RoPE splits each head in four)")
    _require(t.layers >= 1, "model.transformer.layers", "must be >= 1")
    _require(o.lr > 0, "model.optim.lr", "must be > 0")
    _require(0 <= o.warmup_batches < m.train.batches, "model.optim.warmup_batches",
             f"must be in [0, model.train.batches={m.train.batches})")
    _require(m.sample.cfg_scale >= 0, "model.sample.cfg_scale", "must be >= 0")
    _one_of(m.sample.cfg_schedule, GUIDANCE_SCHEDULES, "model.sample.cfg_schedule")
    _require(m.sample.temperature >= 0, "model.sample.temperature", "must be >= 0")
    _require(0 < m.sample.top_p <= 1, "model.sample.top_p", "must be in (0, 1]")
    return m


def _validate_tokenizer(m: DictConfig) -> DictConfig:
    vq, loss, t = m.vq, m.loss, m.train
    _require(len(vq.ch_mult) >= 2, "model.vq.ch_mult", "needs at least two levels")
    _one_of(2 ** (len(vq.ch_mult) - 1), (8, 16), "model.vq.ch_mult (downsample factor 2**(len-1))")
    _require(vq.codebook_size >= 2, "model.vq.codebook_size", "must be >= 2")
    _one_of(loss.pixel, ("l1", "mse"), "model.loss.pixel")
    _one_of(loss.lpips_net, ("alex", "vgg"), "model.loss.lpips_net")
    _one_of(loss.gan, ("hinge", "nonsaturating", "none"), "model.loss.gan")
    _require(loss.disc_start >= 0, "model.loss.disc_start", "must be >= 0")
    _require(m.optim.lr > 0 and m.optim.d_lr > 0, "model.optim.lr", "learning rates must be > 0")
    _require(0 <= m.optim.decay_batches <= m.train.batches, "model.optim.decay_batches",
             f"must be in [0, model.train.batches={m.train.batches}], got {m.optim.decay_batches}")
    _require(t.crop % 2 ** (len(vq.ch_mult) - 1) == 0 and t.crop > 0, "model.train.crop",
             f"must be a positive multiple of the downsample factor {2 ** (len(vq.ch_mult) - 1)}")
    return m


def validate_train(cfg: DictConfig) -> None:
    check_keys(cfg, TrainConfig)
    _one_of(cfg.task, TASKS, "task")
    _require(cfg.seed >= 0, "seed", f"must be >= 0, got {cfg.seed}")  # seeding takes it modulo 2**32 otherwise
    _one_of(cfg.r, RATIOS, "r")
    if cfg.model is not None:
        m = validate_model(cfg.model)
        if m.name == "sampler":
            _require(m.r in cfg.data.ratios, "data.ratios",
                     f"the stream must yield the 1/{m.r} view the sampler trains on; got {list(cfg.data.ratios)}")
    validate_data(cfg.data)
    _one_of(cfg.logger.name, LOGGERS, "logger.name")
    _one_of(cfg.logger.mode, WANDB_MODES, "logger.mode")
    _require(cfg.inspect.num_batches >= 1, "inspect.num_batches", "must be >= 1")


def validate_infer(cfg: DictConfig) -> None:
    check_keys(cfg, InferConfig)
    _one_of(cfg.decoding, DECODINGS, "decoding")
    _one_of(cfg.backbone, BACKBONES, "backbone")
    _one_of(cfg.device, ("cpu", "cuda"), "device")
    _require(cfg.devices >= 1, "devices", f"must be >= 1, got {cfg.devices}")
    _require(cfg.devices == 1 or not cfg.compare, "compare", "compare=true decodes on one device (devices=1)")
    _require(cfg.compare_repeats >= 1, "compare_repeats", f"must be >= 1, got {cfg.compare_repeats}")
    _require(cfg.seed >= 0, "seed", f"must be >= 0, got {cfg.seed}")
    _one_of(cfg.llamagen.dtype, ("float32", "bfloat16"), "llamagen.dtype")
    _require(cfg.backbone != "llamagen_t2i" or (cfg.r == 2 and cfg.decoding not in ("sd", "lantern", "reference")),
             "backbone", "llamagen_t2i decodes with r=2 (stage 1 256 px -> stage 2 512 px) and ar, zipar, sjd or "
             "mulosd (no small same-resolution LlamaGen drafter is released; reference draws SynthScenes only)")
    _one_of(cfg.tar.dtype, ("float32", "bfloat16"), "tar.dtype")
    _one_of(cfg.tar.resolution, (512, 1024), "tar.resolution")
    _one_of(cfg.tar.scale, (0, 1, 2), "tar.scale")
    if cfg.backbone == "tar":
        _require(cfg.decoding not in ("sd", "lantern", "reference"), "decoding",
                 "tar decodes with ar, zipar, sjd or mulosd (no same-resolution AR-DTok drafter is released)")
        _require(cfg.r == cfg.tar.resolution // 256, "r", f"tar at {cfg.tar.resolution} px over the 256 px drafter "
                 f"is r={cfg.tar.resolution // 256}, got r={cfg.r}")
    _require(cfg.size >= 8 and cfg.size % 8 == 0, "size", f"must be a positive multiple of 8, got {cfg.size}")
    _require(cfg.batch_size >= 1, "batch_size", f"must be >= 1, got {cfg.batch_size}")
    _require(bool(cfg.prompt or cfg.prompts or cfg.prompt_file), "prompt", "give prompt=, prompts=[...] or "
             "prompt_file=")
    _one_of(cfg.r, RATIOS, "r")
    _one_of(cfg.upsampler, ("latent", "pixel"), "upsampler")
    _one_of(cfg.stage, SAMPLER_STAGES, "stage")
    _one_of(cfg.sr, ("bicubic", "lanczos"), "sr")
    for knobs in {c for c in STRATEGY_CONFIGS.values() if c is not None}:  # every strategy's own checks
        try:
            from_config(knobs, cfg)
        except KnobError as e:
            raise ConfigError(e.key, e.detail) from None
    # the command line keeps tau a threshold on a probability; MuLoSDConfig also takes tau > 1 (reject every draft)
    _require(cfg.tau <= 1, "tau", f"must be in [0, 1], got {cfg.tau}")
    if cfg.cfg_schedule is not None:
        _one_of(cfg.cfg_schedule, GUIDANCE_SCHEDULES, "cfg_schedule")
    for key in ("cfg_scale", "draft_cfg_scale"):  # NaN fails too
        _require(cfg[key] is None or cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
    _require(cfg.temperature is None or cfg.temperature >= 0, "temperature", "must be >= 0")
    _require(cfg.top_k is None or cfg.top_k >= 0, "top_k", "must be >= 0")
    _require(cfg.top_p is None or 0 < cfg.top_p <= 1, "top_p", "must be in (0, 1]")
    _one_of(cfg.wandb, WANDB_MODES, "wandb")


def validate_bench(cfg: DictConfig) -> None:
    check_keys(cfg, BenchConfig)
    _require(cfg.n_prompts >= 1, "n_prompts", f"must be >= 1, got {cfg.n_prompts}")
    for key in ("seed", "prompt_seed"):
        _require(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
    _require(cfg.batch_size >= 1, "batch_size", f"must be >= 1, got {cfg.batch_size}")
    _one_of(cfg.mode, ("latency", "throughput"), "mode")
    _require(len(cfg.throughput_batches) > 0 and all(b >= 1 for b in cfg.throughput_batches), "throughput_batches",
             f"must be batch sizes >= 1, got {list(cfg.throughput_batches)}")
    for s in cfg.strategies:
        _one_of(s, tuple(n for n in STRATEGY_NAMES if n != "ar"), "strategies")  # ar is always measured
    for r in cfg.rs:
        _one_of(r, RATIOS, "rs")
    for t in cfg.taus:
        _require(0 <= t <= 1, "taus", f"every tau must be in [0, 1], got {t}")
    for rad in cfg.radii:
        _require(rad >= 0, "radii", f"every radius must be >= 0, got {rad}")
    for w in cfg.windows:
        _require(w >= 1, "windows", f"every ZipAR window must be >= 1, got {w}")
    for m in cfg.metrics:
        _one_of(m, ("fid", "clip", "hpsv2"), "metrics")
    try:
        validate_infer(cfg.infer)
    except ConfigError as e:
        raise ConfigError("infer." + e.key, str(e).split(": ", 1)[1]) from None
    for name, overrides in cfg.variants.items():
        try:
            validate_infer(with_overrides(cfg.infer, overrides))
        except ConfigError as e:
            raise ConfigError(f"variants.{name}.{e.key}", str(e).split(": ", 1)[1]) from None


def with_overrides(cfg: DictConfig, overrides) -> DictConfig:
    """A copy of cfg with these keys set (a key cfg does not have is refused by the next validation)."""
    out = OmegaConf.create(OmegaConf.to_container(cfg))
    for key, value in (overrides or {}).items():
        OmegaConf.update(out, str(key), value, force_add=True)
    return out




def check_group_choices(argv: list[str], conf_dir: Path = CONF) -> None:
    """`group=option` overrides name an existing conf/group/option.yaml. Hydra reports a missing option in
    12-20 lines (every option, its search path); this says it in one line before Hydra starts. Sweeps
    (`loss=token_ce,gan`) are checked option by option; other sweep syntax is left to Hydra."""
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or "(" in value or "/" in key or "." in key or not (conf_dir / key).is_dir():
            continue
        options = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        for choice in value.split(","):
            if choice not in (*options, "null"):
                raise ConfigError(key, f"{choice!r} is not one of {', '.join(options)} (conf/{key}/)")


def check_model_chosen(argv: list[str], conf_dir: Path = CONF) -> None:
    """train.py: a `model.*` or `loss.*` setting needs a model to set it on (train.yaml chooses none). Without
    one Hydra reports a struct error and suggests `+key=`, which leads to `model.name: missing`."""
    keys = [a.lstrip("+~").partition("=")[0] for a in argv if "=" in a]
    if any(k in ("experiment", "model") for k in keys):
        return
    loose = [k for k in keys if k.split(".")[0] in ("model", "loss") and "." in k]
    if loose:
        experiments = ", ".join(sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml")))
        raise ConfigError(loose[0], f"no model is chosen to set it on: add experiment=NAME ({experiments}) or "
                                    "model=ar|sampler|tokenizer")


@contextlib.contextmanager
def exit_on_config_error():
    """Turn a ConfigError into one line on stderr and exit status 2, instead of a traceback."""
    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
