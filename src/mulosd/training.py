"""What `python train.py` runs: validate the config, then run its task.

Tasks: `fit` trains the model an experiment names (the tokenizer, AR models and samplers join with their
issues); `inspect_data` streams batches through the data pipeline and reports what it saw.
"""

from __future__ import annotations

import logging
import pickle
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from .config import ConfigError
from .config.train import validate_model, validate_train
from .data.datamodule import ShardDataModule, synth_radius
from .data.images import to_image
from .paths import CONF
from .viz import captioned_grid

log = logging.getLogger(__name__)


def available_experiments() -> list[str]:
    return sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def build_datamodule(cfg: DictConfig) -> ShardDataModule:
    d = cfg.data
    return ShardDataModule(train_urls=d.train_urls, val_urls=d.val_urls, image_size=d.image_size, ratios=d.ratios,
                           batch_size=d.batch_size, num_workers=d.num_workers, shuffle_buffer=d.shuffle_buffer,
                           resampled=d.resampled, batches_per_epoch=d.batches_per_epoch,
                           val_batches=d.val_batches, max_image_pixels=d.max_image_pixels, seed=cfg.seed,
                           synth=d.synth)


def build_logger(cfg: DictConfig, run_dir: Path):
    """The configured Lightning logger, or False; its files go to `logger.save_dir`, by default RUN/logs (a
    W&B run directory in the working directory would land in the repository). W&B gets the config as a plain
    dict (never a DictConfig)."""
    lg = cfg.logger
    if lg.name == "none":
        return False
    save_dir = Path(lg.save_dir) if lg.save_dir else run_dir / "logs"
    save_dir.mkdir(parents=True, exist_ok=True)
    if lg.name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir, name=cfg.run_name or "mulosd")
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project=lg.project, save_dir=str(save_dir), name=cfg.run_name, entity=lg.entity,
                         tags=list(lg.tags), mode=lg.mode, config=OmegaConf.to_container(cfg, resolve=True),
                         settings=wandb.Settings(quiet=True))  # W&B's banner lines; errors and the sync hint stay
    # Lightning always passes `anonymous`, a setting W&B warns is gone whatever its value
    getattr(logger, "_wandb_init", {}).pop("anonymous", None)
    return logger


def cpu_runs_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (oneDNN: AVX-512 or AMX); without it, bf16 autocast falls
    back to a reference path many times slower than fp32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def build_trainer(cfg: DictConfig, logger=False, callbacks=(), default_root_dir: Path | None = None,
                  **overrides) -> L.Trainer:
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True) | overrides
    if kwargs["accelerator"] == "cpu" and str(kwargs["precision"]).startswith("bf16") and not cpu_runs_bf16():
        # on the CPU bf16 is a speed choice only (fp32 master weights either way): where it is slower, skip it
        log.warning(f"trainer.precision={kwargs['precision']}: this CPU has no native bfloat16 "
                    f"({torch.backends.cpu.get_cpu_capability()}), training in 32-true instead")
        kwargs["precision"] = "32-true"
    return L.Trainer(logger=logger, callbacks=list(callbacks), default_root_dir=default_root_dir, **kwargs)


def build_module(model_cfg: DictConfig) -> L.LightningModule:
    """The LightningModule for a validated `model` config, given it as its typed dataclass (config/train.py)."""
    validated = validate_model(model_cfg)
    if validated.name == "ar":  # the derived sizes first: TransformerConfig checks and derives from them once
        _derive_transformer(validated)
    m = OmegaConf.to_object(validated)
    if m.name == "tokenizer":
        from .lit.tokenizer import TokenizerModule

        return TokenizerModule(m)
    if m.name == "ar":
        from .lit.ar import ARModule

        try:
            return ARModule(m)
        except (FileNotFoundError, ValueError) as e:  # init_from: missing, or another architecture or tokenizer
            if not m.init_from:
                raise
            raise ConfigError("model.init_from", str(e)) from None
    if m.name == "sampler":
        from .lit.sampler import SamplerModule
        from .zoo import resolve, tokenizer_identity

        for key, find in (("tokenizer", tokenizer_identity), ("init_from", resolve)):
            try:
                if getattr(m, key):
                    find(getattr(m, key))
            except FileNotFoundError as e:
                raise ConfigError(f"model.{key}", str(e)) from None
        try:
            return SamplerModule(m)
        except ValueError as e:  # a sampler to start from that was trained on another tokenizer
            raise ConfigError("model.init_from", str(e)) from None
    raise ConfigError("model.name", f"unknown model {m.name!r}")


def _derive_transformer(m: DictConfig) -> None:
    """An AR model's vocab_size, grid, prefix and grids, set in its validated config from the tokenizer, the
    resolutions and the caption encoder."""
    from .data.synthscenes.encoder import SceneCaptionEncoder
    from .zoo import read_config

    try:
        vq = read_config(m.tokenizer)["config"]
    except FileNotFoundError as e:
        raise ConfigError("model.tokenizer", str(e)) from None
    f = 2 ** (len(vq["ch_mult"]) - 1)
    for key, res in [("model.resolution", m.resolution)] + [("model.resolutions", r) for r in m.resolutions]:
        if res % f:
            raise ConfigError(key, f"{res} is not a multiple of the tokenizer's downsample factor {f}")
    grids = sorted({r // f for r in m.resolutions}) if len(set(m.resolutions)) > 1 else []
    m.transformer.vocab_size, m.transformer.grid = vq["codebook_size"], m.resolution // f
    m.transformer.prefix, m.transformer.grids = SceneCaptionEncoder.prefix, grids


class _BatchProgressBar(TQDMProgressBar):
    """Counts batches out of model.train.batches (Lightning's total is max_steps: optimizer steps, 2 per batch
    for the G/D modules)."""

    def __init__(self, batches: int):
        super().__init__()
        self._batches = batches

    @property
    def total_train_batches(self) -> int:
        return self._batches

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        # a resumed run starts mid-epoch, where Lightning skips on_train_epoch_start: without this its bar has no
        # total, no epoch, and a rate counted as if the checkpoint's batches had been trained in this segment
        bar = self.train_progress_bar
        bar.total, bar.initial, bar.n = self.total_train_batches, pl_module.batches_seen, pl_module.batches_seen
        bar.set_description(f"Epoch {trainer.current_epoch}")


def _batch_checkpoint(per_batch: int, **kw):
    """Lightning's ModelCheckpoint, its files named by training batches (`batch{batch}`): Lightning counts
    optimizer steps, two per batch for a GAN, so a 100-batch run's checkpoint would say step200."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    class BatchCheckpoint(ModelCheckpoint):
        def format_checkpoint_name(self, metrics, *args, **kwargs):
            metrics = {**metrics, "batch": metrics.get("step", 0) // per_batch}
            return super().format_checkpoint_name(metrics, *args, **kwargs)

    return BatchCheckpoint(**kw)


def fit(cfg: DictConfig, run_dir: Path) -> L.LightningModule:
    """Train cfg.model; checkpoints every `model.train.ckpt_every` batches under RUN/checkpoints (last.ckpt
    to resume with ckpt_path=...), then export the weights to RUN/export (safetensors + config.json)."""
    from lightning.pytorch.callbacks import OnExceptionCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from .atomic import remove_stale_temporaries
    from .lit.resume import AtomicCheckpointIO, ConsumedKeys

    if cfg.model is None:
        raise ConfigError("model", "no model to train: choose an experiment, python train.py experiment=NAME "
                          f"({', '.join(available_experiments())})")
    if cfg.ckpt_path and not Path(cfg.ckpt_path).is_file():
        raise ConfigError("ckpt_path", f"{cfg.ckpt_path} does not exist (refusing to silently start fresh)")
    if cfg.trainer.max_steps != -1:
        raise ConfigError("trainer.max_steps", "set the length with model.train.batches instead")
    ckpt_dir = run_dir / "checkpoints"
    if not cfg.ckpt_path and (ckpt_dir / "last.ckpt").exists():
        # with OnExceptionCheckpoint among the callbacks, Lightning turns fit(ckpt_path=None) into "last" and
        # would silently resume this directory's run: resuming is only ever asked for explicitly here
        raise ConfigError("ckpt_path", f"{ckpt_dir} already holds a run: resume it with ckpt_path={ckpt_dir}/"
                                       "last.ckpt, or train into a new hydra.run.dir")
    module = build_module(cfg.model)
    removed = remove_stale_temporaries(ckpt_dir)
    if removed:
        print(f"removed {removed} temporary file(s) a killed checkpoint write left in {ckpt_dir}", file=sys.stderr)
    sched = cfg.model.train
    per_batch = module.optimizer_steps_per_batch
    callbacks = [_batch_checkpoint(per_batch, dirpath=ckpt_dir, filename="batch{batch}", save_last=True,
                                   save_top_k=1, every_n_train_steps=per_batch * sched.ckpt_every,
                                   auto_insert_metric_name=False),
                 OnExceptionCheckpoint(ckpt_dir, filename="on_exception")]
    if cfg.data.log_keys:
        callbacks.append(ConsumedKeys(run_dir))
    if cfg.trainer.get("enable_progress_bar", True):  # Lightning refuses a bar callback when bars are off
        callbacks.append(_BatchProgressBar(sched.batches))
    # fast_dev_run=N means N batches; Lightning counts it in optimizer steps
    fast = {"fast_dev_run": per_batch * int(cfg.trainer.fast_dev_run)} if cfg.trainer.fast_dev_run else {}
    trainer = build_trainer(cfg, build_logger(cfg, run_dir), callbacks, default_root_dir=run_dir, **fast,
                            max_steps=per_batch * sched.batches, val_check_interval=sched.val_every,
                            check_val_every_n_epoch=None, limit_val_batches=sched.val_batches,
                            plugins=[AtomicCheckpointIO()])
    dm = module.datamodule(build_datamodule(cfg), cfg)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
        if cfg.trainer.fast_dev_run and per_batch > 1:
            # fast_dev_run's step budget ends the fit before the epoch-end validation: run it explicitly
            trainer.validate(module, datamodule=dm, verbose=False)
    except pickle.UnpicklingError as e:  # a resume checkpoint holding more than weights: never unpickled
        raise ConfigError("ckpt_path", f"{cfg.ckpt_path} is not a weights-only checkpoint, refused to load it "
                                       f"({str(e).splitlines()[0][:200]})") from None
    except SIGTERMException:  # a SystemExit with status 0: a scheduler must see the interruption
        print(f"interrupted by SIGTERM after batch {module.batches_seen}; resume with "
              f"ckpt_path={ckpt_dir}/on_exception.ckpt", file=sys.stderr)
        sys.exit(143)
    log.info(f"trained {module.batches_seen} batches ({dm.summary()})")
    if not cfg.trainer.fast_dev_run and trainer.is_global_zero:
        out = _export(module, cfg, run_dir, _recipe())
        log.info(f"exported -> {out}")
    return module


def export(cfg: DictConfig, run_dir: Path) -> Path:
    """task=export: a checkpoint's weights (the EMA copy where the run keeps one) exported as a finished fit
    exports them, to evaluate a long run part-way without stopping it:
    python train.py experiment=zoo_ar_v2 task=export ckpt_path=RUN/checkpoints/last.ckpt hydra.run.dir=OUT"""
    if not cfg.ckpt_path or not Path(cfg.ckpt_path).is_file():
        raise ConfigError("ckpt_path", f"task=export needs an existing checkpoint, got {cfg.ckpt_path!r}")
    module = build_module(cfg.model)
    try:
        checkpoint = torch.load(cfg.ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConfigError("ckpt_path", f"{cfg.ckpt_path} is not a weights-only checkpoint, refused to load it "
                                       f"({str(e).splitlines()[0][:200]})") from None
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except (KeyError, RuntimeError) as e:
        raise ConfigError("ckpt_path", f"{cfg.ckpt_path} does not fit model={cfg.model.name} as configured "
                                       f"({' '.join(str(e).split())[:200]})") from None
    module.on_load_checkpoint(checkpoint)
    out = _export(module, cfg, run_dir, f"{_recipe()} (batch {module.batches_seen} of the run)")
    log.info(f"exported batch {module.batches_seen} of {cfg.ckpt_path} -> {out}")
    return out


def _export(module: L.LightningModule, cfg: DictConfig, run_dir: Path, recipe: str) -> Path:
    """RUN/export, which also records the SynthScenes geometry the run trained on (what its prompts look like
    for FD-VGG and `decoding=reference`)."""
    from .zoo import annotate

    out = module.export(run_dir / "export", recipe=recipe)
    synth = cfg.data.get("synth")
    if synth is not None:
        annotate(out, world={"radius": list(synth_radius(synth))})
    return out


def _recipe() -> str:
    from hydra.core.hydra_config import HydraConfig

    try:
        return "python train.py " + " ".join(HydraConfig.get().overrides.task)
    except ValueError:
        return "python train.py (composed programmatically)"


def inspect_data(cfg: DictConfig, run_dir: Path) -> dict:
    """Stream `inspect.num_batches` batches: throughput, skipped/converted counts, and a picture of batch 0."""
    dm = build_datamodule(cfg)
    dm.prepare_data()
    stats, n = dm.stats["train"], cfg.inspect.num_batches
    first, start, warm = None, time.perf_counter(), None
    for i, batch in enumerate(tqdm(dm.train_dataloader(), total=n, desc="streaming", unit="batch")):
        stats.update(batch)
        if first is None:
            first, warm = batch, time.perf_counter()
        if i + 1 >= n:
            break
    if first is None:
        raise ConfigError("data.train_urls", f"no batch came out of {dm.train_urls}: {stats.summary()}")
    elapsed = time.perf_counter() - warm
    rate = (stats.samples - len(first["key"])) / elapsed if elapsed > 0 and stats.samples > len(first["key"]) else 0.0
    run_dir.mkdir(parents=True, exist_ok=True)
    tiles = []
    for j in range(min(len(first["key"]), cfg.inspect.grid_rows * 4)):
        size = first["image"].shape[-1]
        views = [to_image(first["image"][j])]
        views += [np.kron(to_image(first["low"][r][j]), np.ones((r, r, 1), dtype=np.uint8)) for r in first["low"]]
        tiles.append(np.concatenate(views, axis=1)[:size])
    ratios = ", ".join(f"/{r}" for r in first["low"])
    picture = run_dir / "batch0.png"
    captioned_grid(tiles, first["caption"][:len(tiles)], cols=4, tile=128, lines=3).save(picture)
    log.info(f"inspect_data: {stats.summary()}")
    log.info(f"inspect_data: {rate:.1f} samples/s after the first batch (first batch after "
          f"{warm - start:.1f} s); batch 0 (full size | {ratios}) -> {picture}")
    return {"samples": stats.samples, "counts": dict(stats.counts), "samples_per_s": rate, "picture": str(picture)}


def run(cfg: DictConfig, run_dir: Path):
    validate_train(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    return {"fit": fit, "inspect_data": inspect_data, "export": export}[cfg.task](cfg, run_dir)
