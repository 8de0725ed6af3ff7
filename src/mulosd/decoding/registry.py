"""The decoding strategies, one entry each, and each entry the whole recipe: its name, its knobs (a dataclass of
knobs.py), how it decodes, what it needs (the models it drafts with, a codebook-neighbour table, per-round
records), its progress units and the knobs bench.py sweeps.

Adding a strategy is its decode function, its knob dataclass (if it has knobs) and one entry in STRATEGIES
(`register` from anywhere else): infer.py's schema, validation and --help, bench.py's grid, the pipeline's
loading, the notebook and the tests all read these declarations, never a strategy's name. It imports no torch:
each `run` imports its decoder when it is called, so that the schemas can read the registry without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .knobs import MuLoSDConfig, PJDConfig, SDConfig, SJDConfig, ZipARConfig, from_config


@dataclass(frozen=True)
class Axis:
    """A knob bench.py sweeps: the infer key it sets, the bench key listing its values (an empty list: not swept,
    the infer value) and how a value appears in the point's name."""

    key: str
    values: str
    label: str  # a format for one value, e.g. "tau{:g}"


# the models a strategy may draft with, besides the verifier: MuLo-SD's low-res drafter with its samplers U_r and
# D_r (`models.drafter`, `models.up`, `models.down`), or a small model at the verifier's resolution
# (`models.small`: only the SynthScenes zoo has one)
DRAFTERS = ("drafter", "small")


@dataclass(frozen=True)
class Strategy:
    """A decoding strategy as everything around the decoders sees it: what the pipeline loads for it, what the
    config checks allow, what infer.py saves and what bench.py sweeps follow from these fields alone."""

    name: str
    run: Callable  # (pipeline, cfg, captions, common keyword arguments) -> (tokens [B, G, G], Trace)
    units: Callable[[Any, int], int]  # progress-bar units per batch at verifier grid G (cfg: its infer config)
    config: type | None = None  # the dataclass of its own knobs (None: it has none)
    drafts_with: str | None = None  # one of DRAFTERS: the extra model it drafts with (None: the verifier alone)
    neighbours: str | None = None  # the knob setting how many nearest codes it pools (None: no neighbour table)
    rounds: bool = False  # it can record each round's masks and drafts (infer.py's acceptance maps)
    variants: bool = False  # the method bench.py studies: its named variants (cfg.variants) decode with it
    sweep: tuple[Axis, ...] = ()  # bench.py's axes, in the order its point names list them

    def __post_init__(self):
        if self.drafts_with not in (None, *DRAFTERS):
            raise ValueError(f"strategy {self.name}: drafts_with={self.drafts_with!r} is not one of {DRAFTERS}")


def run_ar(p, cfg, captions: list[str], common: dict):
    from .ar import decode_ar

    return decode_ar(p.backbone(compile=cfg.compile), captions, **common)


def run_zipar(p, cfg, captions: list[str], common: dict):
    from .zipar import decode_zipar

    return decode_zipar(p.backbone(compile=cfg.compile), captions, window=from_config(ZipARConfig, cfg).window,
                        **common)


def run_sd(p, cfg, captions: list[str], common: dict):
    return _speculative(p, cfg, captions, common, "exact")


def run_lantern(p, cfg, captions: list[str], common: dict):
    return _speculative(p, cfg, captions, common, "lantern")


def _speculative(p, cfg, captions: list[str], common: dict, acceptance: str):
    from .sd import decode_sd

    knobs = from_config(SDConfig, cfg, acceptance=acceptance)
    return decode_sd(p.backbone(compile=cfg.compile), p.backbone("small", compile=cfg.compile), captions, knobs,
                     neighbours=p.neighbours, **common)


def run_sjd(p, cfg, captions: list[str], common: dict):
    from .sjd import decode_sjd

    return decode_sjd(p.backbone(compile=cfg.compile), captions, from_config(SJDConfig, cfg), **common)


def run_pjd(p, cfg, captions: list[str], common: dict):
    from .pjd import decode_pjd

    return decode_pjd(p.backbone(compile=cfg.compile), captions, from_config(PJDConfig, cfg), **common)


def run_mulosd(p, cfg, captions: list[str], common: dict):
    from .mulosd import decode_mulosd

    knobs = from_config(MuLoSDConfig, cfg)
    drafter = p.backbone("drafter", compile=cfg.compile, cfg_scale=knobs.draft_cfg_scale)
    return decode_mulosd(p.backbone(compile=cfg.compile), drafter, p.up, p.down, captions, p.neighbours, knobs,
                         **common)


def _tokens(cfg, G: int) -> int:
    return G * G  # ar: one token a step; sd, lantern, sjd, pjd: a bound (each step commits at least one token)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ar", run_ar, units=_tokens),
    Strategy("zipar", run_zipar, units=lambda cfg, G: G + (G - 1) * cfg.window, config=ZipARConfig,
             sweep=(Axis("window", "windows", "s{}"),)),
    Strategy("sd", run_sd, units=_tokens, config=SDConfig, drafts_with="small",
             sweep=(Axis("gamma", "gammas", "g{}"),)),
    Strategy("lantern", run_lantern, units=_tokens, config=SDConfig, drafts_with="small", neighbours="lantern_k",
             sweep=(Axis("gamma", "gammas", "g{}"), Axis("lantern_k", "lantern_ks", "k{}"))),
    Strategy("sjd", run_sjd, units=_tokens, config=SJDConfig,
             sweep=(Axis("sjd_window", "sjd_windows", "w{}"), Axis("sjd_coupling", "sjd_couplings", "{}"))),
    # pjd: its windows do not see each other, a mask only the eager step has: compile=true runs it eager
    Strategy("pjd", run_pjd, units=_tokens, config=PJDConfig,
             sweep=(Axis("pjd_window", "pjd_windows", "w{}"), Axis("pjd_start", "pjd_starts", "s{}"))),
    Strategy("mulosd", run_mulosd, units=lambda cfg, G: -(-G // cfg.r // (cfg.draft_rows or G)),
             config=MuLoSDConfig, drafts_with="drafter", neighbours="pool_k", rounds=True, variants=True,
             sweep=(Axis("r", "rs", "r{}"), Axis("tau", "taus", "tau{:g}"), Axis("radius", "radii", "l{}"))),
)}
STRATEGY_NAMES = tuple(STRATEGIES)  # in the order tables list them


def register(strategy: Strategy) -> Strategy:
    """Add a strategy from outside this module (a plug-in, a test): everything that reads STRATEGIES sees it from
    then on. The command line's schema, its help text and STRATEGY_NAMES (config/infer.py) are built from STRATEGIES
    when first imported, so a strategy with knobs of its own registers before that; one whose knobs are all
    existing keys may come later (validation reads STRATEGIES itself, so it is accepted; the help does not list it)."""
    if strategy.name in STRATEGIES or strategy.name == "reference":
        raise ValueError(f"a strategy named {strategy.name!r} exists")
    STRATEGIES[strategy.name] = strategy
    return strategy
