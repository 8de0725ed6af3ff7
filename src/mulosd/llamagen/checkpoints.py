"""Finding, safely reading and caching LlamaGen's released checkpoints.

The files (`vq_ds16_t2i.pt`, `t2i_XL_stage1_256.pt`, `t2i_XL_stage2_512.pt` from the Hugging Face repo
peizesun/llamagen_t2i; Tar's from csuhan/TA-Tok) are looked up in a local directory first, then in the standard
Hugging Face cache, then fetched into that cache with `huggingface_hub` when the hub is reachable. A `.pt` is a
pickle: it is read with `torch.load(weights_only=True)`, which refuses any object but tensors and plain
containers, so a planted payload is never run. The converted weights are
cached once as safetensors next to the file (keyed by its size and mtime); later loads read only that.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path
from ..paths import LLAMAGEN_DIR

HF_REPO = "peizesun/llamagen_t2i"
VQ_FILE, STAGE1_FILE, STAGE2_FILE = "vq_ds16_t2i.pt", "t2i_XL_stage1_256.pt", "t2i_XL_stage2_512.pt"
DEFAULT_DIR = LLAMAGEN_DIR


class MissingCheckpoints(FileNotFoundError):
    pass


def locate(files: list[str], directory: str | Path | None = None, download: bool = True,
           repos: dict[str, str] | None = None, setting: str = "llamagen.ckpt_dir or $MULOSD_LLAMAGEN_DIR"
           ) -> dict[str, Path]:
    """file name -> local path: `directory` first, then the Hugging Face cache, then a download into that cache
    when allowed and the hub is reachable. `repos` maps a file to its hub repository (default: LlamaGen's).
    Anything still missing is one error naming every missing file, its repository and where to put it."""
    directory = Path(directory or DEFAULT_DIR).expanduser()
    repos = repos or {}
    found = {f: directory / f for f in files if (directory / f).is_file()}
    online = download and not os.environ.get("HF_HUB_OFFLINE")
    reachable = None
    for f in [f for f in files if f not in found]:
        path = _from_hub(repos.get(f, HF_REPO), f, local_only=True)
        if path is None and online:
            reachable = _hub_reachable() if reachable is None else reachable
            path = _from_hub(repos.get(f, HF_REPO), f, local_only=False) if reachable else None
        if path is not None:
            found[f] = path
    missing = [f for f in files if f not in found]
    if missing:
        where = "; ".join(f"{f} from https://huggingface.co/{repos.get(f, HF_REPO)}" for f in missing)
        raise MissingCheckpoints(f"missing checkpoint file(s) {', '.join(missing)}: download {where} into "
                                 f"{directory} (or set {setting})")
    return found


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect, so an offline machine fails in seconds, not after the hub client's retries."""
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _from_hub(repo: str, name: str, local_only: bool) -> Path | None:
    """The file from the standard Hugging Face cache (downloading it unless `local_only`), or None."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo, name, local_files_only=local_only, etag_timeout=10))
    except Exception:  # not cached, offline, unreachable, no such file: reported with the others by locate()
        return None


def read_pt(path: Path) -> dict[str, torch.Tensor]:
    """A training checkpoint's weights, read without executing anything: the `model` / `module` /
    `state_dict` entry if there is one; entries that are not tensors are dropped."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):  # upstream saves its args; inert data
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a weights-only checkpoint (refused to unpickle it): "
                         f"{str(e).splitlines()[0]}") from None
    for key in ("model", "module", "state_dict", "ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def read_spec(path: Path, keys: set[str], what: str) -> dict:
    """The `{"model": {...}}` entry of a file saved as a model spec (Tar's AR-DTok and TA-Tok files), read
    weights-only; one that lacks any of `keys` is refused as not `what` ("an AR-DTok checkpoint")."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a weights-only checkpoint (refused to unpickle it): "
                         f"{str(e).splitlines()[0]}") from None
    spec = obj.get("model") if isinstance(obj, dict) else None
    if not isinstance(spec, dict) or not keys <= set(spec):
        raise ValueError(f"{path} is not {what}: expected {{'model': {{{', '.join(sorted(keys))}}}}}")
    return spec


def cached_state(path: Path, convert=lambda state: state) -> dict[str, torch.Tensor]:
    """convert(read_pt(path)), cached as safetensors beside the file; the cache is rebuilt when the file's
    size or mtime changes."""
    st = path.stat()
    cache = path.with_name(f".{path.stem}.{st.st_size}.{st.st_mtime_ns}.safetensors")
    if cache.is_file():
        return load_file(cache)
    state = {k: v.contiguous() for k, v in convert(read_pt(path)).items()}
    with atomic_path(cache) as tmp:  # a killed conversion leaves no half cache
        save_file(state, str(tmp))
    return state
