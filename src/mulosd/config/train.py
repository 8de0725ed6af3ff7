"""train.py's schema: the run (task, seed, resume), the data stream, Lightning's trainer, the logger, and one of
three models (tokenizer, AR, sampler), each nesting its modules' own config dataclasses (VQConfig,
TransformerConfig, ImageLossConfig: a class owns its config), which is why this module imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from ..ar.transformer import TransformerConfig
from ..choices import (
    GUIDANCE_SCHEDULES,
    LOGGERS,
    RATIOS,
    SAMPLER_KINDS,
    SAMPLER_STAGES,
    TASKS,
    UPSAMPLER_BASES,
    WANDB_MODES,
)
from ..data.synthscenes import vocab
from ..losses.image_loss import ImageLossConfig
from ..tokenizer.vq import VQConfig
from . import check_keys, one_of, require


@dataclass
class SynthShardsConfig:
    """A SynthScenes shard set written on first use (DataModule.prepare_data)."""

    dir: str = "data/shards/synthscenes128"  # where the shards are written (once) and read
    train_shards: int = 32  # training shards, each per_shard scenes
    first_shard: int = 0  # train on shards first_shard .. first_shard+train_shards-1 (fresh scenes for a new cycle)
    val_shards: int = 2  # validation shards (scenes from an index range the training shards never reach)
    per_shard: int = 256  # scenes per shard
    size: int = 128  # image side in pixels
    seed: int = 0  # the world seed the scenes are drawn from
    image_format: str = "png"  # how images are stored in the shards (png or jpg)
    # a shard set of another geometry needs its own `dir`
    radius: list[float] | None = None  # object half-size range, fractions of the side (None: the world's)


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
    synth: SynthShardsConfig | None = None  # the SynthScenes shards to write and read (data=synthscenes sets them)
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
    compile: bool = False  # the training forward and backward through torch.compile (docs/log.md, zoo v2 measures it)
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
    # stages 2 and 3: the weight of stage 1's token CE (the true code under the latent's cosines) kept while the
    # pixels are optimised: the pixel losses alone trade away the tokens the verifier tests
    ce_weight: float = 0.05
    image: ImageLossConfig = field(default_factory=lambda: ImageLossConfig(pixel="mse", gan="none"))


@dataclass
class SamplerModelConfig:
    name: str = "sampler"
    kind: str = "up"  # up (U_r) | down (D_r) | sr (the pixel path's SR network: upsampler=pixel sr=EXPORT)
    r: int = 2
    tokenizer: str = "synthscenes_vq_f8"
    width: int = 128  # channels (sr: SRVGG's num_feat)
    depth: int = 4  # residual blocks (sr: SRVGG's num_conv)
    base: str = "none"  # up only: none (from the low-res tokens alone) | bicubic (a correction of the pixel path)
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



def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def validate_data(d: DataConfig | DictConfig, key: str = "data") -> None:
    require(d.image_size >= 8 and d.image_size % 8 == 0, f"{key}.image_size",
            f"must be a positive multiple of 8, got {d.image_size}")
    for r in d.ratios:
        one_of(r, RATIOS, f"{key}.ratios")
        require(d.image_size % (8 * r) == 0, f"{key}.ratios",
                f"image_size {d.image_size} / {r} must still be a multiple of 8")
    require(d.batch_size >= 1, f"{key}.batch_size", f"must be >= 1, got {d.batch_size}")
    require(d.num_workers >= 0, f"{key}.num_workers", f"must be >= 0, got {d.num_workers}")
    require(d.shuffle_buffer >= 0, f"{key}.shuffle_buffer", f"must be >= 0, got {d.shuffle_buffer}")
    require(d.batches_per_epoch >= 0, f"{key}.batches_per_epoch", f"must be >= 0, got {d.batches_per_epoch}")
    require(d.max_image_pixels > 0, f"{key}.max_image_pixels", "must be > 0")
    if d.synth is None:
        require(bool(d.train_urls), f"{key}.train_urls", "no shards given (see data/README.md)")
    else:
        s = d.synth
        for name in ("train_shards", "per_shard", "size"):
            require(s[name] >= 1, f"{key}.synth.{name}", f"must be >= 1, got {s[name]}")
        require(s.val_shards >= 0, f"{key}.synth.val_shards", "must be >= 0")
        require(s.first_shard >= 0, f"{key}.synth.first_shard", f"must be >= 0, got {s.first_shard}")
        require(s.seed >= 0, f"{key}.synth.seed", f"must be >= 0, got {s.seed}")
        one_of(s.image_format, ("png", "jpg"), f"{key}.synth.image_format")
        if s.radius is not None:
            hi = vocab.MAX_RADIUS
            require(len(s.radius) == 2 and 0 < s.radius[0] <= s.radius[1] <= hi, f"{key}.synth.radius",
                    f"must be [lo, hi] with 0 < lo <= hi <= {hi:.4f} (an object stays in its cell), got "
                    f"{list(s.radius)}")


def validate_model(m: DictConfig) -> DictConfig:
    require("name" in m, "model.name", "missing")
    one_of(m.name, tuple(MODEL_SCHEMAS), "model.name")
    m = check_keys(m, MODEL_SCHEMAS[m.name], prefix="model.")
    for name in ("ckpt_every", "val_every", "val_batches", "batches"):
        require(m.train[name] >= 1, f"model.train.{name}", "must be >= 1")
    require(m.train.seed >= 0, "model.train.seed", f"must be >= 0, got {m.train.seed}")
    return {"tokenizer": _validate_tokenizer, "ar": _validate_ar, "sampler": _validate_sampler}[m.name](m)


def _validate_sampler(m: DictConfig) -> DictConfig:
    one_of(m.kind, SAMPLER_KINDS, "model.kind")
    one_of(m.r, RATIOS, "model.r")
    one_of(m.loss.stage, SAMPLER_STAGES, "model.loss.stage")
    require(m.kind != "down" or m.loss.stage == "token_ce", "model.loss.stage",
            "the down-sampler trains with token_ce only")
    require(m.kind != "sr" or m.loss.stage != "token_ce", "model.loss.stage",
            "the SR network makes pixels: it trains with mse_lpips or gan (loss=mse_lpips | loss=gan)")
    one_of(m.base, UPSAMPLER_BASES, "model.base")
    require(m.kind == "up" or m.base == "none", "model.base", "only the up-sampler U_r has a base")
    require(m.width >= 8 and m.width % 4 == 0, "model.width", f"must be a multiple of 4, >= 8; got {m.width}")
    require(m.depth >= 1, "model.depth", "must be >= 1")
    require(m.optim.lr > 0 and m.optim.d_lr > 0, "model.optim.lr", "learning rates must be > 0")
    require(0 <= m.optim.decay_batches <= m.train.batches, "model.optim.decay_batches",
            f"must be in [0, model.train.batches={m.train.batches}]")
    require(m.loss.commitment >= 0, "model.loss.commitment", "must be >= 0")
    require(m.loss.ce_weight >= 0, "model.loss.ce_weight", "must be >= 0")
    one_of(m.loss.image.gan, ("hinge", "nonsaturating", "none"), "model.loss.image.gan")
    return m


def _validate_ar(m: DictConfig) -> DictConfig:
    t, o = m.transformer, m.optim
    require(m.resolution >= 8, "model.resolution", f"must be >= 8, got {m.resolution}")
    require(0 <= m.cond_dropout < 1, "model.cond_dropout", f"must be in [0, 1), got {m.cond_dropout}")
    require(m.object_weight > 0, "model.object_weight", f"must be > 0, got {m.object_weight}")
    require(not m.resolutions or m.resolution in m.resolutions, "model.resolutions",
            f"must include model.resolution={m.resolution}, got {list(m.resolutions)}")
    require(0 <= m.ema < 1, "model.ema", f"must be in [0, 1), got {m.ema}")
    one_of(m.export_weights, ("ema", "raw"), "model.export_weights")
    require(t.dim % t.heads == 0 and (t.dim // t.heads) % 4 == 0, "model.transformer.heads",
            f"dim {t.dim} / heads {t.heads} must be a multiple of 4 (2D RoPE splits each head in four)")
    require(t.layers >= 1, "model.transformer.layers", "must be >= 1")
    require(o.lr > 0, "model.optim.lr", "must be > 0")
    require(0 <= o.warmup_batches < m.train.batches, "model.optim.warmup_batches",
            f"must be in [0, model.train.batches={m.train.batches})")
    require(m.sample.cfg_scale >= 0, "model.sample.cfg_scale", "must be >= 0")
    one_of(m.sample.cfg_schedule, GUIDANCE_SCHEDULES, "model.sample.cfg_schedule")
    require(m.sample.temperature >= 0, "model.sample.temperature", "must be >= 0")
    require(0 < m.sample.top_p <= 1, "model.sample.top_p", "must be in (0, 1]")
    return m


def _validate_tokenizer(m: DictConfig) -> DictConfig:
    vq, loss, t = m.vq, m.loss, m.train
    require(len(vq.ch_mult) >= 2, "model.vq.ch_mult", "needs at least two levels")
    one_of(2 ** (len(vq.ch_mult) - 1), (8, 16), "model.vq.ch_mult (downsample factor 2**(len-1))")
    require(vq.codebook_size >= 2, "model.vq.codebook_size", "must be >= 2")
    one_of(loss.pixel, ("l1", "mse"), "model.loss.pixel")
    one_of(loss.lpips_net, ("alex", "vgg"), "model.loss.lpips_net")
    one_of(loss.gan, ("hinge", "nonsaturating", "none"), "model.loss.gan")
    require(loss.disc_start >= 0, "model.loss.disc_start", "must be >= 0")
    require(m.optim.lr > 0 and m.optim.d_lr > 0, "model.optim.lr", "learning rates must be > 0")
    require(0 <= m.optim.decay_batches <= m.train.batches, "model.optim.decay_batches",
            f"must be in [0, model.train.batches={m.train.batches}], got {m.optim.decay_batches}")
    require(t.crop % 2 ** (len(vq.ch_mult) - 1) == 0 and t.crop > 0, "model.train.crop",
            f"must be a positive multiple of the downsample factor {2 ** (len(vq.ch_mult) - 1)}")
    return m


def validate_train(cfg: DictConfig) -> None:
    check_keys(cfg, TrainConfig)
    one_of(cfg.task, TASKS, "task")
    require(cfg.seed >= 0, "seed", f"must be >= 0, got {cfg.seed}")  # seeding takes it modulo 2**32 otherwise
    one_of(cfg.r, RATIOS, "r")
    if cfg.model is not None:
        m = validate_model(cfg.model)
        if m.name == "sampler":
            require(m.r in cfg.data.ratios, "data.ratios",
                    f"the stream must yield the 1/{m.r} view the sampler trains on; got {list(cfg.data.ratios)}")
    validate_data(cfg.data)
    one_of(cfg.logger.name, LOGGERS, "logger.name")
    one_of(cfg.logger.mode, WANDB_MODES, "logger.mode")
    require(cfg.inspect.num_batches >= 1, "inspect.num_batches", "must be >= 1")

