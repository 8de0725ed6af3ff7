"""Where Tar's files come from: the AR-DTok de-tokenizers and TA-Tok from csuhan/TA-Tok, the VQ-16 decoder from
LlamaGen's repository, the LLM from csuhan/Tar-*. A local directory first, then the Hugging Face cache, then a
download when the hub is reachable; whatever is still missing is named in one error line."""

from __future__ import annotations

import os
from pathlib import Path

from ..llamagen.checkpoints import HF_REPO as LLAMAGEN_REPO
from ..llamagen.checkpoints import VQ_FILE, MissingCheckpoints, locate
from ..paths import TAR_DIR
from .ar_dtok import FILES
from .ta_tok import FILE as TA_TOK_FILE

TA_TOK_REPO = "csuhan/TA-Tok"
DEFAULT_DIR = TAR_DIR
SETTING = "tar.ckpt_dir or $MULOSD_TAR_DIR"

__all__ = ["DEFAULT_DIR", "MissingCheckpoints", "TA_TOK_REPO", "files", "locate_tar"]


def files(resolution: int, drafter: bool) -> list[str]:
    """The files a run needs: the verifier at `resolution`, the 256 px drafter, TA-Tok, the VQ-16 decoder."""
    if resolution not in FILES or resolution == 256:
        raise ValueError(f"Tar verifies at 512 or 1024 px, not {resolution}")
    return ([FILES[256]] if drafter else []) + [FILES[resolution], TA_TOK_FILE, VQ_FILE]


def locate_tar(names: list[str], directory: str | Path | None = None, download: bool = True,
               llm: str | None = None) -> dict[str, Path]:
    """file -> path for every name; with `llm` (a hub repository or a directory) the LLM must be at hand too.
    One MissingCheckpoints names everything missing."""
    repos = {n: LLAMAGEN_REPO if n == VQ_FILE else TA_TOK_REPO for n in names}
    try:
        found, error = locate(names, directory or DEFAULT_DIR, download, repos, SETTING), ""
    except MissingCheckpoints as e:
        found, error = {}, str(e)
    if llm is not None and not _llm_available(llm, download):
        error = (error + "; " if error else "") + (f"missing Tar's LLM {llm}: fetch it with huggingface_hub "
                                                  f"(snapshot_download) or give a directory with tar.llm=DIR")
    if error:
        raise MissingCheckpoints(error)
    return found


def _llm_available(llm: str, download: bool) -> bool:
    if Path(llm).expanduser().is_dir():
        return (Path(llm).expanduser() / "config.json").is_file()
    try:
        from huggingface_hub import snapshot_download

        local_only = not download or bool(os.environ.get("HF_HUB_OFFLINE"))
        snapshot_download(llm, local_files_only=local_only, etag_timeout=10)
        return True
    except Exception:  # not cached and offline, unreachable or unknown: named in the error
        return False
