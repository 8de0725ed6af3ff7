"""Finding, safely reading and caching LlamaGen's released checkpoints.

The files (`vq_ds16_t2i.pt`, `t2i_XL_stage1_256.pt`, `t2i_XL_stage2_512.pt` from the Hugging Face repo
peizesun/llamagen_t2i) are looked up in a local directory first, then fetched with `huggingface_hub` when the
hub is reachable. A `.pt` is a pickle: it is read with `torch.load(weights_only=True)`, which refuses any
object but tensors and plain containers, so a planted payload is never run. The converted weights are
cached once as safetensors next to the file (keyed by its size and mtime); later loads read only that.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path

HF_REPO = "peizesun/llamagen_t2i"
VQ_FILE, STAGE1_FILE, STAGE2_FILE = "vq_ds16_t2i.pt", "t2i_XL_stage1_256.pt", "t2i_XL_stage2_512.pt"
DEFAULT_DIR = Path(os.environ.get("MULOSD_LLAMAGEN_DIR", Path.home() / ".cache" / "mulosd" / "llamagen"))


class MissingCheckpoints(FileNotFoundError):
    pass


def locate(files: list[str], directory: str | Path | None = None, download: bool = True) -> dict[str, Path]:
    """file name -> local path; fetches what is missing from the hub when allowed and reachable. Anything
    still missing is one error naming every missing file and where to put it."""
    directory = Path(directory or DEFAULT_DIR).expanduser()
    found = {f: directory / f for f in files if (directory / f).is_file()}
    missing = [f for f in files if f not in found]
    if missing and download and not os.environ.get("HF_HUB_OFFLINE") and _hub_reachable():
        for f in list(missing):
            path = _download(f, directory)
            if path is not None:
                found[f] = path
                missing.remove(f)
    if missing:
        raise MissingCheckpoints(f"missing LlamaGen checkpoint file(s) {', '.join(missing)}: download them from "
                                 f"https://huggingface.co/{HF_REPO} into {directory} "
                                 f"(or set llamagen.ckpt_dir or $MULOSD_LLAMAGEN_DIR)")
    return found


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect, so an offline machine fails in seconds, not after the hub client's retries."""
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _download(name: str, directory: Path) -> Path | None:
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(HF_REPO, name, local_dir=directory, etag_timeout=10))
    except Exception:  # offline, unreachable, no such file: reported with the others by locate()
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
