"""Names -> ready models. Shipped SynthScenes checkpoints live in zoo/<name>/ as model.safetensors (fp16)
plus config.json (architecture, recipe, git revision, measured metrics); any exported run directory with
the same two files loads the same way."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes

from .atomic import atomic_write_bytes
from .data.synthscenes.vocab import RADIUS_RANGE
from .paths import ROOT, ZOO
from .tokenizer import VQModel

TOKENIZER = "synthscenes_vq_f8"
SAMPLER_SIZE = 128  # the verifier size (px) of zoo v2, whose samplers keep the names they first shipped under


def sampler_name(r: int, stage: str | None = None, size: int = SAMPLER_SIZE) -> str:
    """The zoo name of U_r at a loss stage (or of D_r, without one) between the grids of a `size` px verifier and
    its 1/r view: synthscenes_up2_gan at 128 px, synthscenes256_up2_gan at 256 px. The samplers are convolutional
    and would run at any grid, but each is trained at one."""
    family = "synthscenes" if size == SAMPLER_SIZE else f"synthscenes{size}"
    return f"{family}_down{r}" if stage is None else f"{family}_up{r}_{stage}"


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save(model: torch.nn.Module, kind: str, out_dir: Path, recipe: str, dtype=torch.float16, config: dict | None = None,
         **extra) -> Path:
    """Export a model whose class owns its config (`to_config()`, rebuilt by the loaders below; or `config`
    for an upstream class, whose loader reads the architecture from the weights) with its recipe and `extra`
    metadata (tokenizer, sampling defaults, metrics...)."""
    return _write(model, kind, model.to_config() if config is None else config, out_dir, recipe, dtype, **extra)


def save_ar(model: torch.nn.Module, encoder: torch.nn.Module, out_dir: Path, recipe: str, dtype=torch.float16,
            **extra) -> Path:
    """An AR transformer and its SynthScenes caption encoder, in one file (keys model.*, encoder.*)."""
    config = {"transformer": model.to_config(), "encoder": "synthscenes_slots"}
    return _write(torch.nn.ModuleDict({"model": model, "encoder": encoder}), "ar", config, out_dir, recipe, dtype,
                  **extra)


def _write(module: torch.nn.Module, kind: str, config: dict, out_dir: Path, recipe: str, dtype, **extra) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in module.state_dict().items()}
    data = save_bytes(state)
    # weights first, then the config that names their hash: a kill in between leaves a config whose hash
    # refuses the new weights (or no config at all), never a silently mismatched pair
    atomic_write_bytes(out_dir / "model.safetensors", data)
    meta = {"kind": kind, "config": config, "recipe": recipe, "git_revision": git_revision(),
            "dtype": str(dtype).removeprefix("torch."), "sha256": hashlib.sha256(data).hexdigest(), **extra}
    _write_config(out_dir, meta)
    return out_dir


def _write_config(path: Path, meta: dict) -> None:
    atomic_write_bytes(Path(path) / "config.json", (json.dumps(meta, indent=2) + "\n").encode())


def annotate(name_or_path: str | Path, **fields) -> dict:
    """Add or replace top-level fields of an export's config.json (sampling picks, the world it was trained
    on); its weights and their hash are untouched."""
    path = resolve(name_or_path)
    meta = read_config(path) | fields
    _write_config(path, meta)
    return meta


def world_radius(meta: dict) -> tuple[float, float]:
    """The SynthScenes geometry (object half-size range) a model was trained on, in which its prompts are
    rendered for FD-VGG and `decoding=reference`; exports that record none were trained on the world's default."""
    return tuple((meta.get("world") or {}).get("radius") or RADIUS_RANGE)


def resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        path = ZOO / str(name_or_path)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        known = sorted(p.name for p in ZOO.iterdir() if (p / "config.json").is_file()) if ZOO.is_dir() else []
        raise FileNotFoundError(f"no model {name_or_path!r}: expected config.json and model.safetensors in a "
                                f"directory, or a zoo name ({', '.join(known) or 'zoo/ is empty'})")
    return path


def in_zoo(name_or_path: str | Path) -> bool:
    """Whether `resolve` finds this model (a name the zoo ships, or a model directory)."""
    try:
        resolve(name_or_path)
    except FileNotFoundError:
        return False
    return True


def read_config(name_or_path) -> dict:
    return json.loads((resolve(name_or_path) / "config.json").read_text())


LLAMAGEN_VQ = "llamagen_vq16"  # LlamaGen's VQ-16 (vq_ds16_t2i.pt, see mulosd.llamagen.checkpoints)


def tokenizer_identity(name_or_path: str | Path) -> Path:
    """The file or directory whose bytes identify a tokenizer (what digests compare)."""
    if str(name_or_path) == LLAMAGEN_VQ:
        from .llamagen.checkpoints import VQ_FILE, locate

        return locate([VQ_FILE])[VQ_FILE]
    return resolve(name_or_path)


def load_tokenizer(name_or_path: str | Path = TOKENIZER, device="cpu") -> VQModel:
    if str(name_or_path) == LLAMAGEN_VQ:
        from .llamagen.models import load_vq

        return load_vq(tokenizer_identity(LLAMAGEN_VQ)).requires_grad_(False).to(device)
    path = resolve(name_or_path)
    meta = read_config(path)
    if meta["kind"] != "vq_tokenizer":
        raise ValueError(f"{path} holds a {meta['kind']}, not a vq_tokenizer")
    model = VQModel.from_config(meta["config"])
    _restore(model, _load_state(path), path)
    return model.eval().requires_grad_(False).to(device)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_digest(path: Path) -> str:
    """A tokenizer's identity, what token caches and exported models record: the SHA-256 (16 hex digits) of a
    tokenizer directory's model.safetensors or of a weights file."""
    return file_sha256(path / "model.safetensors" if path.is_dir() else path)[:16]


def _load_state(path: Path) -> dict:
    """The weights, checked against the SHA-256 recorded at export (a corrupted or swapped file is refused);
    a config without one (written by hand, or by an older export) still gets a one-line error for a file that
    is truncated or not safetensors at all."""
    file = path / "model.safetensors"
    want = read_config(path).get("sha256")
    if want is not None and file_sha256(file) != want:
        raise ValueError(f"{file} does not match the SHA-256 in its config.json: corrupted or replaced; "
                         "re-export or re-download it")
    try:
        state = load_file(file)
    except Exception as e:  # safetensors raises its own SafetensorError (not an OSError) for a torn file
        raise ValueError(f"{file} is not a readable safetensors file ({str(e).splitlines()[0][:160]}): "
                         "truncated or corrupted; re-export or re-download it") from None
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def _restore(module: torch.nn.Module, state: dict, path: Path) -> None:
    """load_state_dict with a one-line error naming the file when its tensors do not fit the config."""
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"{path / 'model.safetensors'} does not fit the architecture in its config.json "
                         f"({' '.join(str(e).split())[:200]})") from None


def load_ar(name_or_path: str | Path, device="cpu", resolution: int | None = None):
    """-> (Transformer, SceneCaptionEncoder, meta) of an exported AR model, in eval mode. The meta records
    the tokenizer it was trained on (name and weights digest), its resolution and its sampling defaults.
    A multi-resolution model is returned at `resolution` (default: its own default), and meta["resolution"]
    says which; asking a single-resolution model for another size is an error."""
    from .ar import Transformer
    from .data.synthscenes.encoder import SceneCaptionEncoder

    path = resolve(name_or_path)
    meta = read_config(path)
    if meta["kind"] != "ar":
        raise ValueError(f"{path} holds a {meta['kind']}, not an ar model")
    model = Transformer.from_config(meta["config"]["transformer"])
    encoder = SceneCaptionEncoder(model.cfg.cond_dim)
    _restore(torch.nn.ModuleDict({"model": model, "encoder": encoder}), _load_state(path), path)
    model.eval().requires_grad_(False).to(device)
    encoder.eval().requires_grad_(False).to(device)
    if resolution is not None and resolution != meta["resolution"]:
        sizes = meta.get("resolutions") or [meta["resolution"]]
        if resolution not in sizes:
            raise ValueError(f"{path} draws at {', '.join(f'{s} px' for s in sizes)}, not at {resolution} px")
        model = model.at_grid(resolution // (meta["resolution"] // model.cfg.grid))
        meta = meta | {"resolution": resolution}
    # exports from before guidance schedules guided at one constant scale
    sample = {"cfg_schedule": "constant"} | meta["sample"] | sample_at(meta, meta["resolution"])
    return model, encoder, meta | {"sample": sample}


def sample_at(meta: dict, resolution: int) -> dict:
    """The sampling defaults a multi-resolution export records for one size ({"64": {...}}), which override its
    shared `sample` there; {} where it records none."""
    return (meta.get("sample_by_resolution") or {}).get(str(resolution), {})


def check_same_tokenizer(meta: dict, tokenizer: str | Path, what: str) -> None:
    """Refuse a model trained on another tokenizer's codes, comparing weight digests."""
    want, have = meta.get("tokenizer_sha256"), tokenizer_digest(tokenizer_identity(tokenizer))
    if want != have:
        raise ValueError(f"{what} was trained on tokenizer {meta.get('tokenizer')!r} (weights {want}), "
                         f"not on {str(tokenizer)!r} (weights {have}): its token ids mean other codes")


def load_sampler(name_or_path: str | Path, tokenizer: str | Path | torch.nn.Module | None = None, device="cpu"):
    """-> (LatentUpsampler or LatentDownsampler, meta). With a tokenizer, a sampler whose codebook is not that
    tokenizer's is refused: its token ids would index other codes."""
    from .samplers import build_sampler  # not through lit/: decoding needs no Lightning, no loss stack

    path = resolve(name_or_path)
    meta = read_config(path)
    if meta["kind"] != "sampler":
        raise ValueError(f"{path} holds a {meta['kind']}, not a sampler")
    state = _load_state(path)
    if "embed.codebook" not in state:
        raise ValueError(f"{path / 'model.safetensors'} holds no embed.codebook: not a sampler's weights")
    model = build_sampler(meta["config"], state["embed.codebook"])
    _restore(model, state, path)
    if tokenizer is not None:  # a name, a directory, or a loaded tokenizer (LlamaGen's VQ-16)
        tokenizer = tokenizer if isinstance(tokenizer, torch.nn.Module) else load_tokenizer(tokenizer, device=device)
        theirs = tokenizer.codebook()
        if theirs.shape != model.codebook.shape or (theirs.to(model.codebook) - model.codebook).abs().max() > 2e-3:
            raise ValueError(f"sampler {str(name_or_path)!r} was trained on tokenizer {meta.get('tokenizer')!r}; its "
                             f"codebook {tuple(model.codebook.shape)} does not match the tokenizer's "
                             f"{tuple(theirs.shape)}")
        if hasattr(model, "use_tokenizer"):  # U_r with a base computes it with this tokenizer
            model.use_tokenizer(tokenizer)
    return model.eval().requires_grad_(False).to(device), meta


def load_sr(spec: str | Path, r: int, device="cpu"):
    """`sr=`'s learned super-resolver (samplers/sr.py LearnedSR): a weights file spandrel reads, or an SR network
    exported by `experiment=pixel_sr` (a zoo name or its directory; upstream's key layout, so spandrel detects
    it as it detects a downloaded checkpoint)."""
    from .samplers.sr import sr_from_file, sr_from_state

    if Path(spec).is_file():
        return sr_from_file(spec, r, device)
    try:
        path = resolve(spec)
    except FileNotFoundError as e:
        raise ValueError(f"sr={spec}: not bicubic, lanczos, a weights file or an SR export ({e})") from None
    meta = read_config(path)
    if meta["kind"] != "sr":
        raise ValueError(f"{path} holds a {meta['kind']}, not an SR network (sr= takes bicubic, lanczos, a weights "
                         "file or an export of experiment=pixel_sr)")
    return sr_from_state(_load_state(path), r, str(spec), device)
