"""Every decoding strategy's settings: one frozen dataclass per strategy, the single source of its knobs.

A dataclass's defaults are what `infer.py` ships: the infer schema's decoding keys are generated from these
fields (`command_line_knobs`), so a knob has one default, one range check (`__post_init__`) and one help text
(`metadata["help"]`), and the reference (docs/reference.md) is written from them. A field's command-line key is
its name unless `metadata["key"]` says otherwise (LANTERN's `pool_k` is `lantern_k`, SJD's `window` is
`sjd_window`: two strategies share a run's flat config); `key=None` keeps a field off the command line (the
strategy sets it). `from_config` builds a dataclass from any config by those keys; a mistake is a `ConfigError`
naming the config key.

This module imports no torch: the schemas, `infer.py --help` and a config error read it without loading torch.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from ..checks import ConfigError, one_of, require


def knob(default: Any, help: str, key: str | None | type = MISSING):
    """A dataclass field with its help text (and its command-line key where it is not the field's name)."""
    return field(default=default, metadata={"help": help} | ({} if key is MISSING else {"key": key}))


@dataclass(frozen=True)
class ZipARConfig:
    """ZipAR (ICML 2025): rows decoded in parallel, staggered by a window."""

    window: int = knob(4, "zipar: row i+1 starts once row i has this many tokens")

    def __post_init__(self):
        require(self.window >= 1, "window", f"must be >= 1, got {self.window}")


@dataclass(frozen=True)
class SDConfig:
    """Speculative decoding at one resolution with a small drafter: exact (sd) or LANTERN's relaxation."""

    gamma: int = knob(4, "sd, lantern: tokens drafted per verification")
    acceptance: str = knob("exact", "exact | lantern: set by the strategy (decoding=sd or lantern)", key=None)
    pool_k: int = knob(64, "lantern: neighbour codes pooled with the draft (64 of 1024: LANTERN's share, 1000 of "
                           "16384)", key="lantern_k")
    delta: float = knob(0.2, "lantern: the most of the pooled mass the neighbours may bring", key="lantern_delta")

    ACCEPTANCES: ClassVar = ("exact", "lantern")

    def __post_init__(self):
        require(self.gamma >= 1, "gamma", f"must be >= 1, got {self.gamma}")
        one_of(self.acceptance, self.ACCEPTANCES, "acceptance")
        require(0 <= self.delta <= 1, "delta", f"must be in [0, 1], got {self.delta}")
        require(self.pool_k >= 0, "pool_k", f"must be >= 0, got {self.pool_k}")


@dataclass(frozen=True)
class SJDConfig:
    """Speculative Jacobi decoding (ICLR 2025): the verifier drafts for itself."""

    window: int = knob(16, "sjd: positions drafted and verified per forward", key="sjd_window")
    coupling: str = knob("gumbel", "sjd: how a draft past the first rejection is redrawn from its new p: gumbel "
                                   "(with its position's own noise, so it often stays the same token) | maximal "
                                   "(kept with probability min(1, p/q), else drawn from the residual: SCD / MC-SJD, "
                                   "the most a redraw can keep)", key="sjd_coupling")

    COUPLINGS: ClassVar = ("gumbel", "maximal")

    def __post_init__(self):
        require(self.window >= 1, "window", f"must be >= 1, got {self.window}")
        one_of(self.coupling, self.COUPLINGS, "coupling")


@dataclass(frozen=True)
class PJDConfig:
    """Parallel Jacobi decoding (CVPR 2026): a Jacobi window per image row, several rows at once."""

    window: int = knob(8, "pjd: tokens each row's window predicts per forward (1: plain AR)", key="pjd_window")
    start: int = knob(8, "pjd: tokens the row above must have committed before a row starts (>= the grid's width: "
                         "one row at a time)", key="pjd_start")

    def __post_init__(self):
        require(self.window >= 1, "window", f"must be >= 1, got {self.window}")
        require(self.start >= 1, "start", f"must be >= 1, got {self.start}")


@dataclass(frozen=True)
class MuLoSDConfig:
    """MuLo-SD. The defaults are the bench's choices at r=2, each measured on a development world (docs/log.md):
    tau 0.5 with acceptance=ratio is the fastest setting whose GenEval interval against ar stays inside the quality
    target, and expanded=reverify radius=2 drafting the whole low-res grid in one round (8 rows at 128 px) beat the
    paper's expansion (expanded=resample radius=1 draft_rows=4) in speed and in GenEval on the paired 2000 prompts;
    at 256 px the whole grid (16 rows) beat two rounds of 8 in both as well."""

    tau: float = knob(0.5, "the acceptance threshold on the pooled mass (> 1 rejects every draft)")
    pool_k: int = knob(64, "codes pooled with each draft token, its nearest in the codebook (64 of 1024)")
    delta: float | None = knob(None, "a cap on the neighbours' share of the pooled mass (null: none)")
    radius: int = knob(2, "rejected positions grow by this many tokens (8-connected) before resampling")
    rejection: str = knob("local", "local: only the grown rejected positions are resampled | raster: every "
                                   "position from the first rejected one on")
    expanded: str = knob("reverify", "resample (the paper) | reverify: a position only grown into the rejected "
                                     "set keeps its draft where the draft passes the test again in its final "
                                     "context")
    resample: str = knob("zipar", "how islands are resampled: zipar (an island's rows advance together) | "
                                  "parallel (one token per island per step) | serial (one island after another)")
    resample_window: int = knob(2, "resample=zipar: (i, j) waits for (i-1, j+window-1)")
    resample_jacobi: int = knob(1, "Jacobi windows along island rows: each row also tests up to this many of "
                                   "its positions per forward with speculative sampling, its drafts from the "
                                   "verifier's last answer (1: one position per row, as without it)")
    draft_rows: int | None = knob(None, "low-res rows drafted per round; it must divide the drafter's rows (null, "
                                        "or more rows than it has: its whole grid in one round, which never calls "
                                        "D_r)")
    draft: str = knob("zipar", "serial | zipar: a block's low-res rows drafted one after another, or staggered")
    draft_window: int = knob(1, "draft=zipar: the stagger, in low-res tokens")
    draft_temperature: float | None = knob(None, "the drafter's temperature (0: its mode; null: the verifier's)")
    draft_cfg_scale: float | None = knob(None, "the drafter's guidance scale (null: its recorded one); the "
                                               "drafter only proposes, so it may be guided harder")
    relative: bool = knob(False, "acceptance=threshold: the pooled mass against the mode's pooled mass, not 1")
    acceptance: str = knob("ratio", "threshold: pooled mass >= tau (the paper) | sampled: with probability "
                                    "min(1, mass / tau) | ratio: min(1, mass / (tau q)), q the drafter's pooled "
                                    "mass of the low-res token the position was up-sampled from")

    REJECTIONS: ClassVar = ("local", "raster")
    EXPANDED: ClassVar = ("resample", "reverify")
    RESAMPLES: ClassVar = ("parallel", "serial", "zipar")
    DRAFTS: ClassVar = ("serial", "zipar")
    ACCEPTANCES: ClassVar = ("threshold", "sampled", "ratio")

    def __post_init__(self):
        require(self.tau >= 0, "tau", f"must be >= 0, got {self.tau}")  # NaN fails too; > 1 rejects every draft
        require(self.pool_k >= 0, "pool_k", f"must be >= 0, got {self.pool_k}")
        require(self.delta is None or 0 <= self.delta <= 1, "delta", f"must be in [0, 1] or null, got {self.delta}")
        require(self.radius >= 0, "radius", f"must be >= 0, got {self.radius}")
        one_of(self.rejection, self.REJECTIONS, "rejection")
        one_of(self.expanded, self.EXPANDED, "expanded")
        one_of(self.resample, self.RESAMPLES, "resample")
        one_of(self.draft, self.DRAFTS, "draft")
        one_of(self.acceptance, self.ACCEPTANCES, "acceptance")
        for key in ("resample_window", "resample_jacobi", "draft_window"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.draft_rows is None or self.draft_rows >= 1, "draft_rows", f"must be >= 1 or null, got "
                f"{self.draft_rows}")
        for key in ("draft_temperature", "draft_cfg_scale"):
            value = getattr(self, key)
            require(value is None or value >= 0, key, f"must be >= 0, got {value}")
        require(self.acceptance == "threshold" or not self.relative, "relative", "applies to acceptance=threshold only")

    def rows_per_round(self, g: int) -> int:
        """Low-res rows one round drafts on a drafter grid of g rows."""
        return g if self.draft_rows is None else min(self.draft_rows, g)


def command_line_knobs(configs) -> dict[str, tuple[type, Any, str]]:
    """The command-line keys of these dataclasses -> (type, default, help), in field order; a key two
    dataclasses share must mean the same (type and default), else this raises: one knob, one default."""
    out: dict[str, tuple[type, Any, str]] = {}
    for cls in dict.fromkeys(configs):  # in order, once each (sd and lantern share SDConfig)
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            key = f.metadata.get("key", f.name)
            if key is None:
                continue
            entry = (hints[f.name], f.default, f.metadata["help"])
            if key in out and out[key][:2] != entry[:2]:
                raise TypeError(f"knob {key!r} has two definitions: {out[key][:2]} and {entry[:2]} ({cls.__name__})")
            out[key] = entry
    return out


def from_config(cls, cfg, **fixed):
    """`cls` built from `cfg` (a mapping): each field from the key its metadata names (default: its own name),
    unless given in `fixed`; a field whose key the config lacks keeps its default. A ConfigError is re-raised
    naming the config key instead of the field."""
    keys = {f.name: f.metadata.get("key", f.name) for f in fields(cls)}
    values = {name: cfg[key] for name, key in keys.items() if name not in fixed and key is not None and key in cfg}
    try:
        return cls(**values, **fixed)
    except ConfigError as e:
        raise ConfigError(keys.get(e.key) or e.key, e.detail) from None
