"""bench.py's schema: which strategies, over which knob values (each strategy's sweep axes in
decoding/registry.py), on which prompts, and the infer config every point starts from; the grid of points it
measures, what each point changes, and the cells a run stores. Imports no torch."""

from __future__ import annotations

import copy
import functools
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from ..choices import RATIOS
from ..decoding.knobs import command_line_knobs, knob
from ..decoding.registry import STRATEGIES
from . import ConfigError, check_keys, one_of, require, with_overrides
from .infer import KNOBS, InferConfig, validate_infer

# infer keys that drive a run rather than say what a point decodes
RUN_KEYS = {"device", "devices", "prompt", "prompts", "prompt_file", "seed", "batch_size", "decoding", "compare",
            "compare_repeats", "threads", "out_dir", "size", "wandb", "wandb_project"}
# ... and of those, the ones that change no image a point decodes beyond float rounding: two runs that differ only
# in them (a speed run at batch 1 on one thread, a quality run at batch 8) measure the same points. The size and
# the seed decode other images; another device, other kernels.
HOW_RUN_KEYS = RUN_KEYS - {"size", "seed", "device"}
# infer keys read only by a strategy that drafts with this kind of model (registry.Strategy.drafts_with)
DRAFT_KEYS = {"drafter": {"r", "upsampler", "stage", "sr", "models.drafter", "models.up", "models.down"},
              "small": {"models.small"}}


def swept(help: str, *values):
    """A list field of values a sweep axis takes (its default: these values)."""
    return field(default_factory=lambda: list(values), metadata={"help": help})


@dataclass
class BenchConfig:
    n_prompts: int = knob(64, "prompts of the held-out prompt set")
    prompt_seed: int = knob(4242, "the world seed of that prompt set (mulosd.eval.prompt_set)")
    seed: int = knob(0, "the decoding seed")
    mode: str = knob("latency", "latency: the table against ar at batch_size | throughput: images/s at each batch")
    compile: bool = knob(False, "also measure every point with infer.compile=true, interleaved with the eager one, "
                                "and print the per-step table against the roofline")
    batch_size: int = knob(1, "prompts per decode (1: latency as the paper measures it)")
    throughput_batches: list[int] = field(default_factory=lambda: [1, 8, 32],
                                          metadata={"help": "mode=throughput: the batch sizes"})
    strategies: list[str] = field(default_factory=lambda: [s for s in STRATEGIES if s != "ar"],
                                  metadata={"help": "the strategies measured against ar (always measured)"})
    # the sweep axes of decoding/registry.py (an empty list: the infer value, infer.KEY)
    rs: list[int] = swept("mulosd: the values of r (each needs its drafter and samplers: the zoo ships r = 2 "
                          "at 128 px, r = 2 and 4 at 256 px)", 2)
    taus: list[float] = swept("mulosd: the values of tau (0.5: infer.py's default)", 0.1, 0.2, 0.5)
    radii: list[int] = swept("mulosd: the values of radius (2: infer.py's default)", 2)
    windows: list[int] = swept("zipar: its windows (empty: infer.window)")
    gammas: list[int] = swept("sd, lantern: draft lengths (empty: infer.gamma)")
    lantern_ks: list[int] = swept("lantern: neighbourhood sizes (empty: infer.lantern_k)")
    sjd_windows: list[int] = swept("sjd: its windows (empty: infer.sjd_window)")
    sjd_couplings: list[str] = swept("sjd: gumbel | maximal (empty: infer.sjd_coupling)")
    pjd_windows: list[int] = swept("pjd: its windows (empty: infer.pjd_window)")
    pjd_starts: list[int] = swept("pjd: its row-start leads (empty: infer.pjd_start)")
    variants: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "MuLo-SD variants measured side by side, name -> infer overrides: +variants.zip={resample:zipar}"})
    fd: bool = knob(True, "FD-VGG against the world's renders of the same prompts")
    metrics: list[str] = field(default_factory=list, metadata={
        "help": "real metrics where their weights exist: fid, clip, hpsv2"})
    metrics_weights: dict[str, str] = field(default_factory=dict, metadata={"help": "metric -> local weights file"})
    resume: bool = knob(True, "continue RUN/cells.jsonl instead of starting over")
    shard: str = knob("1/1", "i/n: decode every n-th batch from the i-th only, so that n processes (one per core) "
                             "share one out_dir; the last to finish writes the summary")
    out_dir: str | None = knob("outputs/bench", "the run's folder (null: Hydra's run directory)")
    infer: InferConfig = field(default_factory=InferConfig, metadata={
        "help": "models, sampling and every strategy's knobs, as infer.py takes them (infer.KEY=...)"})


def register() -> None:
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def validate_bench(cfg: DictConfig) -> None:
    check_keys(cfg, BenchConfig)
    require(cfg.n_prompts >= 1, "n_prompts", f"must be >= 1, got {cfg.n_prompts}")
    for key in ("seed", "prompt_seed"):
        require(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
    require(cfg.batch_size >= 1, "batch_size", f"must be >= 1, got {cfg.batch_size}")
    one_of(cfg.mode, ("latency", "throughput"), "mode")
    require(len(cfg.throughput_batches) > 0 and all(b >= 1 for b in cfg.throughput_batches), "throughput_batches",
            f"must be batch sizes >= 1, got {list(cfg.throughput_batches)}")
    for s in cfg.strategies:
        one_of(s, tuple(n for n in STRATEGIES if n != "ar"), "strategies")  # ar is always measured
    for r in cfg.rs:
        one_of(r, RATIOS, "rs")
    for t in cfg.taus:
        require(0 <= t <= 1, "taus", f"every tau must be in [0, 1], got {t}")
    for m in cfg.metrics:
        one_of(m, ("fid", "clip", "hpsv2"), "metrics")
    require(shard_of(cfg.shard)[1] == 1 or cfg.resume, "shard",
            "a shard shares its out_dir with the others: resume=false would delete their cells")
    try:
        validate_infer(cfg.infer)
    except ConfigError as e:
        raise ConfigError("infer." + e.key, str(e).split(": ", 1)[1]) from None
    for strategy in STRATEGIES.values():  # each swept value as infer.py would take it
        for axis in strategy.sweep:
            for value in cfg[axis.values]:
                try:
                    validate_infer(with_overrides(cfg.infer, {axis.key: value}))
                except ConfigError as e:
                    raise ConfigError(axis.values, str(e).split(": ", 1)[1]) from None
    for name, overrides in cfg.variants.items():
        try:
            validate_infer(with_overrides(cfg.infer, overrides))
        except ConfigError as e:
            raise ConfigError(f"variants.{name}.{e.key}", str(e).split(": ", 1)[1]) from None


@dataclass(frozen=True)
class Point:
    """One measured setting: a strategy, the values of its sweep axes (decoding/registry.py), a MuLo-SD variant
    (a key of cfg.variants) and whether it runs compiled."""

    strategy: str
    settings: tuple[tuple[str, Any], ...] = ()  # (infer key, value) per swept axis
    variant: str | None = None
    compiled: bool = False  # infer.compile=true

    @property
    def name(self) -> str:
        values = dict(self.settings)
        parts = [self.strategy] + [axis.label.format(values[axis.key]) for axis in STRATEGIES[self.strategy].sweep
                                   if axis.key in values]
        return "_".join(parts + [self.variant] * bool(self.variant) + ["compiled"] * self.compiled)


def grid(cfg: DictConfig) -> list[Point]:
    """ar, then each strategy at every combination of its axes' values (an axis with no values is not swept);
    MuLo-SD once per variant, where a variant that sets an axis's key is measured at that value only."""
    points = [Point("ar")]
    for name in cfg.strategies:
        for v in (list(cfg.variants) or [None]) if STRATEGIES[name].variants else [None]:
            own = cfg.variants[v] if v else {}
            axes = [(a.key, [own[a.key]] if a.key in own else list(cfg[a.values])) for a in STRATEGIES[name].sweep]
            axes = [(key, values) for key, values in axes if values]
            points += [Point(name, tuple(zip([k for k, _ in axes], combo, strict=True)), v)
                       for combo in itertools.product(*(values for _, values in axes))]
    if cfg.compile:
        points += [replace(p, compiled=True) for p in points]
    return points


def point_config(cfg: DictConfig, point: Point) -> DictConfig:
    """The infer config a point decodes with: the run's, its variant's overrides, its axes' values."""
    c = copy.deepcopy(cfg.infer)
    c.seed, c.batch_size = cfg.seed, cfg.batch_size
    c = with_overrides(c, cfg.variants[point.variant]) if point.variant else c
    for key, value in point.settings:
        c[key] = value
    c.compile = c.compile or point.compiled
    return c


def changes(cfg: DictConfig, point: Point) -> dict[str, Any]:
    """What a point decodes with that differs from infer.py's defaults, key -> value: its strategy's knobs,
    sampling, models and backbone; other strategies' knobs and the keys that drive a run (seed, batch size,
    prompts, ...) are left out."""
    strategy = STRATEGIES[point.strategy]
    foreign = RUN_KEYS | (set(KNOBS) - set(command_line_knobs([strategy.config] if strategy.config else [])))
    foreign = foreign.union(*(keys for kind, keys in DRAFT_KEYS.items() if kind != strategy.drafts_with))
    default = _infer_defaults()
    ours = _flat(OmegaConf.to_container(point_config(cfg, point)))
    return {k: v for k, v in ours.items() if k not in foreign and v != default.get(k)}


@functools.cache
def _infer_defaults() -> dict[str, Any]:
    return _flat(OmegaConf.to_container(OmegaConf.structured(InferConfig)))


def common_changes(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The changes (`changes`) that every one of several points makes (a run-wide infer.KEY=...: the verifier a
    run decodes with, say), so that a table names them once instead of as each point's own; none for one point."""
    if len(each) < 2:
        return {}
    return {k: v for k, v in each[0].items() if all(k in c and c[k] == v for c in each[1:])}


def describe(change: dict[str, Any], leave_out: dict[str, Any] | None = None) -> str:
    """Changes as key=value ("" where there are none), less those in `leave_out`."""
    return " ".join(f"{k}={v}" for k, v in change.items() if k not in (leave_out or {}))


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def shard_of(shard: str) -> tuple[int, int]:
    """'i/n' -> (i - 1, n): which share of a run's batches a process decodes (the batches b with b % n == i - 1)."""
    try:
        i, n = (int(x) for x in str(shard).split("/"))
    except ValueError:
        raise ConfigError("shard", f"must be i/n (e.g. 1/2), got {shard!r}") from None
    require(1 <= i <= n, "shard", f"must be i/n with 1 <= i <= n, got {shard!r}")
    return i - 1, n


def parse_cells(path: Path) -> tuple[dict, bool]:
    """A bench run's RUN/cells.jsonl -> ({(point, start): cell}, whether its last line is cut off: a run killed
    while writing it). A later line of the same cell wins; a damaged line elsewhere is a ConfigError."""
    cells, lines = {}, path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            cell = json.loads(line)
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ConfigError("out_dir", f"{path} line {i + 1} is not a bench cell; "
                                             "delete that line, or the file with resume=false") from None
            return cells, True
        cells[(cell["point"], cell["start"])] = cell
    return cells, False
