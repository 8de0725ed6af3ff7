"""A run's models and the one way prompts become images.

    pipe = Pipeline.from_config(cfg, {cfg.decoding, "ar"})       # infer.py's config (conf/infer.yaml)
    tokens, trace = pipe.decode(cfg.decoding, cfg, captions, image_ids)   # rounds=True: per-round masks too
    images = pipe.images(tokens)                                     # uint8 [H, W, 3] each

`Pipeline.from_config` loads what the requested strategies declare they need (decoding/registry.py: the model
each drafts with, a codebook-neighbour table), once, and checks it against one tokenizer: a missing model, one
trained on another tokenizer's codes, or a drafter whose grid is not the verifier's / r is a one-line ConfigError
naming the config key, before any decoding; `sampling` resolves how the verifier samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

from .ar import ARBackbone, Warpers
from .config import ConfigError
from .decoding.registry import STRATEGIES, Strategy
from .tokenizer import tokens_to_images

log = logging.getLogger(__name__)


def _load(key: str, fn, *args, **kw):
    """Load a model; a missing or mismatched one becomes a one-line error naming the config key."""
    try:
        return fn(*args, **kw)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(key, str(e)) from None


def sampling(cfg: DictConfig, recorded: dict) -> tuple[float, str, Warpers]:
    """How the verifier samples: (guidance scale, guidance schedule, warpers), resolved here and nowhere else.
    Each of cfg_scale, cfg_schedule, temperature, top_k and top_p is the command line's where set (not null),
    else what the verifier's export records (`recorded`: its training config's `sample`; upstream's defaults for
    LlamaGen and Tar); a schedule recorded by neither is constant. MuLo-SD's drafter guides at draft_cfg_scale
    where set, else at the scale its export records for its size, else at the verifier's (`Pipeline.backbone`)."""
    def pick(key):
        return recorded.get(key) if cfg[key] is None else cfg[key]

    warpers = Warpers(*(pick(k) for k in ("temperature", "top_k", "top_p")))
    return pick("cfg_scale"), pick("cfg_schedule") or "constant", warpers


@dataclass
class Model:
    """One autoregressive model of a pipeline: the transformer, its conditioning encoder, and the guidance it samples
    with where its export records its own (None: the verifier's)."""

    net: torch.nn.Module  # ar.Transformer, or an upstream's (llamagen/, tar/) with its interface
    encoder: torch.nn.Module
    cfg_scale: float | None = None
    cfg_schedule: str | None = None


class Pipeline:
    """The components of a run, declared as a diffusers pipeline declares them: the tokenizer and the verifier always;
    the models, samplers and tables the requested strategies need (registry.Strategy: `drafts_with`, `neighbours`),
    None where none does; `conditioner`: conditioning computed once per batch before decoding (Tar's LLM and
    TA-Tok: `prepare(captions, seed, image_ids)`, and `seconds` per stage of the last batch)."""

    def __init__(self, tokenizer, verifier: Model, warpers: Warpers, *, drafter: Model | None = None,
                 up: Callable | None = None, down: Callable | None = None, small: Model | None = None,
                 neighbours: torch.Tensor | None = None, conditioner=None):
        self.tokenizer, self.verifier, self.warpers = tokenizer, verifier, warpers
        self.drafter, self.up, self.down = drafter, up, down  # MuLo-SD's low-res drafter M_q; U_r and D_r on tokens
        self.small = small  # a same-resolution drafter (sd, lantern)
        self.neighbours = neighbours  # each code's nearest codes in the codebook, nearest first
        self.conditioner = conditioner

    @property
    def grid(self) -> int:
        """The verifier's token grid side."""
        return self.verifier.net.cfg.grid

    @classmethod
    def from_config(cls, cfg: DictConfig, strategies: set[str]) -> Pipeline:
        unknown = set(strategies) - set(STRATEGIES)
        if unknown:
            raise ConfigError("decoding", f"{', '.join(sorted(unknown))} is not one of {', '.join(STRATEGIES)}")
        constructors = {"synthscenes": cls.synthscenes, "llamagen_t2i": cls.llamagen, "tar": cls.tar}
        return constructors[cfg.backbone](cfg, [STRATEGIES[s] for s in strategies])

    @classmethod
    def synthscenes(cls, cfg: DictConfig, strategies: list[Strategy]) -> Pipeline:
        """The SynthScenes zoo (or exported runs given by path in `models.*`)."""
        from .zoo import check_same_tokenizer, load_ar, load_sampler, load_tokenizer, sample_at, sampler_name

        m, r = cfg.models, cfg.r
        tokenizer = _load("models.tokenizer", load_tokenizer, m.tokenizer, device=cfg.device)
        net, encoder, meta = _load("models.verifier", load_ar, m.verifier, device=cfg.device, resolution=cfg.size)
        _load("models.verifier", check_same_tokenizer, meta, m.tokenizer, f"verifier {m.verifier!r}")
        cfg_scale, schedule, warpers = sampling(cfg, meta["sample"])
        parts = {"neighbours": _neighbours(cfg, tokenizer, strategies)}
        if _drafts(strategies):
            low = meta["resolution"] // r
            if m.drafter is None and low in (meta.get("resolutions") or []):
                # a multi-resolution verifier drafts for itself: its weights at the low grid, its own KV cache,
                # and the guidance the export records for that size, if it records one (the command line's
                # schedule is every model's)
                recorded = sample_at(meta, low)
                drafter = Model(net.at_grid(net.cfg.grid // r), encoder, recorded.get("cfg_scale"),
                                None if cfg.cfg_schedule is not None else recorded.get("cfg_schedule"))
            else:
                name = m.drafter or f"synthscenes_ar_{low}"
                dnet, dencoder, dmeta = _load("models.drafter", load_ar, name, device=cfg.device)
                _load("models.drafter", check_same_tokenizer, dmeta, m.tokenizer, f"drafter {name!r}")
                if low in (dmeta.get("resolutions") or []):  # a multi-resolution drafter, at the low grid
                    dnet = dnet.at_grid(net.cfg.grid // r)
                drafter = Model(dnet, dencoder)
            if net.cfg.grid != r * drafter.net.cfg.grid:
                raise ConfigError("r", f"verifier grid {net.cfg.grid} is not r={r} x the drafter grid "
                                       f"{drafter.net.cfg.grid}")
            # the zoo's samplers for this verifier size (U_r / D_r are trained between one pair of grids)
            up = m.up or sampler_name(r, cfg.stage, meta["resolution"])
            down = m.down or sampler_name(r, size=meta["resolution"])
            parts |= {"drafter": drafter, "up": _upsampler(cfg, tokenizer, up, tokenizer, device=cfg.device),
                      "down": _load("models.down", load_sampler, down, m.tokenizer, device=cfg.device)[0].down}
        if _drafts(strategies, "small"):
            small, small_encoder, smeta = _load("models.small", load_ar, m.small, device=cfg.device)
            _load("models.small", check_same_tokenizer, smeta, m.tokenizer, f"small drafter {m.small!r}")
            parts["small"] = Model(small, small_encoder)
        return cls(tokenizer, Model(net, encoder, cfg_scale, schedule), warpers, **parts)

    @classmethod
    def llamagen(cls, cfg: DictConfig, strategies: list[Strategy]) -> Pipeline:
        """LlamaGen-XL T2I: stage 2 (512 px) verifies, stage 1 (256 px) drafts; the samplers are given by path
        (trained with tokenizer=llamagen_vq16) and checked against the VQ-16 codebook."""
        from .llamagen import load_llamagen
        from .llamagen.checkpoints import STAGE1_FILE, STAGE2_FILE, VQ_FILE, locate

        lg, drafts = cfg.llamagen, _drafts(strategies)
        files = [VQ_FILE, STAGE2_FILE] + ([STAGE1_FILE] if drafts else [])
        _load("llamagen.ckpt_dir", locate, files, lg.ckpt_dir, lg.download)  # every missing file, first
        _require_samplers(cfg, drafts, "llamagen_t2i")
        t2i = _load("llamagen.ckpt_dir", load_llamagen, lg.ckpt_dir, drafter=drafts, t5=lg.t5,
                    download=lg.download, device=cfg.device, dtype=getattr(torch, lg.dtype))
        return cls._upstream(cfg, t2i, strategies)

    @classmethod
    def tar(cls, cfg: DictConfig, strategies: list[Strategy]) -> Pipeline:
        """Tar: AR-DTok 512 or 1024 px verifies, AR-DTok 256 px drafts, both on the TA-Tok features of the LLM's
        ids (or of saved ids, `tar.features`); the samplers are given by path, trained on LlamaGen's VQ-16."""
        from .tar.checkpoints import files, locate_tar
        from .tar.models import load_tar

        tc, drafts = cfg.tar, _drafts(strategies)
        llm = None if tc.features else tc.llm
        _load("tar.ckpt_dir", locate_tar, files(tc.resolution, drafts), tc.ckpt_dir, tc.download, llm)  # all, first
        _require_samplers(cfg, drafts, "tar")
        t2i = _load("tar.ckpt_dir", load_tar, tc.ckpt_dir, tc.resolution, drafter=drafts, scale=tc.scale, llm=llm,
                    download=tc.download, device=cfg.device, dtype=getattr(torch, tc.dtype))
        if tc.features:
            saved = _load("tar.features", _read_ids, tc.features)
            n, codes = t2i.encoder.prefix, t2i.encoder.ta_tok.codebook_size
            if saved.shape[-1] != n or saved.min() < 0 or saved.max() >= codes:
                raise ConfigError("tar.features", f"{tc.features} holds ids {tuple(saved.shape)} in "
                                  f"[{int(saved.min())}, {int(saved.max())}]; tar.scale={tc.scale} needs {n} per "
                                  f"prompt in [0, {codes})")
            t2i.encoder.saved = saved
        return cls._upstream(cfg, t2i, strategies, conditioner=t2i.encoder)

    @classmethod
    def _upstream(cls, cfg: DictConfig, t2i, strategies: list[Strategy], conditioner=None) -> Pipeline:
        """A pipeline over a released backbone pair (LlamaGen, Tar) and samplers trained on its VQ-16 codes.
        Guidance as upstream applies it: only at a scale above 1."""
        from .zoo import load_sampler

        m = cfg.models
        cfg_scale, schedule, warpers = sampling(cfg, t2i.sample)
        if warpers.temperature == 0:
            log.warning(f"temperature=0 (greedy) with {cfg.backbone}: greedy decoding is known to ruin its 512 px "
                        "images (repeated textures); its own default is temperature 1")
        parts = {"neighbours": _neighbours(cfg, t2i.tokenizer, strategies), "conditioner": conditioner}
        if _drafts(strategies):
            parts |= {"drafter": Model(t2i.drafter, t2i.encoder),
                      "up": _upsampler(cfg, t2i.tokenizer, m.up, t2i.tokenizer, device=cfg.device),
                      "down": _load("models.down", load_sampler, m.down, t2i.tokenizer, device=cfg.device)[0].down}
        verifier = Model(t2i.verifier, t2i.encoder, cfg_scale if cfg_scale > 1 else 1.0, schedule)
        return cls(t2i.tokenizer, verifier, warpers, **parts)

    def backbone(self, which: str = "verifier", *, compile: bool = False, cfg_scale: float | None = None
                 ) -> ARBackbone:
        """The ARBackbone every strategy decodes with: the verifier, the low-res `drafter` or the `small` one, guided
        at `cfg_scale` where given, else at the scale the model records, else at the verifier's. The drafter only
        proposes, so it may be guided harder than the verifier samples: `draft_cfg_scale` sets its scale."""
        model = {"verifier": self.verifier, "drafter": self.drafter, "small": self.small}[which]
        scale = next(s for s in (cfg_scale, model.cfg_scale, self.verifier.cfg_scale) if s is not None)
        return ARBackbone(model.net, model.encoder, scale, compile=compile,
                          cfg_schedule=model.cfg_schedule or self.verifier.cfg_schedule)

    def precompile(self, strategy: str, cfg: DictConfig, captions: list[str]) -> None:
        """With cfg.compile: compile every graph a decode of this batch size can meet, for the models the
        strategy runs (the bench's and compare=true's warm-up), so that no timed decode compiles."""
        if not cfg.compile:
            return
        if self.conditioner is not None:  # Tar: the batch's features, as a decode prepares them
            self.conditioner.prepare(captions, cfg.seed, torch.arange(len(captions)))
        drafter = STRATEGIES[strategy].drafts_with
        backbones = [self.backbone(compile=True)]
        if drafter:  # guided as the strategy will guide it (only the low-res drafter has a scale of its own)
            scale = cfg.get("draft_cfg_scale") if drafter == "drafter" else None
            backbones.append(self.backbone(drafter, compile=True, cfg_scale=scale))
        for bb in backbones:
            bb.precompile(captions, self.warpers, cfg.seed)

    def decode(self, strategy: str, cfg: DictConfig, captions: list[str], ids: torch.Tensor, progress=None,
               rounds: bool = False):
        """One batch of captions -> (tokens [B, G, G], Trace); image i is decoded with image id ids[i].
        `rounds`: keep each MuLo-SD round's masks and drafts in the trace (for acceptance maps)."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown decoding {strategy!r}; known: {', '.join(STRATEGIES)}")
        s = STRATEGIES[strategy]
        needs = {"drafter": (self.drafter, self.up, self.down), "small": (self.small,), None: ()}[s.drafts_with]
        missing = ("the models it drafts with" if any(part is None for part in needs) else
                   "its codebook-neighbour table" if s.neighbours and self.neighbours is None else None)
        if missing:
            raise ValueError(f"this pipeline was loaded without {missing} ({strategy}): load it with "
                             f"Pipeline.from_config(cfg, {{..., {strategy!r}}})")
        if rounds and not s.rounds:
            raise ValueError(f"{strategy} does not record rounds; "
                             f"{', '.join(n for n, x in STRATEGIES.items() if x.rounds)} do")
        if self.conditioner is not None:
            self.conditioner.prepare(captions, cfg.seed, ids)
        common = {"seed": cfg.seed, "warpers": self.warpers, "image_ids": ids, "progress": progress}
        if rounds:
            common["rounds"] = True
        tokens, trace = STRATEGIES[strategy].run(self, cfg, captions, common)
        if self.conditioner is not None:
            trace.stages |= self.conditioner.seconds
        return tokens, trace

    def images(self, tokens: torch.Tensor) -> list[np.ndarray]:
        """Token grids [B, G, G] -> uint8 RGB images [H, W, 3]."""
        return tokens_to_images(self.tokenizer, tokens)


def _drafts(strategies: list[Strategy], kind: str = "drafter") -> bool:
    """Whether one of these strategies drafts with this kind of model (registry.DRAFTERS; the low-res `drafter`
    brings U_r and D_r with it)."""
    return any(s.drafts_with == kind for s in strategies)


def _neighbours(cfg: DictConfig, tokenizer, strategies: list[Strategy]) -> torch.Tensor | None:
    """The codebook-neighbour table the strategies that pool need: as many nearest codes as the largest of their
    knobs asks for (at least 1), or None where none pools."""
    from .tokenizer.neighbours import cached_neighbour_table

    keys = {s.neighbours for s in strategies} - {None}
    if not keys:
        return None
    key = max(sorted(keys), key=lambda k: cfg[k])
    k, codes = max(cfg[key], 1), tokenizer.codebook_size
    if k >= codes:
        raise ConfigError(key, f"{k} neighbours need a codebook of more than {k} codes; this one has {codes}")
    return cached_neighbour_table(tokenizer.codebook(), k).to(cfg.device)


def _require_samplers(cfg: DictConfig, drafts: bool, backbone: str) -> None:
    """A released backbone ships no samplers: its low-res drafting needs ones trained on its VQ-16 codes, by path."""
    if drafts and cfg.upsampler == "latent" and not cfg.models.up:
        raise ConfigError("models.up", f"backbone={backbone} needs an up-sampler trained on its VQ-16 codes "
                                       "(models.up=DIR), or upsampler=pixel")
    if drafts and not cfg.models.down:
        raise ConfigError("models.down", f"backbone={backbone} needs a down-sampler trained on its VQ-16 codes "
                                         "(models.down=DIR)")


def _read_ids(path: str) -> torch.Tensor:
    """Saved TA-Tok ids: a tensor [n] (one set for every prompt) or [prompts, n], read weights-only."""
    try:
        ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"cannot read TA-Tok ids from {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(ids, torch.Tensor) or ids.dim() not in (1, 2) or ids.is_floating_point():
        raise ValueError(f"{path} must hold an integer tensor [n] or [prompts, n] of TA-Tok ids")
    return ids.long()


def _upsampler(cfg: DictConfig, tokenizer, name, check_against, device: str = "cpu") -> Callable:
    """U_r as a token -> token callable: the trained latent up-sampler, or the training-free pixel path."""
    from .zoo import load_sampler, load_sr

    if cfg.upsampler == "pixel":
        from .choices import TRAINING_FREE_SR
        from .samplers import PixelUpsampler

        sr = cfg.sr if cfg.sr in TRAINING_FREE_SR else _load("sr", load_sr, cfg.sr, cfg.r, device=device)
        return PixelUpsampler(tokenizer, cfg.r, sr).up
    return _load("models.up", load_sampler, name, check_against, device=device)[0].up
