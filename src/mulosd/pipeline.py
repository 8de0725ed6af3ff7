"""A run's models and the one way prompts become images.

    pipe = Pipeline.from_config(cfg, {"mulosd", "ar"})     # infer.py's config (conf/infer.yaml)
    tokens, trace = pipe.decode("mulosd", cfg, captions, image_ids)   # rounds=True: per-round masks too
    images = pipe.images(tokens)                              # uint8 [H, W, 3] each

`Pipeline.from_config` loads the models the requested strategies need, once, and checks them against one
tokenizer: a missing model, one trained on another tokenizer's codes, or a drafter whose grid is not the
verifier's / r is a one-line ConfigError naming the config key, before any decoding; `sampling` resolves how
the verifier samples. Which strategies exist, and how each decodes, is decoding/registry.py's STRATEGIES.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from omegaconf import DictConfig

from .ar import ARBackbone, Warpers
from .config import ConfigError
from .decoding.knobs import MuLoSDConfig, from_config
from .decoding.registry import STRATEGIES
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
    where set, else at the scale its export records for its size, else at the verifier's (`drafter_backbone`)."""
    def pick(key):
        return recorded.get(key) if cfg[key] is None else cfg[key]

    warpers = Warpers(*(pick(k) for k in ("temperature", "top_k", "top_p")))
    return pick("cfg_scale"), pick("cfg_schedule") or "constant", warpers


class Pipeline:
    """The models of a run. Every attribute is always set; the ones a strategy set does not need are None."""

    def __init__(self, tokenizer, verifier, encoder, cfg_scale: float, warpers: Warpers, *, neighbours=None,
                 drafter=None, drafter_encoder=None, up: Callable | None = None, down: Callable | None = None,
                 small=None, small_encoder=None, conditioner=None, drafter_cfg_scale: float | None = None,
                 cfg_schedule: str = "constant", drafter_cfg_schedule: str | None = None):
        self.tokenizer, self.verifier, self.encoder = tokenizer, verifier, encoder
        # conditioning computed once per batch before decoding (Tar's LLM and TA-Tok): `prepare(captions, seed,
        # image_ids)`, and `seconds` per stage of the last batch
        self.conditioner = conditioner
        self.cfg_scale, self.warpers, self.neighbours = cfg_scale, warpers, neighbours
        self.cfg_schedule = cfg_schedule  # how the guidance scale runs along the raster
        self.drafter_cfg_schedule = drafter_cfg_schedule  # the drafter's recorded schedule (None: the verifier's)
        self.drafter, self.drafter_encoder = drafter, drafter_encoder  # MuLo-SD's low-res drafter M_q
        self.drafter_cfg_scale = drafter_cfg_scale  # its recorded guidance (None: the verifier's)
        self.up, self.down = up, down  # U_r and D_r as token -> token callables
        self.small, self.small_encoder = small, small_encoder  # sd / lantern's same-resolution drafter

    @classmethod
    def from_config(cls, cfg: DictConfig, strategies: set[str]) -> Pipeline:
        unknown = set(strategies) - set(STRATEGIES)
        if unknown:
            raise ConfigError("decoding", f"{', '.join(sorted(unknown))} is not one of {', '.join(STRATEGIES)}")
        constructors = {"synthscenes": cls.synthscenes, "llamagen_t2i": cls.llamagen, "tar": cls.tar}
        return constructors[cfg.backbone](cfg, set(strategies))

    @classmethod
    def synthscenes(cls, cfg: DictConfig, strategies: set[str]) -> Pipeline:
        """The SynthScenes zoo (or exported runs given by path in `models.*`)."""
        from .tokenizer.neighbours import cached_neighbour_table
        from .zoo import check_same_tokenizer, load_ar, load_sampler, load_tokenizer, sample_at

        m, r = cfg.models, cfg.r
        tokenizer = _load("models.tokenizer", load_tokenizer, m.tokenizer, device=cfg.device)
        verifier, encoder, meta = _load("models.verifier", load_ar, m.verifier, device=cfg.device)
        _load("models.verifier", check_same_tokenizer, meta, m.tokenizer, f"verifier {m.verifier!r}")
        cfg_scale, schedule, warpers = sampling(cfg, meta["sample"])
        extra = {"cfg_schedule": schedule}
        if strategies & {"mulosd", "lantern"}:
            k = max(cfg.pool_k, cfg.lantern_k, 1)
            codes = tokenizer.codebook_size
            if k >= codes:
                raise ConfigError("pool_k" if cfg.pool_k >= cfg.lantern_k else "lantern_k",
                                  f"{k} neighbours need a codebook of more than {k} codes; this one has {codes}")
            extra["neighbours"] = cached_neighbour_table(tokenizer.codebook(), k).to(cfg.device)
        if "mulosd" in strategies:
            low = meta["resolution"] // r
            if m.drafter is None and low in (meta.get("resolutions") or []):
                # a multi-resolution verifier drafts for itself: its weights at the low grid, its own KV cache,
                # and the guidance the export records for that size, if it records one
                drafter, drafter_encoder = verifier.at_grid(verifier.cfg.grid // r), encoder
                extra["drafter_cfg_scale"] = sample_at(meta, low).get("cfg_scale")
                if cfg.cfg_schedule is None:  # the command line's schedule is every model's
                    extra["drafter_cfg_schedule"] = sample_at(meta, low).get("cfg_schedule")
            else:
                name = m.drafter or f"synthscenes_ar_{low}"
                drafter, drafter_encoder, dmeta = _load("models.drafter", load_ar, name, device=cfg.device)
                _load("models.drafter", check_same_tokenizer, dmeta, m.tokenizer, f"drafter {name!r}")
                if low in (dmeta.get("resolutions") or []):  # a multi-resolution drafter, at the low grid
                    drafter = drafter.at_grid(verifier.cfg.grid // r)
            if verifier.cfg.grid != r * drafter.cfg.grid:
                raise ConfigError("r", f"verifier grid {verifier.cfg.grid} is not r={r} x the drafter grid "
                                       f"{drafter.cfg.grid}")
            up = m.up or f"synthscenes_up{r}_{cfg.stage}"
            extra |= {"drafter": drafter, "drafter_encoder": drafter_encoder,
                      "up": _upsampler(cfg, tokenizer, up, tokenizer, device=cfg.device),
                      "down": _load("models.down", load_sampler, m.down or f"synthscenes_down{r}", m.tokenizer,
                                    device=cfg.device)[0].down}
        if strategies & {"sd", "lantern"}:
            small, small_encoder, smeta = _load("models.small", load_ar, m.small, device=cfg.device)
            _load("models.small", check_same_tokenizer, smeta, m.tokenizer, f"small drafter {m.small!r}")
            extra |= {"small": small, "small_encoder": small_encoder}
        return cls(tokenizer, verifier, encoder, cfg_scale, warpers, **extra)

    @classmethod
    def llamagen(cls, cfg: DictConfig, strategies: set[str]) -> Pipeline:
        """LlamaGen-XL T2I: stage 2 (512 px) verifies, stage 1 (256 px) drafts; the samplers are given by path
        (trained with tokenizer=llamagen_vq16) and checked against the VQ-16 codebook."""
        from .llamagen import load_llamagen
        from .llamagen.checkpoints import STAGE1_FILE, STAGE2_FILE, VQ_FILE, locate

        lg = cfg.llamagen
        files = [VQ_FILE, STAGE2_FILE] + ([STAGE1_FILE] if "mulosd" in strategies else [])
        _load("llamagen.ckpt_dir", locate, files, lg.ckpt_dir, lg.download)  # every missing file, first
        _require_samplers(cfg, strategies, "llamagen_t2i")
        t2i = _load("llamagen.ckpt_dir", load_llamagen, lg.ckpt_dir, drafter="mulosd" in strategies, t5=lg.t5,
                    download=lg.download, device=cfg.device, dtype=getattr(torch, lg.dtype))
        return cls._upstream(cfg, t2i, strategies)

    @classmethod
    def tar(cls, cfg: DictConfig, strategies: set[str]) -> Pipeline:
        """Tar: AR-DTok 512 or 1024 px verifies, AR-DTok 256 px drafts, both on the TA-Tok features of the LLM's
        ids (or of saved ids, `tar.features`); the samplers are given by path, trained on LlamaGen's VQ-16."""
        from .tar.checkpoints import files, locate_tar
        from .tar.models import load_tar

        tc, mulosd = cfg.tar, "mulosd" in strategies
        llm = None if tc.features else tc.llm
        _load("tar.ckpt_dir", locate_tar, files(tc.resolution, mulosd), tc.ckpt_dir, tc.download, llm)  # all, first
        _require_samplers(cfg, strategies, "tar")
        t2i = _load("tar.ckpt_dir", load_tar, tc.ckpt_dir, tc.resolution, drafter=mulosd, scale=tc.scale, llm=llm,
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
    def _upstream(cls, cfg: DictConfig, t2i, strategies: set[str], **extra) -> Pipeline:
        """A pipeline over a released backbone pair (LlamaGen, Tar) and samplers trained on its VQ-16 codes.
        Guidance as upstream applies it: only at a scale above 1."""
        from .tokenizer.neighbours import cached_neighbour_table
        from .zoo import load_sampler

        m = cfg.models
        cfg_scale, extra["cfg_schedule"], warpers = sampling(cfg, t2i.sample)
        if warpers.temperature == 0:
            log.warning(f"temperature=0 (greedy) with {cfg.backbone}: greedy decoding is known to ruin its 512 px "
                        "images (repeated textures); its own default is temperature 1")
        if "mulosd" in strategies:
            extra |= {"neighbours": cached_neighbour_table(t2i.tokenizer.codebook(), max(cfg.pool_k, 1)).to(cfg.device),
                      "drafter": t2i.drafter, "drafter_encoder": t2i.encoder,
                      "up": _upsampler(cfg, t2i.tokenizer, m.up, t2i.tokenizer, device=cfg.device),
                      "down": _load("models.down", load_sampler, m.down, t2i.tokenizer, device=cfg.device)[0].down}
        return cls(t2i.tokenizer, t2i.verifier, t2i.encoder, cfg_scale if cfg_scale > 1 else 1.0, warpers, **extra)

    def backbone(self, which: str = "verifier", cfg_scale: float | None = None, compile: bool = False
                 ) -> ARBackbone:
        """The ARBackbone call every strategy makes: the verifier, the low-res `drafter` or the `small` one."""
        model, encoder = {"verifier": (self.verifier, self.encoder), "drafter": (self.drafter, self.drafter_encoder),
                          "small": (self.small, self.small_encoder)}[which]
        schedule = self.drafter_cfg_schedule if which == "drafter" and self.drafter_cfg_schedule else self.cfg_schedule
        return ARBackbone(model, encoder, self.cfg_scale if cfg_scale is None else cfg_scale, compile=compile,
                          cfg_schedule=schedule)

    def drafter_backbone(self, knobs: MuLoSDConfig, compile: bool = False) -> ARBackbone:
        """MuLo-SD's low-res drafter as decoding runs it: guided at `knobs.draft_cfg_scale` where set, else at its
        recorded scale (the drafter only proposes, so it may be guided harder than the verifier samples)."""
        scale = self.drafter_cfg_scale if knobs.draft_cfg_scale is None else knobs.draft_cfg_scale
        return self.backbone("drafter", scale, compile=compile)

    def precompile(self, strategy: str, cfg: DictConfig, captions: list[str]) -> None:
        """With cfg.compile: compile every graph a decode of this batch size can meet, for the models the
        strategy runs (the bench's and compare=true's warm-up), so that no timed decode compiles."""
        if not cfg.compile:
            return
        if self.conditioner is not None:  # Tar: the batch's features, as a decode prepares them
            self.conditioner.prepare(captions, cfg.seed, torch.arange(len(captions)))
        backbones = [self.backbone(compile=True)]
        if STRATEGIES[strategy].drafts_with == "drafter":
            backbones.append(self.drafter_backbone(from_config(MuLoSDConfig, cfg), compile=True))
        elif STRATEGIES[strategy].drafts_with == "small":
            backbones.append(self.backbone("small", compile=True))
        for bb in backbones:
            bb.precompile(captions, self.warpers, cfg.seed)

    def decode(self, strategy: str, cfg: DictConfig, captions: list[str], ids: torch.Tensor, progress=None,
               rounds: bool = False):
        """One batch of captions -> (tokens [B, G, G], Trace); image i is decoded with image id ids[i].
        `rounds`: keep each MuLo-SD round's masks and drafts in the trace (for acceptance maps)."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown decoding {strategy!r}; known: {', '.join(STRATEGIES)}")
        needs = {"drafter": (self.drafter, self.up, self.down), "small": (self.small,)}.get(
            STRATEGIES[strategy].drafts_with, ())
        if any(model is None for model in needs):
            raise ValueError(f"this pipeline was loaded without the models {strategy} drafts with: load it with "
                             f"Pipeline.from_config(cfg, {{..., {strategy!r}}})")
        if self.conditioner is not None:
            self.conditioner.prepare(captions, cfg.seed, ids)
        common = {"seed": cfg.seed, "warpers": self.warpers, "image_ids": ids, "progress": progress}
        if rounds:
            if strategy != "mulosd":
                raise ValueError(f"only mulosd records rounds, not {strategy}")
            common["rounds"] = True
        tokens, trace = STRATEGIES[strategy].run(self, cfg, captions, common)
        if self.conditioner is not None:
            trace.stages |= self.conditioner.seconds
        return tokens, trace

    def images(self, tokens: torch.Tensor) -> list[np.ndarray]:
        """Token grids [B, G, G] -> uint8 RGB images [H, W, 3]."""
        return tokens_to_images(self.tokenizer, tokens)


def _require_samplers(cfg: DictConfig, strategies: set[str], backbone: str) -> None:
    """A released backbone ships no samplers: MuLo-SD needs ones trained on its VQ-16 codes, given by path."""
    if "mulosd" in strategies and cfg.upsampler == "latent" and not cfg.models.up:
        raise ConfigError("models.up", f"backbone={backbone} needs an up-sampler trained on its VQ-16 codes "
                                       "(models.up=DIR), or upsampler=pixel")
    if "mulosd" in strategies and not cfg.models.down:
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
